import Synchronization
import UbiquitySystem

/// A store that more than one thread uses (a mount: the filesystem's requests, the sync
/// engine, the downloader, the control server): the store behind a lock of its own, the
/// only way to it. `Store` itself is not thread-safe; whoever shares one wraps it here
/// once and no longer uses it directly.
///
/// Lock order, everywhere (`LockRank`, checked in debug builds): the filesystem's lock
/// (`FileSystem.meta`, which guards only the filesystem's own state: handles, lookups,
/// open files, views), then this one, then the index's (`Index`), then leaf locks
/// (the chunk store's, a file's summary, the busy files). The sync engine takes only
/// this one. No request to the backing store runs under either: this lock is
/// held for SQLite work only, and a fetch of a chunk asked for under it is refused
/// (`ChunkStore.refuseFetches`, counted in `fetchStatistics.refusedUnderLock`). The one
/// lock that may be held across a fetch is a file's content lock (`FileContent`): its
/// reader waits for its own bytes.
public final class SharedStore: Sendable {
    private let locked: Locked<Store>
    /// What runs outside the lock: the index (its lock, to wait for the folder; a
    /// barrier's commit), the checkpoints' own connection.
    private let index: Index
    private let checkpointer: WALCheckpointer
    private let hooks = Locked(Hooks())
    /// Whether the index had every change committed as the last hold of the lock ended
    /// (`Store.isCurrentForReaders`): a hold is the only way to change the store, and
    /// whatever writes the index with the lock let go (a fold's part, a barrier) was lent
    /// it in a hold that ended with this false. `prepareVersionReads` looks here without
    /// the lock.
    private let readersCurrent: Atomic<Bool>
    public let chunks: ChunkStore
    public let reservation: SpaceReservation
    /// The key-value store, under its own lock (taken without this one, or under the
    /// filesystem's).
    public let keyValues: KeyValueTable
    /// The tree's working set, which lookup and getattr read without this lock.
    public let tree: TreeCache
    /// The versions' reader (`.versions/`), under its own lock, after `prepareVersionReads`.
    public let versions: VersionLog
    public let directory: String
    public let stagingDirectory: String
    public let deviceID: DeviceID
    public let deviceName: String
    /// The store's clock (tests inject one before sharing the store).
    public let clock: @Sendable () -> Nanos

    private struct Hooks {
        var observer: (@Sendable (TreeChanges) -> Void)?
        var busy: (@Sendable () -> Set<InodeNumber>)?
    }

    public init(_ store: Store) {
        locked = Locked(store, rank: .store)
        index = store.index
        index.letGo = { [weak locked] in locked?.wakeSleepersFromAnyThread() }
        checkpointer = store.checkpointer
        chunks = store.chunks
        reservation = store.reservation
        keyValues = store.keyValues
        tree = store.workingSet
        versions = VersionLog(path: store.db.path)
        readersCurrent = Atomic(store.isCurrentForReaders)
        directory = store.directory
        stagingDirectory = store.stagingDirectory
        deviceID = store.deviceID
        deviceName = store.deviceName
        clock = store.clock
    }

    /// Runs `body` with the store, under its lock (a transaction of the caller's making:
    /// the store's own methods are atomic each; several in one hold see no other change
    /// between them).
    ///
    /// Most callers (sync, downloads, maintenance) use the SQLite connection: while the
    /// group commit's folder holds the index's lock, `body` waits for it with the store's
    /// lock let go (`Locked.withLock(when:_:)`), so requests go on meanwhile; the hold
    /// that ends after the folder let the index go wakes it (`endHold`). Requests use
    /// `withNamespaceLock`.
    public func withLock<T, E: Error>(_ body: (Store) throws(E) -> T) throws(E) -> T {
        try locked.withLock(when: { [index] _ in !index.isLentElsewhere }) { (store) throws(E) -> T in
            defer { endHold(store) }
            return try body(store)
        }
    }

    /// `withLock` for sync: the store as a `SyncLedger`, all sync may do to it.
    public func withLedger<T, E: Error>(_ body: (any SyncLedger) throws(E) -> T) throws(E) -> T {
        try withLock { (store) throws(E) -> T in try body(store) }
    }

    /// Whether another thread is blocked on the lock now.
    var hasWaiters: Bool { locked.hasWaiters }

    /// Acquisitions of the lock so far (tests: readers that must not take it).
    var acquisitions: UInt { locked.acquisitionCount }

    /// Callers of `withLock` waiting for the index now, with the lock let go (tests).
    var waitingForIndex: Int { locked.sleeperCount }

    /// `withLock` for requests, which change the namespace and read around the gate: they
    /// go on while the folder writes (Store+BackgroundFold).
    public func withNamespaceLock<T, E: Error>(_ body: (Store) throws(E) -> T) throws(E) -> T {
        try locked.withLock { (store) throws(E) -> T in
            defer { endHold(store) }
            return try body(store)
        }
    }

    /// As each hold ends: whatever the body changed in the tree is in the log before the
    /// lock goes (and so before a request's reply), one frame per hold; and once no
    /// thread holds the index, the holders waiting for it look again (the folder's last
    /// step is such a hold, after it let the index go).
    private func endHold(_ store: Store) {
        store.logTreeChanges()
        readersCurrent.store(store.isCurrentForReaders, ordering: .releasing)
        if !index.isLent { locked.wakeSleepers() }
    }

    /// The group commit's step (`Store.groupCommit`), with the part of the overlay it
    /// folds written while the lock is let go (Store+BackgroundFold), with the index and
    /// the part alone: requests go on meanwhile, and only what needs the SQLite
    /// connection waits for it.
    public func groupCommit(lastRequest: Int64) throws(StoreError) -> Store.GroupCommit {
        // A holder the last part woke (it waits for the index) or a request blocked on the
        // lock takes it before the next part lends the index again.
        locked.yieldToWaiters()
        let start = try withLock { (store) throws(StoreError) in try store.beginFold(lastRequest: lastRequest) }
        switch start {
        case .ended(let result): return result
        case .fold(let part):
            part.write()
            return try withLock { (store) throws(StoreError) in try store.finishFold(part) }
        }
    }

    /// Folds the overlay with the group commit's parts, each written while the lock is
    /// let go, until at most `leaving` changes wait: work about to hold the lock through
    /// the gate (a durability barrier, a sync cycle) calls it first, so the fold it does
    /// there is short. Right after a burst the overlay can hold tens of thousands of
    /// changes, hundreds of milliseconds of SQLite that requests would wait for.
    public func foldAhead(leaving: Int = Store.foldAheadLeaves) throws(StoreError) {
        while case .fold(let part) = try withLock({ (store) throws(StoreError) in try store.beginFold(leaving: leaving) }) {
            part.write()
            _ = try withLock { (store) throws(StoreError) in try store.finishFold(part) }
            locked.yieldToWaiters() // as between the group commit's parts
        }
    }

    /// Brings the index up to now for `versions`' reads: the overlay folded in the group
    /// commit's parts (written with the lock let go), directories moved settled a slice
    /// at a time, then the last changes folded and the batch committed in one short hold.
    /// When the index is current already (as the last hold ended), nothing: no hold of the
    /// lock. Called with no lock held; a request that reads `.versions/` then holds none
    /// of the store's.
    public func prepareVersionReads() throws(StoreError) {
        if readersCurrent.load(ordering: .acquiring) { return }
        try foldAhead()
        try settleMoves()
        try withLock { (store) throws(StoreError) in try store.commitBatch() }
    }

    /// Settles directories moved (Store+MovedTrees) a slice a hold, the lock going to
    /// whoever waits for it between slices: what reads where histories are shown (a
    /// read of `.versions/`, prune, a pull slice) calls it first, so the settling it does
    /// itself under the lock is at most what moved since.
    public func settleMoves() throws(StoreError) {
        while try withLock({ (store) throws(StoreError) in try store.settleMoves() }) { locked.yieldToWaiters() }
    }

    /// Durability barrier, part 1 (`Store.syncFiles`), without the lock: a disk flush.
    public func syncFiles() throws(StoreError) { try chunks.sync() }

    /// Durability barrier, part 2 (`Store.markDurable`), its disk flush without the lock:
    /// requests go on meanwhile.
    public func markDurable(upTo mark: DurabilityMark? = nil) throws(StoreError) {
        let barrier = try withLock { (store) throws(StoreError) in try store.beginBarrier(upTo: mark) }
        var failure: StoreError?
        do throws(StoreError) { try index.writeBarrier(barrier) } catch { failure = error }
        // A hold after the commit either way: it wakes whoever waits for the index.
        withLock { store in if failure == nil { store.finishBarrier(barrier) } }
        if let failure { throw failure }
    }

    /// The mark a durability barrier makes durable up to (`Store.durabilityMark`).
    public func durabilityMark() throws(StoreError) -> DurabilityMark {
        try withLock { (store) throws(StoreError) in try store.durabilityMark() }
    }

    /// Whether a periodic durability barrier has work: versions saved since the last one,
    /// or an operation log to trim.
    public func needsDurableWork() throws(StoreError) -> Bool {
        try withLock { (store) throws(StoreError) in try store.hasUndurableVersions() || store.treeLogNeedsTrim }
    }

    /// The databases' sizes (`Store.databaseBytes`).
    public var databaseBytes: (metadata: Int64, smallChunks: Int64) { withLock { $0.databaseBytes } }

    /// The inodes in the tree (`Store.inodeCount`), for statfs when the working set does
    /// not know.
    public var inodeCount: Int { withLock { $0.inodeCount } }

    /// A setting of the store's (`Store.setting`).
    public func setting(_ key: String) throws(StoreError) -> String? {
        try withLock { (store) throws(StoreError) in try store.setting(key) }
    }

    /// Runs `body` under the store's lock after committing the batch, so a second
    /// connection opened there sees every change made so far (a query's snapshot).
    public func withCommittedBatch<T>(_ body: () throws(StoreError) -> T) throws(StoreError) -> T {
        try withLock { (store) throws(StoreError) -> T in
            try store.commitBatch()
            return try body()
        }
    }

    /// Checkpoints of both databases from connections of their own, without the lock.
    public func checkpointInBackground() throws(StoreError) {
        try checkpointer.run()
        try chunks.checkpoint()
    }

    /// Between slices of background work, without the lock: it goes to whoever waited
    /// for it (`Locked.yieldToWaiters`).
    public func yieldToWaiters() { locked.yieldToWaiters() }

    /// Whether the calling thread holds the store's lock now.
    public var isHeldByCurrentThread: Bool { locked.isHeldByCurrentThread }

    /// Who hears what `change` did to the tree (the filesystem: it moves open readers to
    /// the new version and tells the kernel and watchers). Called after the lock is
    /// released, on the thread that made the change, one change at a time per caller.
    public func observeTreeChanges(_ observer: (@Sendable (TreeChanges) -> Void)?) {
        hooks.withLock { $0.observer = observer }
    }

    /// What says which files a change must not touch now (the filesystem: files open for
    /// writing or with unsaved writes). Called under the store's lock, so it may take
    /// only leaf locks.
    public func provideBusyFiles(_ busy: (@Sendable () -> Set<InodeNumber>)?) {
        hooks.withLock { $0.busy = busy }
    }

    /// A change to the tree from elsewhere (a sync step): `body` gets the store (as a
    /// `SyncLedger`) and the files it must leave alone, and returns what it changed; the
    /// conflicts it made are added, and the observer hears of it all once the lock is
    /// released. Returns whether another thread was waiting for the lock by the end (a
    /// caller working in slices makes the next one short).
    @discardableResult
    public func change(_ body: (any SyncLedger, Set<InodeNumber>) throws(StoreError) -> TreeChanges) throws(StoreError) -> Bool {
        let busy = hooks.withLock { $0.busy }
        let (changes, waited) = try withLock { (store) throws(StoreError) -> (TreeChanges, Bool) in
            var changes = try body(store, busy?() ?? [])
            changes.conflicts += store.takeNewConflicts()
            return (changes, hasWaiters)
        }
        announce(changes)
        return waited
    }

    /// Tells the observer of changes made without this lock (keys another device set in
    /// `keyValues`).
    public func announce(_ changes: TreeChanges) {
        if !changes.isEmpty, let observer = hooks.withLock({ $0.observer }) { observer(changes) }
    }
}
