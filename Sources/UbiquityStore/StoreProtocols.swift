/// What the filesystem (UbiquityFS) may do to the store, by what each part touches: the
/// seams along which `Store` splits (ARCHITECTURE.md "The Store split"). The filesystem
/// is handed the store as `any FileSystemStore` under the store's lock
/// (`SharedStore.withNamespaceLock`, through `MetaLock`) and never as `Store`, so what it
/// reaches is listed here. Every part is guarded by the store's lock (`SharedStore`,
/// `LockRank.store`) until a later step gives it a lock of its own; the tree's working
/// set, which lookups read without that lock, is `SharedStore.tree`.

/// The live tree: inodes, names, extended attributes, the space set aside for a file,
/// and which files' contents are here (files on demand, the cache's bookkeeping). All it
/// changes goes through the overlay and the operation log (Store+Tree, Store+Overlay).
/// Guarded by the store's lock; writes there also take the working set's (`TreeCache`)
/// for the moment of each change.
public protocol FSNamespace: AnyObject {
    func inode(_ id: InodeNumber) -> Inode?
    func lookUp(_ parent: InodeNumber, _ name: String) throws(StoreError) -> Inode?
    func lookUp(_ id: InodeNumber) throws(StoreError) -> Inode?
    func child(_ parent: InodeNumber, _ name: String) -> InodeNumber?
    func entries(_ parent: InodeNumber) -> [(name: String, id: InodeNumber)]
    func entriesWithInodes(_ parent: InodeNumber) -> [(name: String, inode: Inode, primaryName: String?)]
    func isEmptyDirectory(_ id: InodeNumber) -> Bool
    func parentOfDirectory(_ id: InodeNumber) -> InodeNumber?
    func path(of id: InodeNumber) -> String?
    func name(of id: InodeNumber) -> String?
    func locate(_ path: String) -> (InodeNumber, String, InodeNumber)?
    /// Whether the tree's changes go to the operation log (false once a full disk gave it up).
    var writesAhead: Bool { get }

    func create(parent: InodeNumber, name: String, kind: NodeKind, mode: UInt32, uid: UInt32, gid: UInt32,
                rdev: UInt64, target: String?, fileID: FileID?, touchingParent: Bool,
                prepare: (inout Inode) -> Void) throws(StoreError) -> Inode
    func link(_ id: InodeNumber, parent: InodeNumber, name: String) throws(StoreError)
    @discardableResult
    func removeEntry(parent: InodeNumber, name: String, id known: InodeNumber?) throws(StoreError) -> Inode?
    func moveEntry(from parent: InodeNumber, _ name: String, to newParent: InodeNumber, _ newName: String) throws(StoreError)
    func exchangeEntries(_ parentA: InodeNumber, _ nameA: String, _ parentB: InodeNumber, _ nameB: String) throws(StoreError)
    func update(_ inode: Inode) throws(StoreError)
    func forget(_ id: InodeNumber) throws(StoreError)

    func xattr(_ id: InodeNumber, _ name: String) throws(StoreError) -> [UInt8]?
    func xattrNames(_ id: InodeNumber) throws(StoreError) -> [String]
    func setXattr(_ id: InodeNumber, _ name: String, _ value: [UInt8]) throws(StoreError)
    func removeXattr(_ id: InodeNumber, _ name: String) throws(StoreError) -> Bool
    func setReservedRanges(_ id: InodeNumber, _ ranges: [Range<Int64>]) throws(StoreError)

    func openContent(_ id: InodeNumber, view: (ChunkList) throws(StoreError) -> ChunkList) throws(StoreError) -> FileContent
    func setKeep(_ id: InodeNumber, _ keep: KeepPolicy) throws(StoreError)
    func refreshAbsent(_ id: InodeNumber) throws(StoreError) -> (absent: Int64, stateChanged: Bool)
    func missingChunks(of id: InodeNumber) throws(StoreError) -> [ChunkWant]
    func contentTotals() -> ContentTotals?
    func noteUses(_ uses: some Collection<(key: InodeNumber, value: Nanos)>) throws(StoreError)
    func pinnedFiles() throws(StoreError) -> [InodeNumber]
    func evictionCandidates(after: (used: Nanos, ino: InodeNumber), limit: Int) throws(StoreError) -> [(used: Nanos, ino: InodeNumber)]
}

extension FSNamespace {
    /// `create` of a node a request makes: a new history for a file, the parent's times touched.
    public func create(parent: InodeNumber, name: String, kind: NodeKind, mode: UInt32, uid: UInt32, gid: UInt32,
                       rdev: UInt64, target: String?) throws(StoreError) -> Inode {
        try create(parent: parent, name: name, kind: kind, mode: mode, uid: uid, gid: gid, rdev: rdev, target: target,
                   fileID: nil, touchingParent: true, prepare: { _ in })
    }

    /// The content as stored (no view).
    public func openContent(_ id: InodeNumber) throws(StoreError) -> FileContent {
        try openContent(id, view: { $0 })
    }
}

/// A history a new file continues (`FSVersions.deadHistory`): its id, and the version the
/// file's first save descends from: its row, and its id when it was read from SQLite (a
/// version the overlay holds is read from there).
public struct DeadHistory: Sendable {
    public let fileID: FileID
    public let head: Int64?
    let headID: VersionID?
}

/// What `.versions/` reads: versions, their chunk lists and where histories are shown.
/// The versions' reader (`VersionLog`) answers without the store's lock, from what the
/// index has committed; the store answers under its lock, through the gate.
public protocol VersionReads: AnyObject {
    func versions(of fileID: FileID, committed range: ClosedRange<Nanos>) throws(StoreError) -> [Version]
    func chunkList(row: Int64) throws(StoreError) -> ChunkList
    func histories(at path: String) throws(StoreError) -> [FileID]
    func historyChild(of path: String, name: String) throws(StoreError) -> Bool?
    func historyChildren(of path: String) throws(StoreError) -> [(name: String, isHistory: Bool)]
}

extension VersionReads {
    /// All of a file's versions.
    public func versions(of fileID: FileID) throws(StoreError) -> [Version] {
        try versions(of: fileID, committed: .min ... .max)
    }
}

extension VersionLog: VersionReads {}

/// Files' versions and histories: saves and tombstones, where each history is shown
/// (`.versions/`), and prune and gc's walks over the version rows. A save also writes the
/// tree (the inode's head) in the same frame, which is why this is not yet apart from
/// `FSNamespace`. Guarded by the store's lock.
public protocol FSVersions: VersionReads {
    @discardableResult
    func commit(_ id: InodeNumber, content: ChunkList, path: String, local: Bool, versionID: VersionID?,
                written: Nanos?) throws(StoreError) -> Version
    func commitTombstone(fileID: FileID, head: Int64?, path: String, of inode: InodeNumber?) throws(StoreError)
    func adoptHistory(_ id: InodeNumber, fileID: FileID, head: Int64?, knownFrom other: InodeNumber?) throws(StoreError)
    func continueHistory(_ id: InodeNumber, _ dead: DeadHistory) throws(StoreError)
    func setHistory(_ fileID: FileID, path: String, live: Bool) throws(StoreError)
    func retireHistory(_ fileID: FileID) throws(StoreError)
    func endHistoryRenamedOver(_ fileID: FileID, of inode: InodeNumber?) throws(StoreError)
    /// The chunk list of inode `id`'s head version `row`: the overlay's, the working set's
    /// copy, else SQLite's.
    func headChunkList(_ id: InodeNumber, row: Int64) throws(StoreError) -> ChunkList
    /// Whether directories moved wait to be settled (Store+MovedTrees), and settling them.
    var hasUnsettledMoves: Bool { get }
    func settleAllMoves() throws(StoreError)
    func deadHistory(at path: String) throws(StoreError) -> DeadHistory?
    /// An intent frame for the file's unsaved writes, and the fd to fsync (fsync(2) of one file).
    func logDurably(_ id: InodeNumber) throws(StoreError) -> Int32?

    func version(row: Int64) throws(StoreError) -> Version?
    func isUploaded(row: Int64) throws(StoreError) -> Bool

    func prune(policy: RetentionPolicy, now: Nanos, under: String, after: FileID?, limit: Int,
               dryRun: Bool) throws(StoreError) -> Store.PruneResult
    func pruneOldest(limit: Int, bytes: Int64, after: Int64) throws(StoreError) -> (versions: [Store.PrunedVersion], resumeAfter: Int64?)
}

extension FSVersions {
    /// A save of this device's (a new version id).
    @discardableResult
    public func commit(_ id: InodeNumber, content: ChunkList, path: String, local: Bool,
                       written: Nanos? = nil) throws(StoreError) -> Version {
        try commit(id, content: content, path: path, local: local, versionID: nil, written: written)
    }

    /// `adoptHistory` of a head no other inode is known to have.
    public func adoptHistory(_ id: InodeNumber, fileID: FileID, head: Int64?) throws(StoreError) {
        try adoptHistory(id, fileID: fileID, head: head, knownFrom: nil)
    }

    /// `endHistoryRenamedOver` of a history whose file is not known.
    public func endHistoryRenamedOver(_ fileID: FileID) throws(StoreError) {
        try endHistoryRenamedOver(fileID, of: nil)
    }

    /// A tombstone of a file whose inode is not known.
    public func commitTombstone(fileID: FileID, head: Int64?, path: String) throws(StoreError) {
        try commitTombstone(fileID: fileID, head: head, path: path, of: nil)
    }

    /// One slice of prune (`Store.pruneSlice` histories).
    public func prune(policy: RetentionPolicy, now: Nanos, under: String, after: FileID?,
                      dryRun: Bool) throws(StoreError) -> Store.PruneResult {
        try prune(policy: policy, now: now, under: under, after: after, limit: Store.pruneSlice, dryRun: dryRun)
    }
}

/// The synced view and the backing store as the filesystem shows them: conflicts
/// (`.conflicts/`, taking or discarding one), what waits for upload, where chunks are in
/// the backing store (an eviction asks), and one path's sync state for watchers. Guarded
/// by the store's lock.
public protocol FSConflicts: AnyObject {
    func conflicts(at path: String) throws(StoreError) -> [Version]
    func conflictCount(at path: String) throws(StoreError) -> Int
    func conflictedPaths() throws(StoreError) -> [String]
    func totalConflicts() throws(StoreError) -> Int
    func takeConflict(_ id: VersionID, path: String) throws(StoreError)
    func discardConflict(_ id: VersionID) throws(StoreError)
    var pendingUploadCount: Int { get }
    func queryItem(at path: String) throws(StoreError) -> QueryItem?
    func chunkPlaces(_ ids: some Sequence<ChunkID>) throws(StoreError) -> [ChunkID: ChunkPlace]
}

/// The index as a whole: the group-commit batch, checkpoints, compaction, settings, and
/// the constants requests need (clock, chunks, staging). What holds the lock for long
/// (a fold, a barrier's flush) is `SharedStore`'s, outside the lock; this is what runs
/// under it. Guarded by the store's lock (the constants need none).
public protocol FSMaintenance: AnyObject {
    func commitBatch() throws(StoreError)
    func checkpoint() throws(StoreError)
    func compactDatabaseStep() throws(StoreError) -> Bool
    func hasMuchFreeSpace() throws(StoreError) -> Bool
    func setting(_ key: String) throws(StoreError) -> String?
    func setSetting(_ key: String, _ value: String) throws(StoreError)
    var clock: @Sendable () -> Nanos { get }
    var chunks: ChunkStore { get }
    var stagingDirectory: String { get }
    /// The key-value store, under its own lock (`SharedStore.keyValues`).
    var keyValues: KeyValueTable { get }
}

/// All the filesystem may do to the store under its lock: what `MetaLock` hands a request.
/// One protocol (not a composition) so the existential is a reference and one witness
/// table: a request passes it to its helpers and calls through it many times.
public protocol FileSystemStore: FSNamespace, FSVersions, FSConflicts, FSMaintenance {}

extension Store: FileSystemStore {}
