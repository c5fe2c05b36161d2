/// What sync (the sync engine and the downloader) does to the store, and
/// all it may: the shared store hands it this, not the `Store` (`SharedStore.withLedger`,
/// `SharedStore.change`), so sync reaches the tree only through the synced view's steps
/// (take in, reconcile, record local changes) and never through a request's operations
/// (create, rename, commit), whose rules are the filesystem's. The parts below are what
/// each sync component uses; one that needs only some of them takes only those (the
/// downloader: `OnDemand`). Every part is guarded by the store's lock (`SharedStore`)
/// until a later step of the split (ARCHITECTURE.md "The Store split") gives the synced
/// view a lock of its own. The device's identity, the store's directory and the chunks
/// are `SharedStore`'s constants, read without the lock; the key-value store
/// (`SharedStore.keyValues`) has a lock of its own.
public typealias SyncLedger = LocalRecords & PeerRecords & ChunkPlaceLedger & OnDemand & SyncSettings

/// This device's records, out: the local changes made into records, the ones waiting for
/// upload, the journal's checkpoints, and when a cycle may wait for the tree to settle.
/// Used by the sync engine's push and collect. Guarded by the store's lock.
public protocol LocalRecords: AnyObject {
    func recordLocalChangesSlice(busy: Set<InodeNumber>) throws(StoreError) -> Bool
    var pendingUploadCount: Int { get }
    func pendingUploads(limit: Int) throws(StoreError) -> [SyncRecord]
    func markUploaded(_ ids: [VersionID]) throws(StoreError)
    func uploadedRecords(after: Int64, limit: Int) throws(StoreError) -> [(row: Int64, record: SyncRecord)]
    func durabilityMark() throws(StoreError) -> DurabilityMark
    func journalCheckpointDue() throws(StoreError) -> Bool
    func journalRewritten(records: Int64) throws(StoreError)
    func treeChangesSettling(now: Int64) -> Bool
    func syncMayWait(since lastCycle: Int64, now: Int64) -> Bool
}

/// Peers' records, in: how far each peer's journal was read, which records are known,
/// taking records in and reconciling them with the tree. Used by the sync engine and its
/// pull. Guarded by the store's lock.
public protocol PeerRecords: AnyObject {
    func peerPositions() throws(StoreError) -> [(device: DeviceID, position: Store.JournalPosition)]
    func setPeerPosition(_ device: DeviceID, _ position: Store.JournalPosition) throws(StoreError)
    func knownRecords(_ ids: [VersionID], device: DeviceID, generation: Int64) throws(StoreError) -> Set<VersionID>
    func forgetPrunedRecords(of device: DeviceID, before generation: Int64) throws(StoreError) -> Int
    func takeIn(_ records: [SyncRecord], busy: Set<InodeNumber>) throws(StoreError) -> TreeChanges
    func reconcile(busy: Set<InodeNumber>) throws(StoreError) -> TreeChanges
    func totalConflicts() throws(StoreError) -> Int
}

/// Where chunks are in the backing store (`chunk_places`: which pack, at what offset).
/// Used by the sync engine's pull and push. Guarded by the store's lock.
public protocol ChunkPlaceLedger: AnyObject {
    func chunkPlaces(_ ids: some Sequence<ChunkID>) throws(StoreError) -> [ChunkID: ChunkPlace]
    func setChunkPlaces(_ places: [ChunkID: ChunkPlace]) throws(StoreError)
    func forgetPlaces(inPack pack: String) throws(StoreError)
}

/// Files on demand: which files' contents are not here and what they miss, and a file's
/// absent bytes counted again once chunks came. All the downloader uses. Guarded by the
/// store's lock.
public protocol OnDemand: AnyObject {
    func inode(_ id: InodeNumber) -> Inode?
    func filesNotDownloaded(after: InodeNumber, limit: Int, everything: Bool) throws(StoreError) -> [InodeNumber]
    func missingChunks(of id: InodeNumber) throws(StoreError) -> [ChunkWant]
    func missingConflictChunks() throws(StoreError) -> [ChunkWant]
    func refreshAbsent(_ id: InodeNumber) throws(StoreError) -> (absent: Int64, stateChanged: Bool)
    func contentTotals() -> ContentTotals?
}

/// Sync's settings: cursors, sequence numbers, flags. Guarded by the store's lock.
public protocol SyncSettings: AnyObject {
    func setting(_ key: String) throws(StoreError) -> String?
    func setSetting(_ key: String, _ value: String) throws(StoreError)
    func removeSetting(_ key: String) throws(StoreError)
    func addToSetting(_ key: String, _ delta: Int64) throws(StoreError)
    /// Commits the open group-commit batch: a setting that must be on the disk before a
    /// request to the backing store (a reserved segment name) is. The tree's overlay is not
    /// folded for it: it is safe in the operation log, and a fold here would run under the
    /// lock that requests wait for.
    func commitSettings() throws(StoreError)
}

extension Store: LocalRecords, PeerRecords, ChunkPlaceLedger, OnDemand, SyncSettings {}
