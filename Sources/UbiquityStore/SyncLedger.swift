/// What sync (the sync engine, the downloader, the key-value sync) does to the store, and
/// all it may: the shared store hands it this, not the `Store` (`SharedStore.withLedger`,
/// `SharedStore.change`), so sync reaches the tree only through the synced view's steps
/// (take in, reconcile, record local changes) and never through a request's operations
/// (create, rename, commit), whose rules are the filesystem's.
public protocol SyncLedger: AnyObject {
    var deviceID: DeviceID { get }
    var deviceName: String { get }
    /// The store's directory (where sync keeps its staging files).
    var directory: String { get }
    /// The local chunks (safe to use outside the store's lock).
    var chunks: ChunkStore { get }

    // MARK: settings: cursors, sequence numbers, flags

    func setting(_ key: String) throws(StoreError) -> String?
    func setSetting(_ key: String, _ value: String) throws(StoreError)
    func removeSetting(_ key: String) throws(StoreError)
    func addToSetting(_ key: String, _ delta: Int64) throws(StoreError)
    /// Commits the open group-commit batch: a setting that must be on the disk before a
    /// request to the backing store (a reserved segment name) is. The tree's overlay is not
    /// folded for it: it is safe in the operation log, and a fold here would run under the
    /// lock that requests wait for.
    func commitSettings() throws(StoreError)

    // MARK: this device's records, out

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

    // MARK: peers' records, in

    func peerPositions() throws(StoreError) -> [(device: DeviceID, position: Store.JournalPosition)]
    func setPeerPosition(_ device: DeviceID, _ position: Store.JournalPosition) throws(StoreError)
    func knownRecords(_ ids: [VersionID], device: DeviceID, generation: Int64) throws(StoreError) -> Set<VersionID>
    func forgetPrunedRecords(of device: DeviceID, before generation: Int64) throws(StoreError) -> Int
    func takeIn(_ records: [SyncRecord], busy: Set<InodeNumber>) throws(StoreError) -> TreeChanges
    func reconcile(busy: Set<InodeNumber>) throws(StoreError) -> TreeChanges
    func totalConflicts() throws(StoreError) -> Int

    // MARK: where chunks are in the backing store

    func chunkPlaces(_ ids: some Sequence<ChunkID>) throws(StoreError) -> [ChunkID: ChunkPlace]
    func setChunkPlaces(_ places: [ChunkID: ChunkPlace]) throws(StoreError)
    func forgetPlaces(inPack pack: String) throws(StoreError)

    // MARK: files on demand

    func inode(_ id: InodeNumber) -> Inode?
    func filesNotDownloaded(after: InodeNumber, limit: Int, everything: Bool) throws(StoreError) -> [InodeNumber]
    func missingChunks(of id: InodeNumber) throws(StoreError) -> [ChunkWant]
    func missingConflictChunks() throws(StoreError) -> [ChunkWant]
    func refreshAbsent(_ id: InodeNumber) throws(StoreError) -> (absent: Int64, stateChanged: Bool)
    func contentTotals() -> ContentTotals?

    // MARK: the key-value store

    func kvOwnEntries() throws(StoreError) -> [KVEntry]
    func kvMerge(_ entries: [KVEntry]) throws(StoreError) -> (changes: [KVChange], rejected: [String])
    func kvUnpublished() throws(StoreError) -> String?
    func kvPublished(_ generation: String) throws(StoreError)
}

extension Store: SyncLedger {}
