import Dispatch
import Glibc
import UbiquityBacking
import UbiquityStore
import UbiquitySystem

/// Replicates a store through a backing store (a directory or an S3 bucket, backing
/// format 5). One cycle: under the store's lock, record local changes; then look at the
/// log for other devices' segments (one LIST) and take in their records a slice per
/// hold of the lock, their chunks fetched (verified) by ranged GETs of packs first; then
/// upload this device's new records (chunks in packs first, then one segment).
///
/// A backing store that is missing or failing makes the device "offline": local work
/// goes on, records wait in the store (`uploaded = 0`) and go out later. No request runs
/// under the store's lock. Cycles run one at a time (the background loop and
/// `syncNow` share `cycleLock`).
public final class SyncEngine: SyncControl, @unchecked Sendable {
    public struct Options: Sendable {
        /// Seconds between cycles (DESIGN: 1 s): local changes are recorded and pushed at
        /// this pace, and the log is polled at it while there is activity.
        public var pollSeconds: Double = 1
        /// The longest wait between looks at the log when nothing happened here or at a
        /// peer for `activeWindow` seconds: the wait doubles up to this (an idle hour
        /// costs 3600 / idlePollSeconds LISTs).
        public var idlePollSeconds: Double = 40
        public var activeWindow: Double = 300
        /// Seconds between cycles while there is activity (never more than `pollSeconds`).
        public var activePollSeconds: Double = 0.5
        /// Seconds a growing burst of local changes may wait to go out in full segments.
        public var maxPushDelay: Double = 2
        /// Records per segment (fewer if they pass `Backing.partSize` bytes).
        public var uploadBatch = 1000
        /// Other devices' records taken in per hold of the store's lock: a device
        /// catching up on a million records applies them in slices, and the filesystem
        /// serves requests between them.
        public var pullSlice = 2000
        /// The most records per hold while nothing else waits for the store's lock (a
        /// device catching up alone: fewer, bigger commits). About a second's work.
        public var pullSliceMost = 8000
        /// Packs uploaded (or ranges fetched) at once.
        public var parallelRequests = 8
        /// Whether chunks go up while written (nil: unless the backing store is a
        /// directory on the store's own disk; see `stagesWhileWriting`).
        public var stageWhileWriting: Bool?
        /// Seconds a check that a pack is in the backing store and not a fossil stays
        /// good for: a push whose batch took longer (a laptop suspended in the middle)
        /// checks again before it writes its segment (BackingCollector).
        public var objectCheckValidity: Int64 = 3_600
        /// The backing collector's ages (seconds): see `BackingCollector`.
        public var objectGrace: Int64 = 86_400
        public var fossilAge: Int64 = 7 * 86_400
        /// Whether contents follow records in the background or come only when read.
        public var download = DownloadMode.all
        /// Seconds a reader waits for a chunk that is not here before it fails with EIO.
        public var fetchTimeout: Double = 30
        /// `--cache-size` (the filesystem evicts past it): background downloading stops
        /// there, but for pinned files.
        public var cacheSize: Int64?
        public init() {}
    }

    struct State {
        var paused = false
        var offline = false
        var lastSync: Nanos?
        /// Why the last cycle failed (nil: it worked).
        var lastError: StoreError?
        var pending = 0
        var conflicts = 0
        var stopped = false
        /// Sync requests received (`requestSync`), and how many of them a finished cycle
        /// covered (a cycle covers every request received before it started).
        var requests = 0
        var requestsDone = 0
        /// Messages already logged (each problem is logged once, not every second).
        var logged: Set<String> = []
        /// Boot seconds of the last change pushed or seen from a peer, and of the next
        /// look at the log (adaptive polling).
        var lastActivity: Double = -1e9
        var nextPoll: Double = 0
        var idleWait: Double = 0
        /// Set by requestSync / syncNow: the next cycle looks at the log whatever the wait.
        var pollNow = true
        /// Set by requestSync: the next cycle pushes everything pending, burst or not.
        var pushNow = false
        /// When the last cycle of the loop that ran whole began (`monotonicNanos`): requests
        /// put the next off for at most `Store.syncMayWait` after that.
        var lastCycle: Int64 = 0
        /// Set by requestSync / syncNow / resume: records that wait are tried again now.
        var retryNow = false
    }

    /// The store, shared with the filesystem; the engine takes only its lock.
    let shared: SharedStore
    let chunks: ChunkStore
    let backing: Backing
    let deviceName: String
    public let options: Options
    let state = Locked(State())
    let cycleLock = Locked(())
    /// What the engine knows of the backing store between cycles; used under `cycleLock`.
    var memory = Memory()
    /// Uploads the chunks this device writes while they are written (PackStager).
    let stager: PackStager
    /// Whether chunks go up while written: not to a backing directory on the store's own
    /// disk, where the copy would take half the disk from the writer (a big write then runs
    /// at less than half its speed); there they go at the push after the save, a few
    /// seconds later.
    let stagesWhileWriting: Bool
    /// Fetches the contents of files not downloaded (`--download all`; pinned files always).
    let downloader: Downloader
    private let wake = DispatchSemaphore(value: 0)
    private let finished = DispatchSemaphore(value: 0)
    private var started = false

    struct Memory {
        /// The log cursor (loaded from the store on first use).
        var cursor: SegmentLog.Cursor?
        /// Per device, the generation (checkpoint seq + 1) its records are read in.
        var generations: [DeviceID: Int64] = [:]
        /// `devices/` must be listed again (first cycle, activity, a gap, back from
        /// offline, a long time since the last look at the log).
        var scanDevices = true
        /// Boot second of the last look at the log.
        var lastPull: Int64?
        /// Where the next look at the log may start (`SegmentLog.start(after:quietSeconds:)`):
        /// the last segment listed and since when (boot seconds); whether everything the
        /// last look returned was applied (else the next lists the whole window); when a
        /// look last listed the whole skew window.
        var listedKey: BackingKey?
        var listedKeySince: Double = 0
        var resumable = false
        var windowListedAt = -Double.infinity
        /// The key-value generation of each device as last read.
        var keyValueSeen: [DeviceID: UInt64] = [:]
        /// The newest key-value generation of this device's in the backing store, as
        /// listed by this session's first publish (nil: not listed yet).
        var ownKeyValueListed: UInt64?
        /// Packs found present and not fossils, with the boot second of the check.
        var verifiedPacks: [String: Int64] = [:]
        /// Packs this device's last gc found less than half named (BackingCollector):
        /// never named again here; their chunks go into new packs.
        var sparsePacks: Set<String> = []
        /// This device's segments and their recovery after a crash (SyncEngine+Push).
        var logReady = false
        /// Per device, the segment whose record waits, when to try it again and the wait.
        var waiting: [DeviceID: (seq: UInt64, next: Double, delay: Double)] = [:]
        /// Pending records at the last cycle, and since when some have been waiting
        /// (boot seconds): a burst is pushed in full segments (SyncEngine+Push).
        var lastPending = 0
        var lastPendingTime: Double = 0
        var pendingSince: Double?
        /// The backing store's FORMAT was checked this session (and what it was).
        var opened = false
        var openedFormat: Int?
    }

    /// `backing`: the store to sync through (wrapped by the caller in retries as it
    /// sees fit).
    public init(store: SharedStore, backing: any BackingStore, options: Options = Options()) {
        shared = store
        chunks = store.chunks
        self.backing = Backing(store: backing, deviceID: store.deviceID)
        deviceName = store.deviceName
        self.options = options
        stager = PackStager(store: backing, limit: options.parallelRequests)
        stagesWhileWriting = options.stageWhileWriting ?? !Self.onTheSameDisk(backing, store.directory)
        downloader = Downloader(store: store, everything: options.download == .all, cacheLimit: options.cacheSize)
        chunks.observeWritten { [stager] id, bytes in stager.add(id, bytes) }
        // Chunks that are not here come from this engine's backing store (files on demand).
        chunks.setSource(self)
        chunks.setFetchTimeout(seconds: options.fetchTimeout)
    }

    /// Whether `backing` is a directory on the filesystem that holds `directory`.
    static func onTheSameDisk(_ backing: any BackingStore, _ directory: String) -> Bool {
        guard var path = backing.find(DirectoryStore.self)?.root else { return false }
        var a = stat(), b = stat()
        guard stat(directory, &b) == 0 else { return false }
        // Not made yet: where it will be made.
        while stat(path, &a) != 0 {
            guard let slash = path.lastIndex(of: "/"), slash > path.startIndex else { return false }
            path = String(path[..<slash])
        }
        return a.st_dev == b.st_dev
    }

    /// Through a directory (tests, and `--backing DIR`).
    public convenience init(store: SharedStore, backingDirectory: String, options: Options = Options()) {
        self.init(store: store, backing: DirectoryStore(root: backingDirectory), options: options)
    }

    // MARK: control

    /// Starts the background loop (one cycle at once, then one per poll interval).
    public func start() {
        started = true
        DispatchQueue(label: "ubiquity.sync").async { [self] in
            while !state.withLock({ $0.stopped }) {
                let covering = state.withLock { $0.requests }
                runCycle(pushPull: !state.withLock { $0.paused })
                state.withLock { $0.requestsDone = max($0.requestsDone, covering) }
                _ = wake.wait(timeout: .now() + nextWait())
            }
            finished.signal()
        }
        downloader.start()
    }

    /// Stops the loop after a last cycle (unmount: local changes get their records and
    /// go out if the backing store is there).
    public func stop() {
        guard started else { return }
        state.withLock { $0.stopped = true }
        wake.signal()
        finished.wait()
        // Offline (a server that fails or stalls): the records wait in the store for the
        // next mount rather than holding the unmount through every retry.
        runCycle(pushPull: !state.withLock { $0.paused || $0.offline })
        chunks.observeWritten(nil)
        stager.setEnabled(false)
        downloader.stop()
        chunks.setSource(nil)
        // Packs still going up: a moment for them (one cut off is an unnamed object).
        stager.drain(timeout: 10)
    }

    public func syncNow() throws(StoreError) {
        if state.withLock({ $0.paused }) {
            log("ubiquity: sync requested while paused: run `ubiquity resume` first")
            throw .io(errno: EAGAIN, "syncing is paused")
        }
        state.withLock { $0.pollNow = true; $0.retryNow = true }
        _ = try cycleLock.withLock { (_: inout ()) throws(StoreError) in try cycle(pushPull: true, force: true) }
    }

    public func requestSync() throws(StoreError) {
        guard started else {
            // No loop to run it (a store used without a mount): now, then.
            try syncNow()
            state.withLock { $0.requests += 1; $0.requestsDone = $0.requests }
            return
        }
        if state.withLock({ $0.paused }) {
            log("ubiquity: sync requested while paused: run `ubiquity resume` first")
            throw .io(errno: EAGAIN, "syncing is paused")
        }
        state.withLock { $0.requests += 1; $0.pollNow = true; $0.pushNow = true; $0.retryNow = true }
        wake.signal()
    }

    public func pause() {
        state.withLock { s in
            s.paused = true
            stager.setEnabled(false)
            downloader.setEnabled(false)
        }
        log("ubiquity: sync paused")
    }

    public func resume() {
        state.withLock { $0.paused = false; $0.pollNow = true; $0.retryNow = true }
        log("ubiquity: sync resumed")
        wake.signal()
    }

    public func statusText() -> String {
        let s = state.withLock { $0 }
        let mode = s.paused ? "paused" : s.offline ? "offline" : "syncing"
        var text = """
            state=\(mode)
            pending=\(s.pending)
            last-sync=\(s.lastSync.map(isoTime) ?? "never")
            requests=\(s.requests)
            requests-done=\(s.requestsDone)
            conflicts=\(s.conflicts)
            error=\(s.lastError.map { "\($0)" } ?? "")
            error-kind=\(s.lastError.map(Self.kind) ?? "")
            error-advice=\(s.lastError.map(Self.advice) ?? "")
            backing=\(backing.location)
            device=\(deviceName)
            device-id=\(backing.deviceID.hex)

            """
        if let metered = backing.store.find(MeteredStore.self) {
            let m = metered.meter
            text += "backing-requests=\(m.requests)\nbacking-puts=\(m.puts)\nbacking-gets=\(m.gets)\nbacking-lists=\(m.lists)\n"
            text += "backing-heads=\(m.stats)\nbacking-deletes=\(m.deletes)\nbacking-bytes-up=\(m.bytesUp)\nbacking-bytes-down=\(m.bytesDown)\n"
            text += "backing-last-error=\(m.lastError ?? "")\n"
        }
        return text
    }

    /// `retryable` (the engine's own retries can end it: also an object another device
    /// removed or wrote meanwhile), `permanent` (someone must change the settings or the
    /// store) or `local` (this device's disk or database).
    static func kind(_ error: StoreError) -> String {
        guard case .backing(let failure) = error else { return "local" }
        return failure.kind == .permanent ? "permanent" : "retryable"
    }

    /// What a person can do about the failure.
    static func advice(_ error: StoreError) -> String {
        if case .backing(let failure) = error { return failure.advice }
        return "see the daemon's log; sync tries again at the next cycle"
    }

    private func runCycle(pushPull: Bool) {
        // A burst of local tree changes waits in the store's overlay until it pauses
        // (`Store.groupCommit`); a cycle now would fold it all at once, under the lock the
        // requests need. Asked for (`ubiquity sync`) or stopping, it runs.
        // Requests that wait for a slice of its local changes put it off the same way
        // (`cycle`'s `yielding`): sync is background work, and the store's lock is theirs
        // first. Either wait ends `Store.syncMayWait` after the last cycle that ran whole.
        cycleLock.withLock { _ in
            // Whether it was asked for is read and taken in one hold of the state's lock:
            // a request that comes later finds `pushNow` set for the next cycle, never
            // taken by a cycle that then puts its work off (its caller would be told it
            // was done).
            let now = monotonicNanos()
            let (force, stopped, lastCycle) = state.withLock { s in
                defer { s.pushNow = false }
                return (s.pushNow, s.stopped, s.lastCycle)
            }
            let mayWait = !force && !stopped && shared.withLedger { $0.syncMayWait(since: lastCycle, now: now) }
            if mayWait, shared.withLedger({ $0.treeChangesSettling(now: now) }) { return }
            var ran = true
            do {
                // What the burst left is folded while requests go on, not in the cycle's
                // first statement under the lock.
                try shared.foldAhead()
                ran = try cycle(pushPull: pushPull, force: force, yielding: mayWait)
            } catch { logOnce("ubiquity: sync: \(error)") }
            if ran { state.withLock { $0.lastCycle = now } }
        }
    }

    // MARK: adaptive polling

    /// Whether this cycle looks at the log: always when asked (`ubiquity sync`), at every
    /// cycle while this device or a peer was active within `activeWindow`, else after a
    /// wait that doubles up to `idlePollSeconds`.
    func pollDue() -> Bool {
        let now = bootSecondsDouble()
        return state.withLock { s in
            if s.pollNow || now - s.lastActivity < options.activeWindow || now >= s.nextPoll {
                s.pollNow = false
                if now - s.lastActivity >= options.activeWindow {
                    s.idleWait = min(options.idlePollSeconds, max(options.pollSeconds, s.idleWait * 2))
                    s.nextPoll = now + s.idleWait
                }
                return true
            }
            return false
        }
    }

    /// Seconds until the next cycle: `activePollSeconds` (if shorter than the poll) while
    /// this device or a peer was active within `activeWindow`, so a change reaches an
    /// active peer in about a second; `pollSeconds` otherwise.
    func nextWait() -> Double {
        let now = bootSecondsDouble()
        let active = state.withLock { now - $0.lastActivity < options.activeWindow }
        return active ? min(options.pollSeconds, options.activePollSeconds) : options.pollSeconds
    }

    /// A change went out or came in: poll fast again.
    func noteActivity() {
        let now = bootSecondsDouble()
        state.withLock { s in
            s.lastActivity = now
            s.idleWait = 0
            s.nextPoll = now
        }
    }

    func bootSecondsDouble() -> Double {
        var ts = timespec()
        clock_gettime(CLOCK_BOOTTIME, &ts)
        return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
    }

    /// Seconds since boot, counting time suspended (CLOCK_BOOTTIME).
    func bootSeconds() -> Int64 { Self.bootSeconds() }

    static func bootSeconds() -> Int64 {
        var ts = timespec()
        clock_gettime(CLOCK_BOOTTIME, &ts)
        return Int64(ts.tv_sec)
    }

    // MARK: one cycle

    /// Callers hold `cycleLock`. `yielding`: requests that wait for the store's lock while
    /// local changes are recorded end the cycle there (`withLocalChangesRecorded`); returns
    /// false then, and the rest of the cycle waits for the next.
    @discardableResult
    func cycle(pushPull: Bool, force: Bool = false, yielding: Bool = false) throws(StoreError) -> Bool {
        var problem: StoreError?
        var conflicts = 0
        let recorded = try withLocalChangesRecorded(yielding: yielding) { (store, busy) throws(StoreError) -> TreeChanges in
            let changes = try store.reconcile(busy: busy)
            conflicts = try store.totalConflicts()
            return changes
        }
        guard recorded else { return false }
        if pushPull {
            do {
                try openBacking()
                if pollDue() {
                    try pull()
                    // Without a loop (a store synced by hand, tests), the contents of what
                    // came in follow now, before the push can fail and end the cycle.
                    if !started {
                        downloader.setEnabled(true)
                        _ = downloader.runPass()
                    }
                }
                try push(force: force || state.withLock { $0.stopped })
            } catch { problem = error }
        }
        var pending = 0
        try shared.withLedger { (store) throws(StoreError) in
            pending = store.pendingUploadCount
            conflicts = try store.totalConflicts()
        }
        let failed = problem
        // Chunks go up while written only while this device syncs (decided under the
        // state's lock, which `pause` holds to turn it off: no cycle turns it back on).
        state.withLock { s in
            stager.setEnabled(stagesWhileWriting && pushPull && failed == nil && !s.paused && !s.stopped)
            downloader.setEnabled(pushPull && failed == nil && !s.paused && !s.stopped)
        }
        state.withLock { s in
            s.pending = pending
            s.conflicts = conflicts
            guard pushPull else { return }
            s.offline = failed != nil
            if let failed {
                s.lastError = failed
            } else {
                s.lastSync = nowNanos()
                if s.lastError != nil { log("ubiquity: sync: the backing store works again") }
                s.lastError = nil
                s.logged = s.logged.filter { !$0.hasPrefix("ubiquity: sync: working offline") }
            }
        }
        if let failed {
            // Offline: look again at the next cycle once it is back.
            state.withLock { $0.pollNow = true }
            memory.opened = false
            // Peers may collect segments meanwhile (covered by a checkpoint, a day old):
            // back online, look for their checkpoints as a mount that starts does.
            memory.scanDevices = true
            logOnce("ubiquity: sync: working offline: \(failed)")
            throw failed
        }
        return true
    }

    /// Runs `body` in a hold of the store's lock in which every local change is
    /// recorded first: local changes a slice per hold (a burst of saves must not stall
    /// every request for the whole batch), and the last slice and `body` in one hold, so
    /// that reconcile never meets a view that forgot a local change made before it, and a
    /// push never sends a record without those of the changes made before it.
    ///
    /// `yielding`: a slice that ends with another thread waiting for the lock (requests:
    /// a burst of opens, unlinks or saves) ends the work there, before `body`, and returns
    /// false; what is left waits in the change set for a later cycle.
    @discardableResult
    func withLocalChangesRecorded(yielding: Bool = false, _ body: (any SyncLedger, Set<InodeNumber>) throws(StoreError) -> TreeChanges) throws(StoreError) -> Bool {
        var more = true
        while more {
            let waited = try shared.change { (store, busy) throws(StoreError) -> TreeChanges in
                more = try store.recordLocalChangesSlice(busy: busy)
                return more ? TreeChanges() : try body(store, busy)
            }
            guard more else { return true }
            if yielding && waited { return false }
            // Between slices, a waiting request takes the store's lock (a pthread mutex
            // is not fair: taking it again at once can keep a request out).
            shared.yieldToWaiters()
        }
        return true
    }

    /// Checks FORMAT once a session (and after a failure); on a store of format 4, this
    /// device's records go into a checkpoint before FORMAT says 5 (SyncEngine+Push).
    func openBacking() throws(StoreError) {
        guard !memory.opened else { return }
        let format = try backing.open()
        try startLog()
        if let format, format < Backing.formatVersion {
            try backing.writeFormat()
            log("ubiquity: sync: upgraded the backing store \(backing.location) from format \(format) to \(Backing.formatVersion); devices running an older ubiquity must upgrade to sync (their records reach the others from the checkpoint they write then)")
        }
        memory.opened = true
    }

    // MARK: durability

    /// The durability barrier before records leave this device: a power loss must not
    /// take back a record other devices have (recovery would roll back a version they
    /// show, and its dot would be given to another record).
    func makeDurable() throws(StoreError) {
        // The mark and the barrier's first step fold what the overlay holds under the
        // store's lock: a burst that goes on while records go out is folded ahead, off it.
        try shared.foldAhead()
        var mark: DurabilityMark?
        try shared.withLedger { (store) throws(StoreError) in
            mark = try store.durabilityMark()
        }
        guard let mark, mark.row > 0 else { return }
        try chunks.sync() // without the store's lock: a disk flush
        try shared.markDurable(upTo: mark)
    }

    func logOnce(_ message: String) {
        let first = state.withLock { $0.logged.insert(message).inserted }
        if first { log(message) }
    }
}
