import Glibc
import Synchronization
import UbiquitySystem

/// A frame's place in the operation log: numbers start at 1 and grow by one per frame,
/// with no gap, across segments and across mounts.
public struct LogSequence: Comparable, Hashable, Sendable, CustomStringConvertible {
    public let value: UInt64
    public init(_ value: UInt64) { self.value = value }
    public static let none = LogSequence(0)
    public var next: LogSequence { LogSequence(value &+ 1) }
    public static func < (a: LogSequence, b: LogSequence) -> Bool { a.value < b.value }
    public var description: String { String(value) }
}

/// The namespace engine's write-ahead log (`STORE/oplog/`). A namespace change appends one
/// frame (a single write(2)) and is acknowledged; a folder applies frames to the durable
/// index in the background and, once the index holds them durably, tells the log, which
/// deletes the segments that hold only folded frames. At the next open the index's fold
/// mark says where replay starts: every frame after it is applied again, in order.
///
/// Why segments: a folded prefix goes by unlinking whole files, never by rewriting the
/// log, so a log that is never idle still shrinks, and what is deleted was written long
/// enough ago to be durable on its own.
///
/// Segment files are named by the sequence of their first frame (16 hex digits) and an
/// extension that says how their frames are checked (`FrameCheck`): `.seg` is written,
/// `.log` (store formats 15 to 18) is still read. A frame is `length` (u32, payload
/// bytes), `sequence` (u64), the payload, then `check`: the CRC-32C of length and payload
/// (4 bytes; `.log`: the first 8 bytes of their SHA-256), computed before the lock is
/// taken; the sequence is checked by being the next one. Integers are little-endian.
/// A `.log` segment is never appended to: the first append after opening a store of an
/// older format starts a `.seg` one.
///
/// Recovery: frames are read in sequence order across segments, and the first frame that
/// is cut short, fails its check, names a sequence other than the next, or claims more than
/// `maxPayload` bytes ends the log (a write torn by a crash, or damage). Opening for writes
/// cuts everything after it off, so a new frame never follows garbage.
///
/// Durability: a frame is in the page cache when `append` returns, so it survives a crash
/// of the daemon; `sync` (fdatasync of every segment written since the last one, and of
/// the directory when a segment was made) makes it survive a power loss, and runs outside
/// the log's lock so appends go on meanwhile.
///
/// Thread-safe: one lock (`state`) guards the open segment and the next sequence; it is
/// held for one write(2) at most, never for a flush or an unlink. `sync` has a lock of
/// its own, so syncs queue behind each other and never in front of an append.
public final class OperationLog: Sendable {
    /// The largest payload written or read: a damaged length must not make recovery
    /// allocate without bound. 64 MiB holds the chunk list of a save of about 100 GiB.
    public static let maxPayload = 64 << 20
    /// A segment is closed and a new one begun past this size (and only between frames).
    public static let defaultSegmentBytes: Int64 = 8 << 20
    static let headerBytes = 12

    /// A segment's file extension says how its frames are checked: `.seg` CRC-32C (store
    /// format 19 on), `.log` SHA-256 (formats 15 to 18, read only).
    static func fileExtension(_ check: FrameCheck) -> String { check == .crc32c ? ".seg" : ".log" }

    public let directory: String
    let segmentBytes: Int64

    /// The segment appended to: always a `.seg` one.
    private struct Segment {
        let first: LogSequence
        var fd: Int32
        var size: Int64
    }

    private struct State {
        /// Segments in sequence order; the last is the one appended to.
        var segments: [(first: LogSequence, path: String)] = []
        var open: Segment?
        var next = LogSequence(1)
        /// Descriptors (duplicates) of segments closed since the last sync: synced then closed.
        var unsynced: [Int32] = []
        /// A segment file was made since the last sync: the directory needs an fsync too.
        var directoryDirty = false
        /// The highest sequence that has reached the disk (`sync`).
        var synced = LogSequence.none
        /// A write failed and its partial frame could not be cut off: no more appends.
        var failed: String?
    }

    private let state: Mutex<State>
    /// Held by `sync` across its flush (never by `append`): syncs one at a time.
    private let syncing = Mutex(())

    /// Opens the log for appends, recovering it first: frames after `after` are handed to
    /// `replay` in order (the caller applies them to its state), everything after the last
    /// whole frame is cut off, and segments that hold only frames up to `after` are
    /// deleted. A log that ends before `after` (the index holds frames the log lost to a
    /// power loss) starts again right after it.
    ///
    /// Segments after the end of the log (after a torn frame, or after a segment that is
    /// not there) are set aside as `NAME.dropped-TIME`, never read again and never deleted:
    /// after a power loss they hold only frames that were never synced, so dropping them
    /// is what the machine's crash did; anything else (damage) leaves them for a person.
    public init(directory: String, after: LogSequence, segmentBytes: Int64 = OperationLog.defaultSegmentBytes,
                replay: (LogSequence, ArraySlice<UInt8>) throws(StoreError) -> Void) throws(StoreError) {
        self.directory = directory
        self.segmentBytes = max(segmentBytes, 4096)
        try StoreError.wrap { () throws(SystemError) in try makeDirectories(directory, mode: 0o700) }

        // Read and decide first; delete, cut and replay only once the log is known good.
        var found = try Self.segmentFiles(directory)
        var doomed: [String] = [], aside: [String] = []
        // Segments that begin before the one holding frame `after + 1` hold only folded
        // frames (one deleted earlier may be back after a power loss): unread, they go.
        if let start = found.lastIndex(where: { $0.first <= after.next }), start > 0 {
            doomed += found[..<start].map(\.path)
            found.removeFirst(start)
        }
        var kept: [(first: LogSequence, path: String, kind: FrameCheck, end: Int64, size: Int64)] = []
        var frames: [(LogSequence, ArraySlice<UInt8>)] = []
        var expected: LogSequence? = nil // the sequence the next frame must have
        var broken = false
        for segment in found {
            if broken {
                // After the end of the log: nothing here can be trusted or followed.
                aside.append(segment.path)
                continue
            }
            if segment.first != (expected ?? min(segment.first, after.next)) {
                // The segment holding the next frame is not there: the log ends before it.
                log("ubiquity: \(segment.path): starts at frame \(segment.first), expected \(expected ?? after.next): it and what follows are set aside")
                aside.append(segment.path)
                broken = true
                continue
            }
            // A segment holds at most `segmentBytes` and one more frame; a bigger file is
            // not one this log wrote, and is refused (EFBIG) before anything is allocated.
            let limit = Int(self.segmentBytes) + Self.maxPayload + Self.headerBytes + segment.kind.size
            let bytes = try StoreError.wrap { () throws(SystemError) in try readFile(segment.path, limit: limit) } ?? []
            var at = 0, sequence = segment.first
            // A folded frame is only walked over: its rows are in the index already.
            while let frame = Self.frame(in: bytes, at: at, sequence: sequence, kind: segment.kind, verify: sequence > after) {
                if sequence > after { frames.append((sequence, frame.payload)) }
                at = frame.end
                sequence = sequence.next
            }
            if at < bytes.count {
                log("ubiquity: \(segment.path): \(bytes.count - at) bytes after frame \(sequence.value &- 1) are not a whole frame (cut short by a crash): dropped")
                broken = true
            }
            kept.append((segment.first, segment.path, segment.kind, Int64(at), Int64(bytes.count)))
            expected = sequence
        }
        var next = expected ?? after.next
        if next <= after {
            // Every frame left is folded, and the index is further: start after its mark.
            doomed += kept.map(\.path)
            kept = []
            next = after.next
        }
        // A kept segment whose frames are all folded, followed by another, goes too.
        while kept.count > 1, kept[1].first.value &- 1 <= after.value { doomed.append(kept.removeFirst().path) }

        var s = State()
        s.next = next
        s.synced = after
        // Segments the last process made may never have had their names flushed.
        s.directoryDirty = true
        for path in doomed { unlink(path) }
        let stamp = nowNanos()
        for path in aside where rename(path, path + ".dropped-\(stamp)") != 0 {
            throw .io(errno: errno, "set \(path) aside")
        }
        doomed += aside
        if let last = kept.last {
            let fd = open(last.path, O_WRONLY | O_APPEND | O_CLOEXEC)
            if fd < 0 { throw .io(errno: errno, "open \(last.path)") }
            if last.end < last.size {
                // Cut a torn tail off, so the next frame follows the last whole one; the cut
                // reaches the disk before any new frame can.
                if ftruncate(fd, off_t(last.end)) != 0 || fdatasync(fd) != 0 {
                    let code = errno
                    close(fd)
                    throw .io(errno: code, "cut the torn tail of \(last.path)")
                }
            }
            if last.kind == .crc32c {
                s.open = Segment(first: last.first, fd: fd, size: last.end)
            } else {
                // Frames of one segment share one check: the next append starts a `.seg`.
                s.unsynced.append(fd)
            }
        }
        if !doomed.isEmpty {
            // Deleted segments must stay deleted: one coming back after a power loss could
            // hold old frames under the numbers new frames will get.
            do throws(SystemError) { try fsyncPath(directory, directory: true) } catch {
                if let open = s.open { close(open.fd) }
                throw .io(errno: error.code, error.context)
            }
        }
        // Recovered frames may be in the page cache only (a crash of the daemon, not of the
        // machine): the first sync flushes every kept segment.
        for segment in kept.dropLast() {
            let fd = open(segment.path, O_RDONLY | O_CLOEXEC)
            if fd >= 0 { s.unsynced.append(fd) }
        }
        s.segments = kept.map { ($0.first, $0.path) }
        state = Mutex(s)
        for (sequence, payload) in frames { try replay(sequence, payload) }
    }

    deinit {
        state.withLock { s in
            if let open = s.open { close(open.fd) }
            for fd in s.unsynced { close(fd) }
        }
    }

    /// The sequence the next frame gets.
    public var nextSequence: LogSequence { state.withLock { $0.next } }

    /// The highest sequence known to be on the disk.
    public var syncedThrough: LogSequence { state.withLock { $0.synced } }

    /// The segments' first sequences, oldest first (tests, status).
    public var segmentStarts: [LogSequence] { state.withLock { $0.segments.map(\.first) } }

    /// Appends one frame with a single write(2) and returns its sequence. A failed write
    /// leaves the log as it was: the part of the frame that reached the file is cut off
    /// again; if even that fails, the log refuses every later append (a frame after
    /// garbage would be lost at the next open, with every frame after it).
    public func append(_ payload: [UInt8]) throws(StoreError) -> LogSequence {
        guard payload.count <= Self.maxPayload else { throw .io(errno: EFBIG, "an operation of \(payload.count) bytes") }
        var frame = Self.encode(payload)
        return try state.withLock { (s) throws(StoreError) -> LogSequence in
            if let failed = s.failed { throw .io(errno: EIO, "the operation log \(directory) failed earlier: \(failed)") }
            let sequence = s.next
            Self.stamp(&frame, sequence) // in place: the frame is not copied under the lock
            if s.open == nil || s.open!.size >= segmentBytes { try startSegment(&s, at: sequence) }
            do throws(SystemError) {
                try writeAll(s.open!.fd, frame, path: directory)
            } catch {
                if ftruncate(s.open!.fd, off_t(s.open!.size)) != 0 { s.failed = "\(error); cutting the partial frame off: \(errnoText(errno))" }
                throw .io(errno: error.code, "append to the operation log: \(error.context)")
            }
            s.open!.size += Int64(frame.count)
            s.next = sequence.next
            return sequence
        }
    }

    /// Makes every frame appended so far durable (fdatasync of the segments written since
    /// the last sync, fsync of the directory when a segment was made), outside the state's
    /// lock, so appends go on meanwhile; syncs run one at a time (`syncing`), so one that
    /// returns covers everything appended before it began. A failed flush fails the log:
    /// the kernel may have dropped the pages it could not write, and a later flush that
    /// succeeds would not bring them back.
    @discardableResult
    public func sync() throws(StoreError) -> LogSequence {
        try syncing.withLock { (_) throws(StoreError) -> LogSequence in
            let (through, fds, directoryDirty) = try state.withLock { (s) throws(StoreError) -> (LogSequence, [Int32], Bool) in
                if let failed = s.failed { throw .io(errno: EIO, "the operation log \(directory) failed earlier: \(failed)") }
                var fds: [Int32] = []
                if let open = s.open {
                    let copy = fcntl(open.fd, F_DUPFD_CLOEXEC, 0)
                    if copy < 0 { throw .io(errno: errno, "dup a segment of \(directory)") }
                    fds.append(copy)
                }
                fds += s.unsynced
                s.unsynced = []
                defer { s.directoryDirty = false }
                return (LogSequence(s.next.value &- 1), fds, s.directoryDirty)
            }
            var failure: StoreError?
            for fd in fds {
                if failure == nil, fdatasync(fd) != 0 { failure = .io(errno: errno, "fdatasync a segment of \(directory)") }
                close(fd)
            }
            if failure == nil, directoryDirty {
                do throws(SystemError) { try fsyncPath(directory, directory: true) } catch { failure = .io(errno: error.code, error.context) }
            }
            if let failure {
                state.withLock { $0.failed = "\(failure)" }
                throw failure
            }
            state.withLock { $0.synced = max($0.synced, through) }
            return through
        }
    }

    /// The index holds every frame through `sequence` durably: segments holding only such
    /// frames go (never the one appended to). Call it only after the index's fold is on
    /// the disk: a power loss must not leave the index behind a deleted segment.
    public func dropFolded(through sequence: LogSequence) {
        let doomed = state.withLock { s -> [String] in
            var doomed: [String] = []
            // A segment ends where the next begins; the open one is never dropped.
            while s.segments.count > 1, s.segments[1].first.value &- 1 <= sequence.value {
                doomed.append(s.segments.removeFirst().path)
            }
            return doomed
        }
        for path in doomed { unlink(path) }
    }

    // MARK: segments

    private func startSegment(_ s: inout State, at first: LogSequence) throws(StoreError) {
        closeSegment(&s)
        let path = Self.segmentPath(directory, first)
        let fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0o600)
        if fd < 0 { throw .io(errno: errno, "create \(path)") }
        s.open = Segment(first: first, fd: fd, size: 0)
        s.segments.append((first, path))
        s.directoryDirty = true
    }

    /// Closes the open segment; its frames stay for the next sync to flush.
    private func closeSegment(_ s: inout State) {
        guard let open = s.open else { return }
        s.open = nil
        s.unsynced.append(open.fd)
    }

    static func segmentPath(_ directory: String, _ first: LogSequence, kind: FrameCheck = .crc32c) -> String {
        let hex = String(first.value, radix: 16)
        return directory + "/" + String(repeating: "0", count: 16 - hex.count) + hex + fileExtension(kind)
    }

    /// The segment files in `directory`, in sequence order; other names are left alone.
    /// Two files for one sequence (a `.log` and a `.seg`) cannot both be the log: refused.
    static func segmentFiles(_ directory: String) throws(StoreError) -> [(first: LogSequence, path: String, kind: FrameCheck)] {
        let names = try StoreError.wrap { () throws(SystemError) in try directoryEntries(directory) }
        let found = names.compactMap { name -> (first: LogSequence, path: String, kind: FrameCheck)? in
            guard name.utf8.count == 20, let kind = FrameCheck.allCases.first(where: { name.hasSuffix(fileExtension($0)) }),
                  let value = UInt64(name.prefix(16), radix: 16), value > 0 else { return nil }
            return (LogSequence(value), directory + "/" + name, kind)
        }.sorted { $0.first < $1.first }
        for (a, b) in zip(found, found.dropFirst()) where a.first == b.first {
            throw .database("\(directory) has two segments that begin at frame \(a.first) (\(a.path), \(b.path)): not a log this ubiquity wrote")
        }
        return found
    }

    // MARK: frames

    /// A frame of `payload` with sequence 0 (`stamp` numbers it).
    static func encode(_ payload: [UInt8], kind: FrameCheck = .crc32c) -> [UInt8] {
        var frame = [UInt8]()
        frame.reserveCapacity(headerBytes + payload.count + kind.size)
        append(UInt32(payload.count), to: &frame)
        append(UInt64(0), to: &frame)
        frame += payload
        frame += check(frame[0..<4], payload[...], kind: kind)
        return frame
    }

    /// Numbers an encoded frame: the only part of a frame made under the lock.
    static func stamp(_ frame: inout [UInt8], _ sequence: LogSequence) {
        withUnsafeBytes(of: sequence.value.littleEndian) { frame.replaceSubrange(4..<12, with: $0) }
    }

    /// Hashed where the bytes are: the append (a request's path) and the replay at open
    /// copy nothing for it.
    static func check(_ length: ArraySlice<UInt8>, _ payload: ArraySlice<UInt8>, kind: FrameCheck) -> [UInt8] {
        length.withUnsafeBytes { l in payload.withUnsafeBytes { p in kind.compute(l, p) } }
    }

    /// The frame at `at` if it is whole, checks out (unless not `verify`) and has
    /// `sequence`; nil ends the log.
    static func frame(in bytes: [UInt8], at: Int, sequence: LogSequence, kind: FrameCheck = .crc32c,
                      verify: Bool = true) -> (payload: ArraySlice<UInt8>, end: Int)? {
        let checkBytes = kind.size
        guard bytes.count - at >= headerBytes + checkBytes else { return nil }
        let length = Int(read(UInt32.self, bytes, at))
        guard length <= maxPayload, bytes.count - at - headerBytes - checkBytes >= length else { return nil }
        guard read(UInt64.self, bytes, at + 4) == sequence.value else { return nil }
        let body = at + headerBytes + length
        let payload = bytes[at + headerBytes..<body]
        guard !verify || check(bytes[at..<at + 4], payload, kind: kind).elementsEqual(bytes[body..<body + checkBytes]) else { return nil }
        return (payload, body + checkBytes)
    }

    private static func append<T: FixedWidthInteger>(_ value: T, to out: inout [UInt8]) {
        withUnsafeBytes(of: value.littleEndian) { out += $0 }
    }

    private static func read<T: FixedWidthInteger>(_: T.Type, _ bytes: [UInt8], _ at: Int) -> T {
        var value: T = 0
        for i in 0..<MemoryLayout<T>.size { value |= T(bytes[at + i]) << (8 * i) }
        return value
    }
}
