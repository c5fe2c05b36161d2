import Dispatch
import Glibc
import UbiquityStore
import UbiquitySystem

/// Replicates a store through a backing directory. One cycle: read other devices' new
/// journal lines and fetch (verified) the chunks they name; then, under the store's
/// lock, record local changes, take in the remote records and reconcile the tree; then
/// upload this device's new records (objects first, then the journal lines).
///
/// A backing directory that is missing or failing makes the device "offline": local
/// work goes on, records wait in the store (`uploaded = 0`) and go out later. Cycles run
/// one at a time (the background loop and `syncNow` share `cycleLock`).
public final class SyncEngine: SyncControl, @unchecked Sendable {
    public struct Options: Sendable {
        /// Seconds between cycles (DESIGN: 1 s).
        public var pollSeconds: Double = 1
        /// Records per journal append.
        public var uploadBatch = 256
        /// Other devices' records taken in per hold of the filesystem's lock: a device
        /// catching up on a million records applies them in slices, and the filesystem
        /// serves requests between them.
        public var pullSlice = 2000
        /// Seconds a check that an object is in the backing directory stays good for: a
        /// push whose batch took longer (a laptop suspended in the middle) checks again
        /// before it appends, so a fossil collected meanwhile is uploaded again
        /// (BackingCollector).
        public var objectCheckValidity: Int64 = 3_600
        /// The backing collector's ages (seconds): see `BackingCollector`.
        public var objectGrace: Int64 = 86_400
        public var fossilAge: Int64 = 7 * 86_400
        public init() {}
    }

    struct State {
        var paused = false
        var offline = false
        var lastSync: Nanos?
        var lastError = ""
        var pending = 0
        var conflicts = 0
        var stopped = false
        /// Sync requests received (`requestSync`), and how many of them a finished cycle
        /// covered (a cycle covers every request received before it started).
        var requests = 0
        var requestsDone = 0
        /// Messages already logged (each problem is logged once, not every second).
        var logged: Set<String> = []
    }

    let access: StoreAccess
    let chunks: ChunkStore
    let backing: Backing
    let deviceName: String
    public let options: Options
    let state = Locked(State())
    let cycleLock = Locked(())
    /// Journal positions read so far, by device (mirrors the store's sync_peers).
    private let offsets = Locked<[String: Store.JournalPosition]?>(nil)
    /// The generation of each device's journal read to its end this session (the pruned
    /// records it no longer holds were forgotten then). Used under `cycleLock`.
    private var readToEnd: [String: Int64] = [:]
    /// The key-value file of each device as last read (KeyValueSync).
    let kvSeen = Locked<[String: FileSignature]>([:])
    private let wake = DispatchSemaphore(value: 0)
    private let finished = DispatchSemaphore(value: 0)
    private var started = false

    public init(access: StoreAccess, store: Store, backingDirectory: String, options: Options = Options()) {
        self.access = access
        chunks = store.chunks
        backing = Backing(directory: backingDirectory, deviceID: store.deviceID)
        deviceName = store.deviceName
        self.options = options
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
                _ = wake.wait(timeout: .now() + options.pollSeconds)
            }
            finished.signal()
        }
    }

    /// Stops the loop after a last cycle (unmount: local changes get their records and
    /// go out if the backing directory is there).
    public func stop() {
        guard started else { return }
        state.withLock { $0.stopped = true }
        wake.signal()
        finished.wait()
        runCycle(pushPull: !state.withLock { $0.paused })
    }

    public func syncNow() throws(StoreError) {
        if state.withLock({ $0.paused }) {
            log("ubiquity: sync requested while paused: run `ubiquity resume` first")
            throw .io(errno: EAGAIN, "syncing is paused")
        }
        try cycleLock.withLock { (_: inout ()) throws(StoreError) in try cycle(pushPull: true) }
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
        state.withLock { $0.requests += 1 }
        wake.signal()
    }

    public func pause() {
        state.withLock { $0.paused = true }
        log("ubiquity: sync paused")
    }

    public func resume() {
        state.withLock { $0.paused = false }
        log("ubiquity: sync resumed")
        wake.signal()
    }

    public func statusText() -> String {
        let s = state.withLock { $0 }
        let mode = s.paused ? "paused" : s.offline ? "offline" : "syncing"
        return """
            state=\(mode)
            pending=\(s.pending)
            last-sync=\(s.lastSync.map(isoTime) ?? "never")
            requests=\(s.requests)
            requests-done=\(s.requestsDone)
            conflicts=\(s.conflicts)
            error=\(s.lastError)
            backing=\(backing.directory)
            device=\(deviceName)
            device-id=\(backing.deviceID)

            """
    }

    private func runCycle(pushPull: Bool) {
        cycleLock.withLock { _ in
            do { try cycle(pushPull: pushPull) } catch { logOnce("ubiquity: sync: \(error)") }
        }
    }

    // MARK: one cycle

    /// Callers hold `cycleLock`.
    func cycle(pushPull: Bool) throws(StoreError) {
        var problem: StoreError?
        var pending = 0, conflicts = 0
        if pushPull {
            do { try backing.open() } catch { problem = error }
        }
        // Local changes first, a slice per hold of the filesystem's lock (a burst of saves
        // must not stall every request for the whole batch), then other devices' records a
        // slice at a time. The last local slice and the first reconcile share a hold, so
        // the tree never shows a view that forgot a local change.
        var localMore = true
        while true {
            var incoming: [SyncRecord] = []
            var newOffsets: [String: Store.JournalPosition] = [:]
            var more = false
            if pushPull && problem == nil && !localMore {
                do { (incoming, newOffsets, more) = try pull(limit: options.pullSlice) } catch { problem = error }
            }
            let recording = localMore
            try access.withStore { (store, busy) throws(StoreError) -> TreeChanges in
                if recording {
                    localMore = try store.recordLocalChangesSlice(busy: busy)
                    if localMore { return TreeChanges() }
                    more = pushPull && problem == nil // then pull
                }
                if !incoming.isEmpty { try store.addRemote(incoming) }
                for (device, position) in newOffsets { try store.setPeerPosition(device, position) }
                let changes = try store.reconcile(busy: busy)
                conflicts = try store.totalConflicts()
                return changes
            }
            offsets.withLock { known in for (d, o) in newOffsets { known?[d] = o } }
            if !more && !localMore { break }
            // Between slices, let a waiting request take the filesystem's lock (a pthread
            // mutex is not fair: taking it again at once can keep a request out).
            usleep(200)
        }
        if pushPull && problem == nil {
            do { try push() } catch { problem = error }
        }
        // The key-value store: other devices' files that changed, then this device's own.
        if pushPull && problem == nil {
            do {
                try pullKeyValues(devices: try backing.peers().devices)
                try pushKeyValues()
            } catch { problem = error }
        }
        try access.withStore { (store, _) throws(StoreError) -> TreeChanges in
            pending = store.pendingUploadCount
            return TreeChanges()
        }
        let failed = problem
        state.withLock { s in
            s.pending = pending
            s.conflicts = conflicts
            guard pushPull else { return }
            s.offline = failed != nil
            if let failed {
                s.lastError = "\(failed)"
            } else {
                s.lastSync = nowNanos()
                if !s.lastError.isEmpty { log("ubiquity: sync: the backing directory works again") }
                s.lastError = ""
                s.logged = s.logged.filter { !$0.hasPrefix("ubiquity: sync: working offline") }
            }
        }
        if let failed {
            logOnce("ubiquity: sync: working offline: \(failed)")
            throw failed
        }
    }

    // MARK: pull

    /// How far each device's journal was read: kept in memory, loaded from the store the
    /// first time a device is seen.
    private func knownPositions(_ devices: [String]) throws(StoreError) -> [String: Store.JournalPosition] {
        var known = offsets.withLock { $0 ?? [:] }
        let unknown = devices.filter { known[$0] == nil }
        if !unknown.isEmpty {
            try access.withStore { (store, _) throws(StoreError) -> TreeChanges in
                for device in unknown { known[device] = try store.peerPosition(device) }
                return TreeChanges()
            }
            offsets.withLock { $0 = known }
        }
        return known
    }

    /// New complete records of other devices, in journal order, with their chunks in the
    /// local chunk store; how far each journal was consumed; and whether more records may
    /// wait (it stops after `limit` records, at the end of a line).
    ///
    /// A device that rewrote its journal (a new generation, docs/FORMAT.md) is read again
    /// from the start of the new one: the records this store holds or pruned are skipped
    /// before their chunks are fetched.
    private func pull(limit: Int) throws(StoreError) -> ([SyncRecord], [String: Store.JournalPosition], Bool) {
        let (devices, ignored) = try backing.peers()
        for name in ignored { logOnce("ubiquity: sync: ignoring devices/\(RecordCodec.printable(name)) in the backing directory (not a device id)") }
        let known = try knownPositions(devices)
        var records: [SyncRecord] = []
        var consumed: [String: Store.JournalPosition] = [:]
        var more = false
        devices: for device in devices {
            let current: Int64
            do {
                guard let last = try backing.generations(of: device).last else { continue devices }
                current = last
            } catch {
                // One unreadable device directory must not stop the others.
                logOnce("ubiquity: sync: cannot read the journal of device \(device): \(error)")
                continue devices
            }
            var position = known[device] ?? Store.JournalPosition(generation: 0, offset: 0)
            if position.generation != current {
                // Stored at once: a prune while the new generation is read must remember
                // what it drops as met in it (`seen`), or reaching its end would forget it.
                position = Store.JournalPosition(generation: current, offset: 0)
                try access.withStore { (store, _) throws(StoreError) -> TreeChanges in
                    try store.setPeerPosition(device, position)
                    return TreeChanges()
                }
                offsets.withLock { $0?[device] = position }
            }
            let journal = "devices/\(device)/\(Backing.journalName(current))"
            reading: while true {
                let read: Backing.Lines?
                do { read = try backing.lines(of: device, generation: current, from: position.offset) } catch {
                    logOnce("ubiquity: sync: cannot read the journal of device \(device): \(error)")
                    break reading
                }
                // Gone: rewritten since it was listed; the next cycle reads the new one.
                guard let batch = read else { break reading }
                if batch.skipped > 0 {
                    logOnce("ubiquity: sync: skipping \(batch.skipped) bytes at byte \(position.offset) of \(journal): a line longer than \(Backing.maxLine) bytes")
                }
                let decoded = batch.lines.map { RecordCodec.decode($0.bytes, journalDevice: device) }
                let ids = decoded.compactMap { try? $0.get().id }
                var held: Set<String> = []
                if !ids.isEmpty {
                    try access.withStore { (store, _) throws(StoreError) -> TreeChanges in
                        held = try store.knownRecords(ids, device: device, generation: current)
                        return TreeChanges()
                    }
                }
                var offset = batch.end
                var stopped = false
                lines: for (line, result) in zip(batch.lines, decoded) {
                    switch result {
                    case .failure(let why):
                        logOnce("ubiquity: sync: skipping line at byte \(line.start) of \(journal): \(why)")
                    case .success(let record):
                        if held.contains(record.id) { break }
                        switch fetchChunks(of: record) {
                        case .ready: records.append(record)
                        case .malformed(let why):
                            logOnce("ubiquity: sync: skipping record \(record.id) of \(journal): \(why)")
                        case .waiting(let why):
                            logOnce("ubiquity: sync: record \(record.id) of \(journal) waits: \(why)")
                            offset = line.start
                            stopped = true
                            break lines
                        }
                    }
                    if records.count >= limit {
                        offset = line.start + Int64(line.bytes.count) + 1
                        more = true
                        stopped = true
                        break lines
                    }
                }
                if offset != position.offset {
                    position.offset = offset
                    consumed[device] = position
                }
                if more { break devices }
                if stopped { break reading }
                if batch.atEnd {
                    try readEntirely(device, generation: current)
                    break reading
                }
            }
        }
        return (records, consumed, more)
    }

    /// A generation of a device's journal was read to its end, so all of the checkpoint
    /// it starts with: the records this device pruned that were not met in it are gone.
    private func readEntirely(_ device: String, generation: Int64) throws(StoreError) {
        guard readToEnd[device] != generation else { return }
        var forgotten = 0
        try access.withStore { (store, _) throws(StoreError) -> TreeChanges in
            forgotten = try store.forgetPrunedRecords(of: device, before: generation)
            return TreeChanges()
        }
        readToEnd[device] = generation
        if forgotten > 0 {
            log("ubiquity: sync: device \(device) rewrote its journal without \(forgotten) record(s) this device pruned: forgotten")
        }
    }

    enum Fetch { case ready, waiting(String), malformed(String) }

    /// Copies the record's chunks into the local chunk store, each verified.
    private func fetchChunks(of record: SyncRecord) -> Fetch {
        for (id, size) in record.chunks.chunks {
            if let bytes = record.inline[id] {
                // Carried in the record, checked against its id by the codec.
                do { try chunks.put(id, bytes) } catch { return .waiting("chunk \(id.hex): \(error)") }
                continue
            }
            if chunks.contains(id) {
                if let stored = chunks.size(of: id), stored != Int(size) { return .malformed("chunk \(id.hex) is \(stored) bytes, not \(size)") }
                continue
            }
            do {
                guard let bytes = try backing.object(id) else { return .waiting("object \(id.hex) is not in the backing directory yet") }
                guard bytes.count == Int(size) else { return .malformed("object \(id.hex) is \(bytes.count) bytes, not \(size)") }
                try chunks.put(id, bytes)
            } catch {
                return .waiting("object \(id.hex): \(error)")
            }
        }
        return .ready
    }

    // MARK: push

    private func push() throws(StoreError) {
        while true {
            var batch: [SyncRecord] = []
            try access.withStore { (store, _) throws(StoreError) -> TreeChanges in
                batch = try store.pendingUploads(limit: options.uploadBatch)
                return TreeChanges()
            }
            if batch.isEmpty { return }
            try makeDurable()
            // An object found present may become a fossil once it is old (BackingCollector),
            // to be deleted days later: a batch whose checks took longer than
            // `objectCheckValidity` (the device slept meanwhile) checks once more.
            let checked = bootSeconds()
            try uploadObjects(&batch)
            if bootSeconds().subtractingClamped(checked) > options.objectCheckValidity {
                try uploadObjects(&batch)
            }
            try backing.append(batch.map(RecordCodec.encode))
            let ids = batch.map(\.id)
            try access.withStore { (store, _) throws(StoreError) -> TreeChanges in
                try store.markUploaded(ids)
                return TreeChanges()
            }
            if batch.count < options.uploadBatch { return }
        }
    }

    /// The durability barrier before records leave this device: a power loss must not
    /// take back a record other devices have (recovery would roll back a version they
    /// show, and its dot would be given to another record).
    func makeDurable() throws(StoreError) {
        var mark: DurabilityMark?
        try access.withStore { (store, _) throws(StoreError) -> TreeChanges in
            mark = try store.durabilityMark()
            return TreeChanges()
        }
        guard let mark, mark.row > 0 else { return }
        try chunks.sync() // without the filesystem's lock: a disk flush
        try access.withStore { (store, _) throws(StoreError) -> TreeChanges in
            try store.markDurable(upTo: mark)
            return TreeChanges()
        }
    }

    /// Puts the objects of the batch's records that are not in the backing directory
    /// there, and carries the small chunks in the records. `tolerant` (a checkpoint, which
    /// rewrites records already out): a chunk this store cannot read (damaged here, for
    /// `fsck --repair`) is logged and left named by its hash, as it was before.
    func uploadObjects(_ batch: inout [SyncRecord], tolerant: Bool = false) throws(StoreError) {
        var directories: Set<String> = []
        for i in batch.indices {
            for (id, size) in batch[i].chunks.chunks where batch[i].inline[id] == nil {
                let small = size <= RecordCodec.maxInline
                if !small && backing.hasObject(id) { continue }
                let bytes: [UInt8]
                do { bytes = try chunks.read(id) } catch {
                    guard tolerant else { throw error }
                    logOnce("ubiquity: sync: rewriting the journal: chunk \(id.hex) of \(batch[i].path) cannot be read here (\(error)); its record names it by hash")
                    continue
                }
                if small {
                    batch[i].inline[id] = bytes // travels in the record
                } else {
                    try backing.putObject(id, bytes)
                    directories.insert(String(id.hex.prefix(2)))
                }
            }
        }
        // The objects' names must be durable before a record names them.
        for dir in directories { fsyncDirectory(backing.directory + "/objects/" + dir) }
    }

    /// Seconds since boot, counting time suspended (CLOCK_BOOTTIME).
    private func bootSeconds() -> Int64 {
        var ts = timespec()
        clock_gettime(CLOCK_BOOTTIME, &ts)
        return Int64(ts.tv_sec)
    }

    private func fsyncDirectory(_ path: String) {
        let fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if fd >= 0 { _ = fsync(fd); close(fd) }
    }

    func logOnce(_ message: String) {
        let first = state.withLock { $0.logged.insert(message).inserted }
        if first { log(message) }
    }
}
