import Glibc
import UbiquitySystem

/// A container's local store: a directory holding
///
///     meta.sqlite      metadata: tree, versions, histories, xattrs (SQLite, WAL)
///     kv.sqlite        the key-value store (`KeyValueTable`, under a lock of its own)
///     chunks/xx/<sha>  immutable chunk files named by their SHA-256
///     staging/         bytes written to open files since their last commit
///     intent.seg       saves acknowledged since the last metadata commit (IntentLog)
///     log/             tree changes and saves not yet folded into meta.sqlite (Store+Overlay)
///     lock             held (flock) by the one process using the store
///
/// Not thread-safe: a store that threads share (a mount) is wrapped once in a
/// `SharedStore`, whose lock is then the only way to it. Chunk I/O (`chunks`) and staging
/// files are safe to use outside that lock.
///
/// Its state has two sides with one owner each:
/// - The namespace: the overlay and the operation log, the caches of the tree, history
///   names, the next inode and version row, the intents, the local change sets
///   (`changed`, `vacated`, `orphaned`, `held`). The lock's holder owns it.
/// - The index (`Index`, under its own lock): the SQLite connection `db`, the synced
///   view `replica`, the sets a fold adds to (`recheck`, `unreconciled`), the memos of
///   folds and pulls (`Index.folding`, `historiesUnplaced`, `foldFailed`,
///   `replacedInFold`, `withdrawalsKept`, `takingIn`, `uploadsInFlight`), and the code
///   that writes a fold's rows (the tree's, versions, histories, the synced view). The
///   lock's holder uses them whenever no other thread holds the index's lock; the group
///   commit's folder holds it while it writes a part outside the store's lock
///   (Store+BackgroundFold), handed the index and the part only. The accessors here of
///   the index side, and `claimedIndex`, wait for the index's lock
///   (`SQLiteDatabase.claim`); reads around the gate meanwhile go to a read-only
///   connection.
///
/// Lock order: the store's lock, then the index's (`IndexLock`).
public final class Store: @unchecked Sendable {
    public let directory: String
    public let chunks: ChunkStore
    /// The disk space fallocate promised (`SpaceReservation`): its own lock, used by
    /// open files' contents without the store's.
    public let reservation: SpaceReservation
    /// The key-value store (`.kv/`): its own database and lock, used without the store's.
    public let keyValues: KeyValueTable
    public let deviceID: DeviceID
    public private(set) var deviceName: String
    let db: SQLiteDatabase
    /// The connection `db` under its own lock, and what a fold writes with it.
    let index: Index
    private let lockFD: Int32
    public let readOnly: Bool

    /// The working set of the tree (Store+Tree, `TreeCache`); the tree itself is in
    /// SQLite. Namespace side, as are the history names below (debug builds check that
    /// the folder never touches them); readers take it from `SharedStore.tree`.
    var tree: TreeCache {
        assertNamespaceSide()
        return workingSet
    }
    let workingSet: TreeCache
    /// The names directories show histories at, read at a first create (`HistoryNames`),
    /// with the paths the index placed since the last look noted first.
    var historyNames: HistoryNames {
        _read {
            assertNamespaceSide()
            noteHistoriesPlaced()
            yield historyNamesState
        }
        _modify {
            assertNamespaceSide()
            noteHistoriesPlaced()
            defer { tellIndexWhatNamesKeep() }
            yield &historyNamesState
        }
    }
    private var historyNamesState = HistoryNames()
    /// The histories at a directory's names with their newest versions, read at a create
    /// where one may be continued (`StoredHistories`).
    var storedHistories: StoredHistories {
        _read {
            assertNamespaceSide()
            yield storedHistoriesState
        }
        _modify {
            assertNamespaceSide()
            yield &storedHistoriesState
        }
    }
    private var storedHistoriesState = StoredHistories()

    /// Notes the history paths the index placed on the store's side (the folder's come
    /// with its part's outcome: `settleFold`). Touches no state the folder does.
    private func noteHistoriesPlaced() {
        let placed = index.takeHistoriesPlaced()
        if placed?.isEmpty == true { return }
        if let placed {
            for path in placed { historyNamesState.noteTaken(path) }
        } else {
            historyNamesState.removeAll()
        }
        tellIndexWhatNamesKeep()
    }

    /// Whether the index is to keep the paths it places for the history names, and how
    /// many (`Index.historiesPlacedKept`).
    private func tellIndexWhatNamesKeep() {
        index.historiesPlacedKept = historyNamesState.isEmpty ? 0 : historyNamesState.budget
    }
    /// The `reserves` table, read whole at the first look and kept with every write (nil:
    /// not read, or a rollback may have undone a write): a file's open reads it.
    var reserves: [InodeNumber: [Range<Int64>]]?
    /// Files that continue a history but have no version yet: the version their first
    /// commit descends from (kept in memory only; losing it in a crash only loses the link).
    var continuedParents: [InodeNumber: Int64] = [:]
    /// Directories whose inodes' head chunk lists were read at once lately
    /// (`headChunkList`).
    var chunkListsRead: Set<InodeNumber> = []
    /// Where the settling of each big moved directory goes on: the last name settled
    /// (Store+MovedTrees).
    var movedCursors: [InodeNumber: String] = [:]
    /// New inodes a reconcile holds to write as a set (Store+BulkCreate).
    var bulkCreates: BulkCreates?
    var nextInode = Store.rootInode.advanced(by: 1)
    /// Records `pendingUploads` handed to the sync engine and not marked uploaded yet:
    /// `withdrawUnsentHistory` leaves them alone. Index side (below).
    var uploadsInFlight: Set<VersionID> {
        _read { db.claim(); yield index.uploadsInFlight }
        _modify { db.claim(); yield &index.uploadsInFlight }
    }
    /// Saves not yet in a committed batch (Store+Intents), and the last sequence given.
    let intents: IntentLog
    var intentSequence: Int64 = 0
    /// Saves the open recorded again from the intent log (the last process was killed
    /// before its batch committed them).
    public private(set) var recoveredSaves: [String] = []
    /// The synced view computed from all records (see Replica). Index side (below).
    var replica: Replica {
        db.claim()
        return index.replica
    }
    /// What the sync step still has to look at, each kept in SQLite with the change that
    /// caused it (PendingSet), so no crash loses one and opening never walks the tree:
    /// - `changed`: inodes whose attributes, names, paths or xattrs changed since the sync
    ///   step last looked; it records what changed from these, so its work follows the
    ///   change, not the size of the tree.
    /// - `vacated`: paths the user removed or moved away since the last step: a directory
    ///   or symlink record missing there was deleted, not just not shown yet.
    /// - `recheck`: paths this device's own records changed the view of; the step queues
    ///   for reconcile those where the tree does not show the view.
    /// - `unreconciled`: paths where the tree may not show the view yet (`reconcile`).
    /// - `orphaned`: histories an inode left (it took another's: a rename over a file, a
    ///   move to a local-only name); the step tombstones those still shown.
    /// - `held`: file nodes that inodes recorded by the current pass hold (the pass runs
    ///   in slices; an orphaned history one of them holds is not removed).
    /// - `moved`: directories moved whose subtrees are not settled yet: the inodes below
    ///   go into `changed`, and the files' histories to their new paths, in the
    ///   background (Store+MovedTrees), not on the rename's request path.
    let changed: PendingSet<InodeNumber>
    /// `changed`'s keys in the `pending` table: inode numbers in decimal.
    static func changedKey(_ id: InodeNumber) -> String { String(id.rawValue) }
    static func changedInode(_ key: String) -> InodeNumber? { UInt64(key).map(InodeNumber.init(rawValue:)) }
    /// Checkpoints of meta.sqlite's WAL from a connection of their own (mounted stores:
    /// `SharedStore.checkpointInBackground`, without the store's lock).
    let checkpointer: WALCheckpointer
    /// What the recovery at open found (Store+Recovery); empty after a clean stop.
    public private(set) var recovery = RecoveryReport()
    let vacated: PendingSet<NameKey>
    /// Index side (below): a fold adds the paths its records change.
    var recheck: PendingSet<NameKey> {
        db.claim()
        return index.recheck
    }
    var unreconciled: PendingSet<NameKey> {
        db.claim()
        return index.unreconciled
    }
    let orphaned: PendingSet<FileID>
    let held: PendingSet<FileID>
    let moved: PendingSet<InodeNumber>
    /// Set by an upgrade from a store before format 4, which kept no change set: the
    /// first sync step looks at the whole tree once.
    var needsFullScan: Bool
    /// Whether the change sets above may differ from their table: a step rolled back and
    /// reading them again failed (`reloadSyncSetsIfStale`).
    var syncSetsStale = false
    /// Off while reconcile writes the synced view into the tree: what it writes is the
    /// view, so the next sync step would only find those inodes unchanged (a device
    /// joining a container would look at each of its files again).
    var tracksChanges = true
    /// What a pull slice (or a fold) wrote that it reads again, while `takeIn` runs (nil
    /// otherwise). Index side (below).
    var takingIn: TakeInMemo? {
        _read { db.claim(); yield index.takingIn }
        _modify { db.claim(); yield &index.takingIn }
    }
    /// Whether a pull slice takes fresh records in bulk (`Store+FreshRecords`); tests turn
    /// it off to hold the bulk path against the one-at-a-time one.
    var takesFreshRecordsInBulk = true
    /// Records taken in that way so far (tests).
    var freshRecordsTaken = 0
    /// Tree rows changed and logged but not yet in SQLite (Store+Overlay). Namespace side.
    var overlay: TreeOverlay {
        _read { assertNamespaceSide(); yield overlayState }
        _modify { assertNamespaceSide(); yield &overlayState }
    }
    private var overlayState = TreeOverlay()
    /// The operation log the overlay's changes go to (nil: a read-only store, or a log
    /// that failed: changes then go straight to SQLite until the next open).
    var treeLog: OperationLog? {
        didSet { workingSet.withLock { $0.answersAbsence = treeLog != nil } }
    }
    /// The last frame appended to `treeLog`.
    var lastLogged = LogSequence.none
    /// Folds written inside transactions still open, with their level and the last frame
    /// they cover: a rollback gives their changes back to the overlay.
    var openFolds: [(level: Int, changes: [TreeChange], through: LogSequence)] = []
    /// The last frame a committed fold covers: after a durability barrier, the log's
    /// segments up to it go.
    var foldedThrough = LogSequence.none
    /// The row the next version saved into the overlay takes (rows are given here, so a
    /// save can name its row before it is folded; SQLite's own choice for a row written
    /// directly is always past them, as the gate folds first).
    var nextVersionRow: Int64 = 1
    /// The group commit's fold written outside the lock, from its first step to its
    /// bookkeeping (Store+BackgroundFold), and the number the last one was given.
    var foldInFlight: FoldPart?
    var foldsBegun = 0
    /// What `SharedStore.foldAhead` leaves to a fold under the lock: about 10 ms of SQLite
    /// (a fold writes some 100,000 changes a second here).
    public static let foldAheadLeaves = 1_000
    /// When the overlay's first and latest changes came (`monotonicNanos`).
    var overlayTimes: (first: Int64, last: Int64) = (0, 0)
    /// When the group commit folds the overlay (`Store.groupCommit`); tests shorten it.
    public var foldPolicy = FoldPolicy()
    /// Saves withdrawn (an editor's temp file renamed over the file it saved) by the
    /// operation log's replay or by folds since the intents were last applied: their
    /// frames in the intent log are not saves to record again (the open only).
    var withdrawnAtOpen: Set<VersionID> = []
    /// Tree changes the open replayed from the operation log (status, tests).
    public private(set) var replayedTreeChanges = 0
    /// Timestamps of everything the store records; tests inject a clock.
    public var clock: @Sendable () -> Nanos = nowNanos {
        didSet { keyValues.setClock(clock) }
    }

    /// `cachedNames` unless a mount says otherwise.
    public static let defaultCachedNames = 262_144

    /// The root directory: FUSE_ROOT_ID, the number the kernel asks for first.
    public static let rootInode = InodeNumber(rawValue: 1)

    /// Opens (creating if needed) the store at `directory`, taking its lock.
    /// - Parameter deviceName: replaces the stored device name when given.
    /// - Parameter readOnly: inspect a store another process may be using (status, fsck):
    ///   no lock, no schema changes, no cleanup, no tree in memory (only the database
    ///   and chunk queries work).
    /// - Parameter cachedInodes: how many inodes to keep in memory (about 300 bytes each).
    /// - Parameter cachedNames: how many names of directories to keep in memory (about
    ///   100 bytes each).
    public init(directory: String, deviceName: String? = nil, readOnly: Bool = false,
                cachedInodes: Int = 65_536, cachedNames: Int = Store.defaultCachedNames,
                chunker: Chunker = .standard) throws(StoreError) {
        self.directory = directory
        workingSet = TreeCache(inodes: cachedInodes, names: cachedNames)
        self.readOnly = readOnly
        if readOnly {
            guard access(directory + "/meta.sqlite", R_OK) == 0 else {
                throw .io(errno: ENOENT, "\(directory) is not a ubiquity store (no meta.sqlite)")
            }
        }
        try StoreError.wrap { () throws(SystemError) in
            try makeDirectories(directory)
            try makeDirectory(directory + "/staging")
        }
        let lock = !readOnly
        if lock {
            lockFD = open(directory + "/lock", O_RDWR | O_CREAT | O_CLOEXEC, 0o644)
            if lockFD < 0 { throw .io(errno: errno, "open \(directory)/lock") }
            if flock(lockFD, LOCK_EX | LOCK_NB) != 0 {
                close(lockFD)
                throw .locked("the store \(directory) is in use by another ubiquity process (is it mounted already? see `ubiquity status`)")
            }
        } else {
            lockFD = -1
        }
        chunks = try ChunkStore(directory: directory + "/chunks", readOnly: readOnly, chunker: chunker)
        reservation = SpaceReservation(directory: directory)
        intents = IntentLog(directory: directory)
        let db = try SQLiteDatabase(path: directory + "/meta.sqlite")
        checkpointer = WALCheckpointer(path: directory + "/meta.sqlite")
        // A new store gives the pages prune frees back to the filesystem (`compact()`
        // after gc); this must come before the first table (a no-op on older stores).
        if !readOnly { try db.execute("PRAGMA auto_vacuum=INCREMENTAL") }
        try db.execute("PRAGMA journal_mode=WAL")
        try db.execute("PRAGMA synchronous=NORMAL")
        try db.execute("PRAGMA journal_size_limit=\(SQLiteDatabase.walSizeLimit)")
        try db.limitWAL()
        // 32 MiB of pages (the default is 2 MiB): the tree's B-tree pages of a big container
        // stay in memory instead of being read again for every lookup.
        try db.execute("PRAGMA cache_size=-32768")
        // Temporary data (statement journals, sorts) as SQLite keeps it by default: in
        // memory up to 64 KiB, then in a file. Keeping every savepoint journal in memory
        // (`temp_store=MEMORY`, or a spill threshold of 256 KiB) makes a catch-up slice of
        // thousands of records (one transaction) hold all its journals in RAM, and a device
        // catching up runs several times slower.
        if !readOnly { try Schema.migrate(db) }
        let get = { (key: String) throws(StoreError) -> String? in
            try db.rows("SELECT value FROM settings WHERE key = ?", [.text(key)]) { $0.text(0) }.first
        }
        let set = { (key: String, value: String) throws(StoreError) in
            try db.query("INSERT INTO settings(key, value) VALUES(?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                         [.text(key), .text(value)])
        }
        if let format = try get("format").flatMap({ Int($0) }), format > Schema.formatVersion {
            throw .unsupportedFormat("the store \(directory) has format \(format); this ubiquity understands up to \(Schema.formatVersion): upgrade ubiquity")
        }
        // Read-only opens upgrade nothing, and before format 13 every id was text.
        if readOnly, let format = try get("format").flatMap({ Int($0) }), format < 13 {
            throw .unsupportedFormat("the store \(directory) has format \(format): mount it once so that this ubiquity upgrades it to format \(Schema.formatVersion)")
        }
        if !readOnly { try set("format", String(Schema.formatVersion)) }
        if let text = try get("device_id") {
            guard let id = DeviceID(hex: text) else {
                throw .database("\(directory) has a damaged device id \(String(reflecting: String(text.prefix(40))))")
            }
            deviceID = id
        } else if readOnly {
            throw .database("\(directory) has no device id: not a ubiquity store")
        } else {
            deviceID = DeviceID.new()
            try set("device_id", deviceID.hex)
        }
        if let deviceName, !readOnly {
            self.deviceName = deviceName
            try set("device_name", deviceName)
        } else {
            self.deviceName = try get("device_name") ?? defaultDeviceName()
        }
        keyValues = try KeyValueTable(directory: directory, deviceID: deviceID, deviceName: self.deviceName, clock: nowNanos,
                                      readOnly: readOnly)
        if !readOnly { try Self.dropMovedKeyValues(db) }
        self.db = db
        let name = { (key: NameKey) in key.name }, load = !readOnly
        index = Index(connection: db, deviceID: deviceID, deviceName: self.deviceName, replica: Replica(db: db),
                      recheck: try PendingSet(.recheck, db: db, load: load, key: name, parse: NameKey.init),
                      unreconciled: try PendingSet(.unreconciled, db: db, load: load, key: name, parse: NameKey.init))
        changed = try PendingSet(.inode, db: db, load: load, key: Self.changedKey, parse: Self.changedInode)
        vacated = try PendingSet(.vacated, db: db, load: load, key: name, parse: NameKey.init)
        orphaned = try PendingSet(.orphaned, db: db, load: load, key: { $0.hex }, parse: { FileID(hex: $0) })
        held = try PendingSet(.held, db: db, load: load, key: { $0.hex }, parse: { FileID(hex: $0) })
        moved = try PendingSet(.moved, db: db, load: load, key: Self.changedKey, parse: Self.changedInode)
        needsFullScan = try get("full_scan") == "1"
        if !readOnly { index.mayHaveUnviewed = try index.hasUnviewedRecords() }
        if !readOnly {
            let number = try db.transaction { () throws(StoreError) -> Int64 in try index.deviceNumber(deviceID, name: self.deviceName) }
            index.ownDeviceNumber = number
        }
        // Read-only inspection (status, fsck) reads what it needs from the database; only
        // a store that serves a mount holds the tree and the synced view in memory.
        if !readOnly {
            replayedTreeChanges = try openTreeLog()
            try loadTree()
        }
        if lock {
            // Small chunks of saves the operation log brought back are in the intent log
            // (the crash took small.sqlite's batch): back first, or the check below
            // would roll those saves back.
            unlink(intents.path + ".tmp") // a `dropPrefix` the stop interrupted; the log is whole
            try IntentLog.convertOlderLog(directory: directory)
            let logged = try IntentLog.frames(path: intents.path)
            try restoreChunksOfLoggedSaves(logged.intents)
            recovery = try recoverUndurableVersions()
            recoveredSaves = try replayIntents(logged)
            try noteBoot()
        }
        if lock {
            clearStaging()
            // The lock file names the process holding it (for `ubiquity unmount`).
            let pid = "\(getpid())\n"
            _ = ftruncate(lockFD, 0)
            _ = pid.withCString { pwrite(lockFD, $0, strlen($0), 0) }
        }
    }

    deinit {
        do { try commitBatch() } catch { log("ubiquity: final metadata commit failed: \(error)") }
        // A fold that failed stays in the log, for the next open to replay.
        if lockFD >= 0 { close(lockFD) }
    }

    /// Debug builds: the thread the index is lent to, which owns only the index side
    /// while it writes without the lock (a fold's part, a barrier's commit), does not
    /// touch the namespace's state.
    @inline(__always) func assertNamespaceSide() {
        // The holder check first: only the index lock's holder reads `writingAside`, so
        // the store's holder never reads what the folder writes.
        assert(!(index.isBorrowedHere && index.writingAside), "the index lock's holder touched the namespace's state")
    }

    /// The index, once the connection is the caller's (`SQLiteDatabase.claim`): how the
    /// store's side calls the index's writers, which read its memos before any statement
    /// of theirs would wait for the folder.
    var claimedIndex: Index {
        db.claim()
        return index
    }

    /// A value kept in the store's settings (nil: not set).
    public func setting(_ key: String) throws(StoreError) -> String? {
        try db.rows("SELECT value FROM settings WHERE key = ?", [.text(key)]) { $0.text(0) }.first
    }

    public func setSetting(_ key: String, _ value: String) throws(StoreError) {
        try db.query("REPLACE INTO settings(key, value) VALUES(?, ?)", [.text(key), .text(value)])
    }

    public func removeSetting(_ key: String) throws(StoreError) {
        try db.query("DELETE FROM settings WHERE key = ?", [.text(key)])
    }

    /// Work counters for tests: SQLite steps, and records and paths the synced view visited.
    public var work: (database: Int, replica: Int) { (db.work, replica.work) }

    /// Turns group commit on (the mounted filesystem) — see `SQLiteDatabase.batching`.
    /// `opened` rings when a batch opens (someone must call `commitBatch` soon),
    /// `committed` at every commit (a background checkpoint has work).
    public func startBatching(opened: Doorbell? = nil, committed: Doorbell? = nil) {
        guard !readOnly else { return }
        db.batching = true
        db.batchOpened = opened
        if let committed { db.ringOnCommit(committed) }
        chunks.startBatching(opened: opened, committed: committed)
        // Reads around the gate while the group commit's folder has the index.
        do {
            try index.openReader()
        } catch {
            log("ubiquity: no second connection to \(directory)/meta.sqlite (\(error)): reads wait while the group commit folds")
        }
        // The open's replay waits in the overlay: the group commit folds it.
        if !overlay.isEmpty { opened?.ring() }
    }

    /// Commits the metadata changes made since the last call (a cheap no-op when none).
    /// The intent log keeps its saves until the next durability barrier (`markDurable`):
    /// the ones an fsync made durable through it are not durable in the database yet.
    public func commitBatch() throws(StoreError) {
        try foldTree(alone: true)
        // Chunks first: a committed version must never name a row that is not.
        try chunks.commitSmallChunks()
        try claimedIndex.noteIntentsApplied(through: intentSequence)
        try db.commitBatch()
    }

    /// Whether another connection sees every change made so far: a read-only store, or
    /// nothing in the overlay or in the batch, no directory moved and not settled, no fold
    /// or barrier writing. Runs no statement (the index lent is asked first, so the batch's
    /// check waits for nothing).
    var isCurrentForReaders: Bool {
        readOnly || (overlay.isEmpty && moved.isEmpty && !index.isLent && !db.hasOpenBatch)
    }

    /// What the group commit did (`groupCommit`).
    public enum GroupCommit {
        /// Everything is committed.
        case done
        /// The overlay waits for a burst of changes to pause (`FoldPolicy`).
        case waiting
        /// A part of the overlay was folded (or a slice of moves settled); more is to
        /// do now.
        case more
    }

    /// The group commit's step (its loop, 0.1 s after a change and every 0.1 s while
    /// something waits). A burst of tree changes (`tar -x`, `rm -rf`, a build) stays in
    /// the overlay and the operation log, where every change is already safe from a
    /// crash of the daemon, until the burst pauses or grows old or big (`FoldPolicy`):
    /// folding while it runs would take the CPU from the requests. Then the overlay is
    /// folded a part at a time. The batch's own rows are committed at every step.
    /// - Parameter lastRequest: when the last request came (`monotonicNanos`; reads too):
    ///   a pause is a pause of requests, as a part's write takes CPU time from them.
    /// A mount runs its three steps with the lock let go while the part is written
    /// (`SharedStore.groupCommit`); this runs them in one go.
    public func groupCommit(lastRequest: Int64 = 0) throws(StoreError) -> GroupCommit {
        switch try beginFold(lastRequest: lastRequest) {
        case .ended(let result): return result
        case .fold(let part):
            part.write()
            return try finishFold(part)
        }
    }

    /// Whether tree changes are coming in a burst (a sync step would fold them all at
    /// once, under the store's lock): the sync engine's loop waits while they come, but
    /// not for a pause of reads (a change from a peer must come in while the reader
    /// polls). The loop asks only while `syncMayWait`.
    public func treeChangesSettling(now: Int64 = monotonicNanos()) -> Bool {
        !overlay.isEmpty && now - overlayTimes.last < foldPolicy.quiet
    }

    /// Whether the sync engine's loop may still put a cycle off for requests (a burst of
    /// tree changes, requests waiting for a slice of the step) since the last cycle that ran
    /// whole (`since`): twice the group commit's longest wait, so a stream of bursts does
    /// not keep sync out.
    public func syncMayWait(since lastCycle: Int64, now: Int64 = monotonicNanos()) -> Bool {
        now - lastCycle < 2 * foldPolicy.age
    }

    /// Commits what the batch holds, but not the overlay: small chunks first (a committed
    /// version never names a row that is not); the intents are not noted (a save in the
    /// overlay is not in SQLite yet).
    func commitBatchWithoutFold() throws(StoreError) {
        try chunks.commitSmallChunks()
        try db.commitBatch()
    }

    /// `SyncLedger.commitSettings`.
    public func commitSettings() throws(StoreError) { try commitBatchWithoutFold() }

    /// A big step (records taken in, a sync step) as a transaction of its own after the
    /// batch, its inner transactions without savepoints (`SQLiteDatabase.standalone`);
    /// small chunks it put are committed before it.
    func standaloneStep<T>(_ body: () throws(StoreError) -> T) throws(StoreError) -> T {
        try commitBatch()
        return try db.standalone { () throws(StoreError) -> T in
            let result = try body()
            try chunks.commitSmallChunks()
            return result
        }
    }

    /// Staging holds only uncommitted bytes of open files; after a restart nothing is open.
    private func clearStaging() {
        for name in (try? directoryEntries(stagingDirectory)) ?? [] { unlink(stagingDirectory + "/" + name) }
    }

    public var stagingDirectory: String { directory + "/staging" }

    /// The content of a file as of its current version, ready for reads and writes.
    /// - Parameter view: turns the stored chunks into what readers see (TinyPix grids).
    public func openContent(_ id: InodeNumber, view: (ChunkList) throws(StoreError) -> ChunkList = { $0 }) throws(StoreError) -> FileContent {
        let node = try node(id)
        let inode = node?.inode
        let stored = try inode?.head.map { (row) throws(StoreError) in try headChunkList(id, row: row, parent: node?.link?.parent) } ?? ChunkList()
        // A local-only file's bytes never leave the device, not even early.
        let syncs = path(of: id).map { !LocalOnly.contains($0) } ?? false
        return FileContent(base: try view(stored), chunks: chunks, stagingDirectory: stagingDirectory,
                           reserved: inode == nil ? [] : try reservedRanges(id), announce: syncs,
                           remoteBase: (inode?.absent ?? 0) > 0, reservation: reservation.account(for: id))
    }

    /// Durability barrier, part 1: the chunks written so far reach the disk. Thread-safe:
    /// callers run it without the store's lock, then `markDurable()`.
    public func syncFiles() throws(StoreError) {
        try chunks.sync()
    }

    /// Moves the WAL into the database and cuts it to nothing (unmount: the daemon exits
    /// without closing SQLite, which would otherwise leave the WAL at its largest).
    public func checkpoint() throws(StoreError) {
        try commitBatch()
        try db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    }

    /// Whether a version was written since the last durability barrier (an indexed probe).
    public func hasUndurableVersions() throws(StoreError) -> Bool {
        try !db.rows("SELECT 1 FROM versions WHERE durable = 0 LIMIT 1", []) { _ in true }.isEmpty
    }

    /// Durability barrier, part 0 (under the store's lock, before the chunks are
    /// flushed): the last version row written so far. A version's chunks are written
    /// before its row, so a flush that starts after this covers every version up to it,
    /// and only those may be marked durable after it (a save recorded during the flush
    /// waits for the next barrier).
    public func durabilityMark() throws(StoreError) -> DurabilityMark {
        let row = try db.rows("SELECT max(row) FROM versions WHERE durable = 0", []) { $0.isNull(0) ? 0 : $0.int(0) }.first ?? 0
        return DurabilityMark(row: row, intentBytes: intents.size)
    }

    /// Durability barrier, part 2, in one go (a store no other thread uses; a mount runs
    /// its three steps through `SharedStore.markDurable`, the disk flush without the lock).
    public func markDurable(upTo given: DurabilityMark? = nil) throws(StoreError) {
        let barrier = try beginBarrier(upTo: given)
        try index.writeBarrier(barrier)
        finishBarrier(barrier)
    }

    /// A durability barrier's commit on its way to the disk (`markDurable`'s steps).
    public struct BarrierCommit: Sendable {
        let mark: DurabilityMark
        /// The last frame folded into the index when the barrier began: its commit makes
        /// the operation log's segments up to there unneeded.
        let foldedThrough: LogSequence
    }

    /// Part 2, step 1 (under the lock): everything into the index and committed, then the
    /// index lent to the calling thread, which must call `Index.writeBarrier` next.
    /// Without a mark: everything written so far (the caller flushed every chunk).
    public func beginBarrier(upTo given: DurabilityMark?) throws(StoreError) -> BarrierCommit {
        let mark = given ?? DurabilityMark(row: .max, intentBytes: intents.size)
        try commitBatch()
        let barrier = BarrierCommit(mark: mark, foldedThrough: foldedThrough)
        db.claim() // a part another thread writes, ended
        index.lend()
        return barrier
    }

    /// Step 3 (under the lock, after `writeBarrier` succeeded): the logs let go of what
    /// the barrier made durable.
    public func finishBarrier(_ barrier: BarrierCommit) {
        // The saves logged before the mark are durable now, with their chunks (written
        // before the mark); those logged during the flush stay in the log.
        // The barrier itself succeeded: a log that could not be cut stays whole (replay
        // skips what the database has), and fsync must not report a failure it did not have.
        do { try intents.dropPrefix(barrier.mark.intentBytes) } catch { log("ubiquity: cutting the intent log after a barrier failed (it stays as it is): \(error)") }
        // Folded tree changes are durable in the index now: their segments go.
        treeLog?.dropFolded(through: barrier.foldedThrough)
    }
}

/// Where a durability barrier starts (`Store.durabilityMark`): what its flush covers.
public struct DurabilityMark: Sendable {
    /// The last version row written before the flush (0: none waits).
    public let row: Int64
    /// The intent log's size then: its frames up to here are durable after the barrier.
    let intentBytes: Int64
}

struct EntryRef: Equatable {
    var parent: InodeNumber
    var name: String

    static func == (a: EntryRef, b: EntryRef) -> Bool { a.parent == b.parent && NameKey(a.name) == NameKey(b.name) }
}

/// A name as a dictionary key, compared byte for byte. Swift's `String ==` treats
/// canonically equivalent strings (NFC `é` and NFD `e` + U+0301) as equal, but on Linux they
/// are two different names that may both exist (t-differential.py checks it).
struct NameKey: Hashable {
    let name: String
    init(_ name: String) { self.name = name }
    static func == (a: NameKey, b: NameKey) -> Bool {
        // One memcmp: the generic `utf8.elementsEqual` stepped through the two views a
        // byte at a time, at every probe of the overlay's and the working set's tables.
        var a = a.name, b = b.name
        return a.withUTF8 { x in
            b.withUTF8 { y in x.count == y.count && (x.isEmpty || memcmp(x.baseAddress!, y.baseAddress!, x.count) == 0) }
        }
    }
    func hash(into hasher: inout Hasher) {
        var bytes = name
        bytes.withUTF8 { hasher.combine(bytes: UnsafeRawBufferPointer($0)) }
    }
}

/// When the group commit folds the overlay (`Store.groupCommit`): once a burst of tree
/// changes has paused for `quiet` nanoseconds, or its first change is `age` old, or it
/// holds `changes` changes (which bounds its memory and the replay after a crash); a part
/// per hold of the store's lock.
public struct FoldPolicy: Sendable {
    public var quiet: Int64 = 300_000_000
    public var age: Int64 = 5_000_000_000
    public var changes = 50_000
    /// Changes in a part: at least this many, and at least an eighth of what waits, so a
    /// big overlay is folded in a few parts (`TreeOverlay.markFolded`).
    public var part = 4_096

    public init() {}

    func due(changes count: Int, times: (first: Int64, last: Int64), now: Int64) -> Bool {
        count >= changes || now - times.last >= quiet || now - times.first >= age
    }

    func part(of count: Int) -> Int { max(part, count / 8) }
}

/// CLOCK_MONOTONIC in nanoseconds.
public func monotonicNanos() -> Int64 {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return Int64(ts.tv_sec) * 1_000_000_000 + Int64(ts.tv_nsec)
}

func defaultDeviceName() -> String {
    var buffer = [UInt8](repeating: 0, count: 256)
    gethostname(&buffer, 255)
    let name = String(decoding: buffer.prefix { $0 != 0 }, as: UTF8.self)
    return name.isEmpty ? "device" : name
}

/// The current time in nanoseconds since the epoch.
public func nowNanos() -> Nanos {
    var ts = timespec()
    clock_gettime(CLOCK_REALTIME, &ts)
    return Nanos(ts.tv_sec) * 1_000_000_000 + Nanos(ts.tv_nsec)
}
