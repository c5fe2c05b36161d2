import UbiquitySystem

/// The index: `meta.sqlite`'s serving connection, its lock, the state a fold and a sync
/// step write with it (the synced view, the sets a fold adds to, the memos of folds and
/// pulls), and the code that writes a fold's rows: the tree's (Index+Fold), the version
/// rows and the synced view they enter (Index+Versions), where histories are shown
/// (Index+Histories). One user at a time: the store's lock holder (`SharedStore`) uses
/// the connection whenever no other thread holds the index's lock; the group commit's
/// folder takes the lock under the store's lock (`lend`, Store+BackgroundFold), lets the
/// store's lock go, writes the part with the connection (`write`), and lets the index's
/// lock go. A durability barrier's commit does the same (`writeBarrier`). The store's
/// holder that needs the connection meanwhile waits on the index's lock
/// (`SQLiteDatabase.claim`); reads around the gate go to a second, read-only connection
/// instead (`openReader`), so requests on the namespace never wait for the folder, and
/// background work waits for it with the store's lock let go (`SharedStore.withLock`).
///
/// What the folder gets: this index and the part (`Store.FoldPart`, immutable), and no
/// way to the store. What a part does to the namespace (history names placed) waits in
/// `foldOutcome` for the store's bookkeeping; what the rows need of the namespace (which
/// dropped inodes had reserves, the overlay's versions of tombstones' heads) comes with
/// the part or from the store's side (`NamespaceFacts`). The connection's callbacks
/// reach the store only off the borrower's thread: a level's end and a set's deferred
/// insert are the index's first (`attachNamespace`), and the borrower neither passes the
/// gate (it writes around it) nor waits for the connection (`SQLiteDatabase.returned`).
///
/// The store's side calls these methods once it has claimed the connection
/// (`Store.claimedIndex`): they read the index's memos before any statement of theirs
/// would wait for the folder. The methods themselves never claim.
final class Index: @unchecked Sendable {
    let connection: SQLiteDatabase
    private let lock = IndexLock()
    /// This device, as its records name it (its number in `devices`, once the open has
    /// looked it up: `ownDeviceNumber`).
    let deviceID: DeviceID
    let deviceName: String
    var ownDeviceNumber: Int64?

    // The fold's memos: written by whoever writes a fold (the folder, holding the index's
    // lock, or the store's holder folding through the gate while no one else holds it),
    // read by the code both run (Index+Fold).

    /// Set while a fold is written: what it writes goes to SQLite.
    var folding = false
    /// Histories begun since the last fold (`TreeOverlay.isFresh`) whose row in
    /// `histories` the fold under way has not written yet: `placeHistory` need not look.
    var historiesUnplaced: Set<FileID> = []
    /// A fold failed since the overlay was last folded whole: what it wrote may be in
    /// SQLite already, so folds look for each version before writing it.
    var foldFailed = false
    /// Local files' versions the fold under way deleted, replaced by newer ones.
    var replacedInFold: [VersionID] = []
    /// While the folder writes: the history paths it placed (`foldOutcome`).
    var folderPlaced: [String] = []
    /// History paths the store's side placed (a row of `history_dirs` gained a leaf) that
    /// the namespace's history names have not noted yet: `Store.historyNames` takes them
    /// at its next look (`takeHistoriesPlaced`). nil: `historiesPlacedKept` or more, so
    /// the names are to be forgotten (as `HistoryNames` forgets them past its budget: a
    /// look then asks SQLite again).
    private var historiesPlaced: [String]? = []
    /// How many paths placed the namespace's history names keep: 0 while they hold no
    /// directory (nothing to note), else their budget. Set by the namespace as it changes
    /// them. Both are touched only by the store's lock holder.
    var historiesPlacedKept = 0
    /// Version rows the store's side wrote that are not the overlay's own saves and
    /// tombstones (records made or taken in by a sync step). The folder writes only the
    /// overlay's. Touched only by the store's lock holder (`TreeOverlay.newestMarks`,
    /// `InodeCache.HeadVersion.onlySince`).
    private(set) var versionsWrittenAside: UInt64 = 0

    func noteVersionWritten(origin: Origin) {
        if !isBorrowedHere && origin != .folded { versionsWrittenAside &+= 1 }
    }

    /// Set by the lock's holder while it writes without the store's lock (`write`,
    /// `writeBarrier`): read only by that thread (`Store.assertNamespaceSide`).
    var writingAside = false
    /// What the last part written left to its bookkeeping (`Store.settleFold`).
    var foldOutcome: Store.FoldOutcome?

    // What a fold and a sync step write besides the tables, used by whoever has the
    // connection (the store reaches them through accessors that claim it first).

    /// The synced view computed from all records (`Replica`).
    let replica: Replica
    /// Paths this device's own records changed the view of, and paths where the tree may
    /// not show the view yet (`Store.recheck`, `Store.unreconciled`): a fold adds to them.
    let recheck: PendingSet<NameKey>
    let unreconciled: PendingSet<NameKey>
    /// What a pull slice (or a fold) wrote that it reads again, while it runs.
    var takingIn: TakeInMemo?
    /// Records handed to the sync engine and not marked uploaded yet.
    var uploadsInFlight: Set<VersionID> = []
    /// Whether `settings` may hold withdrawals (`keepWithdrawals`).
    var withdrawalsKept = false
    /// Whether `versions` may hold rows the synced view has not taken in (`viewed = 0`:
    /// this device's records a fold wrote), so an idle sync step asks SQLite nothing.
    var mayHaveUnviewed = false

    init(connection: SQLiteDatabase, deviceID: DeviceID, deviceName: String, replica: Replica,
         recheck: PendingSet<NameKey>, unreconciled: PendingSet<NameKey>) {
        self.connection = connection
        self.deviceID = deviceID
        self.deviceName = deviceName
        self.replica = replica
        self.recheck = recheck
        self.unreconciled = unreconciled
        connection.guarded(by: lock)
    }

    // MARK: the connection's callbacks

    /// The store's side's part when a transaction level ends, and whether an insert into
    /// `recheck` or `unreconciled` goes to the overlay (`attachNamespace`).
    private var namespaceLevelEnded: ((Int, Bool) -> Void)?
    private var namespaceDefersInsert: ((PendingKind, String) -> Bool)?

    /// Takes the connection's `levelEnded` and the deferred inserts of the index's sets
    /// (a store that serves, once its overlay is open). `levelEnded` and `defersInsert`
    /// are the store's side's parts: called only when the calling thread is not the
    /// lock's borrower (the folder, a barrier's commit), which touches the index side only.
    func attachNamespace(levelEnded: @escaping (Int, Bool) -> Void, defersInsert: @escaping (PendingKind, String) -> Bool) {
        namespaceLevelEnded = levelEnded
        namespaceDefersInsert = defersInsert
        connection.levelEnded = { [weak self] level, committed in self?.levelEnded(level, committed: committed) }
        let deferring = { [weak self] (kind: PendingKind, key: String) -> Bool in self?.defersInsert(kind, key) ?? false }
        recheck.deferInsert = deferring
        unreconciled.deferInsert = deferring
    }

    /// A transaction level ended: a rollback undoes what the synced view and a pull
    /// slice's memo remember of it. The overlay, which the store's side gives a fold
    /// rolled back, still holds a part the borrower writes, so the caches of the tree are
    /// right either way for it.
    private func levelEnded(_ level: Int, committed: Bool) {
        if !committed {
            replica.rolledBack()
            // A catch-up rolled back leaves its rows unviewed again.
            mayHaveUnviewed = true
            takingIn?.undone = true
            takingIn?.histories = [:]
        }
        if !isBorrowedHere { namespaceLevelEnded?(level, committed) }
    }

    /// Whether an insert into one of the index's sets goes to the overlay as a change
    /// (the store's side, when the overlay is on) instead of its row: never for the
    /// borrower, which writes SQLite.
    private func defersInsert(_ kind: PendingKind, _ key: String) -> Bool {
        guard !isBorrowedHere, let namespaceDefersInsert else { return false }
        return namespaceDefersInsert(kind, key)
    }

    /// A history placed at `path`: the folder's go with its part's outcome, the store's
    /// side's wait for the namespace's next look.
    func notePlaced(_ path: String) {
        if isBorrowedHere {
            folderPlaced.append(path)
        } else if historiesPlacedKept > 0 {
            historiesPlaced?.append(path)
            if (historiesPlaced?.count ?? 0) >= historiesPlacedKept { historiesPlaced = nil }
        }
    }

    /// The history paths the store's side placed since the last call (nil: too many, so
    /// the names are to be forgotten).
    func takeHistoriesPlaced() -> [String]? {
        if historiesPlaced?.isEmpty == true { return [] }
        defer { historiesPlaced = [] }
        return historiesPlaced
    }

    /// Opens the second, read-only connection that reads around the gate while another
    /// thread holds the lock.
    func openReader() throws(StoreError) {
        let reader = try SQLiteDatabase(path: connection.path, readOnly: true)
        try reader.execute("PRAGMA cache_size=-8192")
        connection.reader = reader
    }

    /// Whether another thread than the caller holds the lock.
    var isLentElsewhere: Bool { lock.isLentElsewhere }
    /// Whether the calling thread holds the lock.
    var isBorrowedHere: Bool { lock.isBorrowedHere }
    /// Whether any thread holds the lock.
    var isLent: Bool { lock.isLent }

    /// Gives the lock to the calling thread (under the store's lock), which must then
    /// `write` a part or `writeBarrier`, each of which lets it go.
    func lend() {
        markAtLoan = connection.changeMark
        lock.lend()
    }
    private var markAtLoan: SQLiteDatabase.ChangeMark?

    /// The connection's change mark for the store's side, which must not touch the
    /// connection while it is lent: then the mark at the loan. A read around the gate
    /// meanwhile sees what was committed then, or the part that is being written once it
    /// commits, which the overlay still holds until the store marks it folded: either way
    /// what a memo kept then stays true until the store has the connection back.
    var changeMark: SQLiteDatabase.ChangeMark {
        if isLentElsewhere, let markAtLoan { return markAtLoan }
        return connection.changeMark
    }

    /// Told each time the lock is let go (`SharedStore`: it wakes the holders that wait
    /// for the index with its lock let go), so no such wait depends on a hold that
    /// happens to come after.
    var letGo: (() -> Void)?

    private func giveBack() {
        lock.giveBack()
        letGo?()
    }

    /// Step 2 of a part (Store+BackgroundFold), without the store's lock, on the thread
    /// the lock was lent to: writes the part in one transaction with its mark, leaves
    /// what it found to the bookkeeping (`foldOutcome`), and lets the lock go.
    func write(_ part: Store.FoldPart) {
        precondition(isBorrowedHere, "a part is written on the thread the index was lent to")
        defer { giveBack() }
        folding = true
        historiesUnplaced = part.fresh
        folderPlaced = []
        writingAside = true
        defer {
            writingAside = false
            folding = false
            historiesUnplaced = []
            folderPlaced = []
        }
        var failure: StoreError?
        do throws(StoreError) {
            try connection.aroundGate { () throws(StoreError) in
                try connection.standalone { () throws(StoreError) in
                    try writeFolded(part.changes, fresh: part.fresh, through: part.through, facts: NamespaceFacts(reserved: part.reserved))
                    // Only with the last part: a save still in the overlay is not in SQLite,
                    // so its intent must stay to be replayed.
                    if part.isLast { try noteIntentsApplied(through: part.intentSequence) }
                }
            }
            if part.isLast { foldFailed = false }
        } catch {
            foldFailed = true
            failure = error
        }
        // The rest's rows, built here rather than under the store's lock at step 3.
        let rest = failure == nil ? part.rest.map { TreeOverlay.Rest(of: $0.changes, generation: $0.generation, from: part.end) } : nil
        foldOutcome = Store.FoldOutcome(number: part.number, error: failure, placed: folderPlaced, rest: rest)
    }

    /// A durability barrier's step 2 (`Store.markDurable`), without the store's lock, on
    /// the thread the lock was lent to: one transaction with synchronous=FULL, which
    /// fsyncs the WAL and so makes every metadata change committed so far durable (the
    /// chunks they name already are). It also marks the versions up to the mark as
    /// durable. Lets the lock go. Requests go on meanwhile, on the overlay and the second
    /// connection, as they do while the folder writes.
    func writeBarrier(_ barrier: Store.BarrierCommit) throws(StoreError) {
        precondition(isBorrowedHere, "a barrier's commit runs on the thread the index was lent to")
        writingAside = true
        defer {
            writingAside = false
            giveBack()
        }
        // Through the gate its UPDATE of `versions` would fold the overlay, which is the
        // namespace's: the versions it marks are in SQLite already (`beginBarrier`
        // folded and committed them, and the mark names none after).
        try connection.aroundGate { () throws(StoreError) in
            try connection.execute("PRAGMA synchronous=FULL")
            defer { try? connection.execute("PRAGMA synchronous=NORMAL") }
            // A transaction of its own, not a batch, its journal on disk: after a join its
            // UPDATE marks every record taken in (`SQLiteDatabase.openBatch`).
            try connection.standalone(wholeTable: true) { () throws(StoreError) in
                try connection.query("UPDATE versions SET durable = 1 WHERE durable = 0 AND row <= ?", [.int(barrier.mark.row)])
                // Always write something, so the commit (and its WAL fsync) really happens.
                try connection.execute("REPLACE INTO settings(key, value) VALUES('last_sync', strftime('%s','now'))")
            }
        }
    }
}
