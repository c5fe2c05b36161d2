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
    private let state = Locked(State())
    private let cycleLock = Locked(())
    /// Journal offsets read so far, by device (mirrors the store's sync_peers).
    private let offsets = Locked<[String: Int64]?>(nil)
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
        // Local changes first, then other devices' records a slice at a time.
        var first = true
        while true {
            var incoming: [SyncRecord] = []
            var newOffsets: [String: Int64] = [:]
            var more = false
            if pushPull && problem == nil {
                do { (incoming, newOffsets, more) = try pull(limit: options.pullSlice) } catch { problem = error }
            }
            let local = first
            try access.withStore { (store, busy) throws(StoreError) -> TreeChanges in
                if local { try store.recordLocalChanges(busy: busy) }
                if !incoming.isEmpty { try store.addRemote(incoming) }
                for (device, offset) in newOffsets { try store.setPeerOffset(device, offset) }
                let changes = try store.reconcile(busy: busy)
                conflicts = try store.totalConflicts()
                return changes
            }
            offsets.withLock { known in for (d, o) in newOffsets { known?[d] = o } }
            first = false
            if !more { break }
        }
        if pushPull && problem == nil {
            do { try push() } catch { problem = error }
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
    private func knownOffsets(_ devices: [String]) throws(StoreError) -> [String: Int64] {
        var known = offsets.withLock { $0 ?? [:] }
        let unknown = devices.filter { known[$0] == nil }
        if !unknown.isEmpty {
            try access.withStore { (store, _) throws(StoreError) -> TreeChanges in
                for device in unknown { known[device] = try store.peerOffset(device) }
                return TreeChanges()
            }
            offsets.withLock { $0 = known }
        }
        return known
    }

    /// New complete records of other devices, in journal order, with their chunks in the
    /// local chunk store; how far each journal was consumed; and whether more records may
    /// wait (it stops after `limit` records, at the end of a line).
    private func pull(limit: Int) throws(StoreError) -> ([SyncRecord], [String: Int64], Bool) {
        let (devices, ignored) = try backing.peers()
        for name in ignored { logOnce("ubiquity: sync: ignoring devices/\(RecordCodec.printable(name)) in the backing directory (not a device id)") }
        let known = try knownOffsets(devices)
        var records: [SyncRecord] = []
        var consumed: [String: Int64] = [:]
        var more = false
        devices: for device in devices {
            var offset = known[device] ?? 0
            // The journal is read in windows, so memory stays bounded however large a
            // (possibly hostile) journal grows; a window without a newline is widened up to
            // Backing.maxLine, and a longer "line" is skipped in pieces that never parse.
            var window = Backing.journalWindow
            reading: while true {
                let read: [UInt8]?
                do { read = try backing.journal(of: device, from: offset, limit: window) } catch {
                    // One unreadable journal (junk where a device's directory should be) must
                    // not stop the others.
                    logOnce("ubiquity: sync: cannot read the journal of device \(device): \(error)")
                    break reading
                }
                guard let bytes = read, !bytes.isEmpty else { break reading }
                var start = 0
                var waiting = false
                journal: while let newline = bytes[start...].firstIndex(of: UInt8(ascii: "\n")) {
                    let at = offset + Int64(start)
                    switch RecordCodec.decode(bytes[start..<newline], journalDevice: device) {
                    case .failure(let why):
                        logOnce("ubiquity: sync: skipping line at byte \(at) of devices/\(device)/journal: \(why)")
                    case .success(let record):
                        switch fetchChunks(of: record) {
                        case .ready: records.append(record)
                        case .malformed(let why):
                            logOnce("ubiquity: sync: skipping record \(record.id) of devices/\(device)/journal: \(why)")
                        case .waiting(let why):
                            logOnce("ubiquity: sync: record \(record.id) of devices/\(device)/journal waits: \(why)")
                            waiting = true
                            break journal
                        }
                    }
                    start = newline + 1
                    if records.count >= limit { more = true; break journal }
                }
                let full = bytes.count == window
                if start == 0 && full {
                    if window < Backing.maxLine { window = min(window * 4, Backing.maxLine); continue reading }
                    logOnce("ubiquity: sync: skipping \(window) bytes at byte \(offset) of devices/\(device)/journal: a line longer than \(Backing.maxLine) bytes")
                    start = bytes.count
                }
                offset += Int64(start)
                if start > 0 { consumed[device] = offset }
                if more { break devices }
                if waiting || !full { break reading }
                window = Backing.journalWindow
            }
        }
        return (records, consumed, more)
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
            var directories: Set<String> = []
            for i in batch.indices {
                for (id, size) in batch[i].chunks.chunks where batch[i].inline[id] == nil {
                    if size <= RecordCodec.maxInline {
                        batch[i].inline[id] = try chunks.read(id) // travels in the record
                    } else if !backing.hasObject(id) {
                        try backing.putObject(id, try chunks.read(id))
                        directories.insert(String(id.hex.prefix(2)))
                    }
                }
            }
            // The objects' names must be durable before a record names them.
            for dir in directories { fsyncDirectory(backing.directory + "/objects/" + dir) }
            try backing.append(batch.map(RecordCodec.encode))
            let ids = batch.map(\.id)
            try access.withStore { (store, _) throws(StoreError) -> TreeChanges in
                try store.markUploaded(ids)
                return TreeChanges()
            }
            if batch.count < options.uploadBatch { return }
        }
    }

    private func fsyncDirectory(_ path: String) {
        let fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if fd >= 0 { _ = fsync(fd); close(fd) }
    }

    private func logOnce(_ message: String) {
        let first = state.withLock { $0.logged.insert(message).inserted }
        if first { log(message) }
    }
}
