import Glibc
import UbiquitySystem

/// One save as the intent log keeps it: enough to record the version again at the next
/// open if the metadata batch that holds it never committed (the daemon was killed).
struct Intent: Equatable {
    /// Increasing per store; `settings.intent_applied` names the last one committed.
    var sequence: Int64
    /// The id the version has (replay gives it the same; one already there is skipped).
    var version: VersionID
    var path: String
    var mode: UInt32
    var uid: UInt32
    var gid: UInt32
    var mtime: Nanos
    var content: ChunkList
    /// Bytes of the content's chunks, so replay can put them again: the small chunks not
    /// committed yet (group commit of `small.sqlite`), or, for an fsync made durable by
    /// this frame alone (`Store.logDurably`), all of them.
    var chunkBytes: [ChunkID: [UInt8]] = [:]
}

/// `intent.seg` (store format 19; `intent.log` from format 7): the saves acknowledged since
/// the last commit of the metadata batch, one frame each, appended with a single write(2).
///
/// Why: a save must survive a crash of the daemon when close() returns. Committing the
/// SQLite batch at every close would do that but writes about 24 pages (96 KiB of WAL) per
/// saved file, most of the cost of creating a small file. An appended frame of a few hundred
/// bytes in the page cache survives a process crash just as well; the batch then commits
/// with the group commit (every 100 ms) and the log is emptied. Power loss is a separate
/// guarantee (fsync, the durability barrier) and the log plays no part in it.
///
/// A frame: length (4 bytes LE) of the payload, the payload, and the CRC-32C of length and
/// payload (`FrameCheck`; an `intent.log` of formats 7 to 18 has the first 8 bytes of the
/// payload's SHA-256 and is converted at open, `convertOlderLog`); a frame that is cut
/// short or does not match ends the log (a write torn by the crash). Payload: sequence
/// (8), version id (16 bytes), mtime (8), mode, uid,
/// gid (4 each), path length (4) and UTF-8 path, content length (4) and
/// `ChunkList.encoded`, count of chunks carried (4) and for each its 32-byte id, length
/// (4) and bytes.
/// Integers little-endian.
/// Not thread-safe: the store's owner serializes access (the store's lock).
final class IntentLog {
    let path: String
    private var fd: Int32 = -1
    /// Bytes appended since the log was last emptied.
    private(set) var size: Int64 = 0

    init(directory: String) {
        path = directory + "/intent.seg"
    }

    /// The log of store formats 7 to 18, SHA-256 checked: `convertOlderLog` replaces it.
    static func olderPath(_ directory: String) -> String { directory + "/intent.log" }

    deinit { if fd >= 0 { close(fd) } }

    /// The largest payload written or read: a damaged length must not make replay
    /// allocate without bound. 64 MiB holds the chunk list of a file of about 100 GiB
    /// (36 bytes per chunk of 64 KiB on average); a bigger save fails with EFBIG and the
    /// batch is committed instead (`Store.secure`).
    static let maxFrame = 64 << 20

    func append(_ intent: Intent) throws(StoreError) {
        if fd < 0 {
            fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o600)
            if fd < 0 { throw .io(errno: errno, "open \(path)") }
        }
        let payload = Self.encode(intent)
        guard payload.count <= Self.maxFrame else { throw .io(errno: EFBIG, "intent of \(payload.count) bytes") }
        let frame = Self.frame(payload)
        try StoreError.wrap { () throws(SystemError) in try writeAll(fd, frame, path: path) }
        size += Int64(frame.count)
    }

    /// A descriptor of the log for an fdatasync outside the owner's lock; the caller
    /// closes it (nil: nothing was appended by this process). A duplicate, so that
    /// `dropPrefix` may replace the log meanwhile: it makes what it keeps durable itself.
    func durableDescriptor() throws(StoreError) -> Int32? {
        guard fd >= 0 else { return nil }
        let copy = fcntl(fd, F_DUPFD_CLOEXEC, 0)
        if copy < 0 { throw .io(errno: errno, "dup \(path)") }
        return copy
    }

    /// After a durability barrier: the first `offset` bytes (the frames appended before
    /// its mark) are durable in the database and go. Frames appended during the barrier
    /// stay: the log is then replaced by a file of just those (written, fdatasynced and
    /// renamed over it, the directory fsynced), so that a log kept busy by saves that never
    /// pause still shrinks at every barrier instead of growing until the next idle moment.
    func dropPrefix(_ offset: Int64) throws(StoreError) {
        guard offset > 0 else { return }
        guard offset < size else { return clear() }
        let keep = try StoreError.wrap { () throws(SystemError) -> [UInt8] in
            let reader = open(path, O_RDONLY | O_CLOEXEC)
            if reader < 0 { throw .last("open \(path)") }
            defer { close(reader) }
            return try readBytes(reader, count: Int(size - offset), at: offset, path: path)
        }
        let temp = path + ".tmp"
        let fresh = open(temp, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0o600)
        if fresh < 0 { throw .io(errno: errno, "create \(temp)") }
        do throws(StoreError) {
            try StoreError.wrap { () throws(SystemError) in
                try writeAll(fresh, keep, path: temp)
                if fdatasync(fresh) != 0 { throw .last("fdatasync \(temp)") }
                if rename(temp, path) != 0 { throw .last("rename \(temp)") }
            }
        } catch {
            close(fresh)
            unlink(temp)
            throw error
        }
        // Renamed: the new file is the log now, whatever comes next (appends to the old,
        // unlinked one would be lost).
        if fd >= 0 { close(fd) }
        fd = fresh
        size = Int64(keep.count)
        try StoreError.wrap { () throws(SystemError) in try fsyncPath(String(path[..<path.lastIndex(of: "/")!]), directory: true) }
    }

    /// Empties the log: every intent in it is durable in the database.
    func clear() {
        guard size > 0 else { return }
        if fd >= 0 { _ = ftruncate(fd, 0) } else { _ = truncate(path, 0) }
        size = 0
    }

    /// Keeps the frames an earlier process appended (every save they hold is recorded, in
    /// the database or the operation log), so that the next barrier lets them go with
    /// this process's: `size` counts them. A torn tail is cut off first, and the cut made
    /// durable, so that frames appended now follow the last whole one (`read` stops at
    /// the first bad frame).
    func keepExisting(wholeBytes: Int64) throws(StoreError) {
        var st = stat()
        guard stat(path, &st) == 0 else { return }
        if Int64(st.st_size) > wholeBytes {
            let cut = open(path, O_WRONLY | O_CLOEXEC)
            if cut < 0 { throw .io(errno: errno, "open \(path)") }
            defer { close(cut) }
            if ftruncate(cut, off_t(wholeBytes)) != 0 || fdatasync(cut) != 0 { throw .io(errno: errno, "cut the torn tail of \(path)") }
        }
        size = wholeBytes
    }

    /// The intents in the log, up to the first frame that is damaged or cut short.
    static func read(path: String) throws(StoreError) -> [Intent] { try frames(path: path).intents }

    /// The intents in the log, up to the first frame that is damaged or cut short, and
    /// where the last whole frame ends.
    static func frames(path: String, check: FrameCheck = .crc32c) throws(StoreError) -> (intents: [Intent], end: Int64) {
        let (payloads, end) = try payloads(path: path, check: check)
        var intents: [Intent] = []
        for payload in payloads {
            guard let intent = decode(payload) else { return (intents, end) }
            intents.append(intent)
        }
        return (intents, end)
    }

    /// A frame of `payload` as this version writes it.
    static func frame(_ payload: [UInt8]) -> [UInt8] {
        let length = le(UInt32(payload.count))
        var frame = length
        frame.reserveCapacity(4 + payload.count + FrameCheck.crc32c.size)
        frame += payload
        frame += length.withUnsafeBytes { l in payload.withUnsafeBytes { p in FrameCheck.crc32c.compute(l, p) } }
        return frame
    }

    /// The whole frames' payloads, and where the last ends. Format 7 to 18 checked the
    /// payload alone; format 19 checks length and payload.
    private static func payloads(path: String, check: FrameCheck) throws(StoreError) -> (payloads: [[UInt8]], end: Int64) {
        guard let bytes = try StoreError.wrap({ () throws(SystemError) in try readFile(path, limit: 1 << 30) }) else { return ([], 0) }
        var payloads: [[UInt8]] = []
        var at = 0
        while bytes.count - at >= 4 {
            let length = Int(Self.u32(bytes, at))
            guard length <= maxFrame, bytes.count - at - 4 >= length + check.size else { break }
            let payload = Array(bytes[at + 4..<at + 4 + length])
            let computed = payload.withUnsafeBytes { p in
                check == .crc32c ? bytes[at..<at + 4].withUnsafeBytes { l in check.compute(l, p) } : check.compute(p)
            }
            guard computed.elementsEqual(bytes[at + 4 + length..<at + 4 + length + check.size]) else { break }
            payloads.append(payload)
            at += 4 + length + check.size
        }
        if at < bytes.count { log("ubiquity: \(path): \(bytes.count - at) bytes after the last whole intent ignored (cut short by the crash)") }
        return (payloads, Int64(at))
    }

    /// Store format 19: an `intent.log` an older version left (SHA-256 checked) becomes
    /// `intent.seg`, frame by frame, before anything reads or appends to the log. The copy
    /// is written, flushed and renamed into place before the old log is unlinked, so a
    /// crash at any point leaves one of them whole: an old log next to a new one is a
    /// conversion that ended before its unlink (nothing appends until it is done).
    static func convertOlderLog(directory: String) throws(StoreError) {
        let older = olderPath(directory), current = directory + "/intent.seg"
        guard access(older, F_OK) == 0 else { return }
        if access(current, F_OK) != 0 {
            let (payloads, _) = try payloads(path: older, check: .sha256)
            let temp = current + ".tmp"
            try StoreError.wrap { () throws(SystemError) in
                let fd = open(temp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
                if fd < 0 { throw .last("create \(temp)") }
                defer { close(fd) }
                try writeAll(fd, payloads.flatMap { frame($0) }, path: temp)
                if fdatasync(fd) != 0 { throw .last("fdatasync \(temp)") }
                if rename(temp, current) != 0 { throw .last("rename \(temp)") }
                try fsyncPath(directory, directory: true)
            }
            log("ubiquity: \(older): \(payloads.count) saves moved to \(current) (store format 19)")
        }
        try StoreError.wrap { () throws(SystemError) in
            if unlink(older) != 0 && errno != ENOENT { throw .last("unlink \(older)") }
            try fsyncPath(directory, directory: true)
        }
    }

    static func encode(_ i: Intent) -> [UInt8] {
        let path = Array(i.path.utf8), content = i.content.encoded
        var out = le(UInt64(bitPattern: i.sequence)) + i.version.value.bytes
        out += le(UInt64(bitPattern: i.mtime)) + le(i.mode) + le(i.uid) + le(i.gid)
        out += le(UInt32(path.count)) + path + le(UInt32(content.count)) + content
        out += le(UInt32(i.chunkBytes.count))
        for (id, bytes) in i.chunkBytes.sorted(by: { $0.key.raw.lexicographicallyPrecedes($1.key.raw) }) {
            out += id.raw + le(UInt32(bytes.count)) + bytes
        }
        return out
    }

    /// Nil for anything malformed: the bytes come from disk.
    static func decode(_ b: [UInt8]) -> Intent? {
        var at = 0
        func take(_ n: Int) -> ArraySlice<UInt8>? {
            guard n >= 0, b.count - at >= n else { return nil }
            defer { at += n }
            return b[at..<at + n]
        }
        func u32() -> UInt32? { take(4).map { IntentLog.u32(Array($0), 0) } }
        func u64() -> UInt64? { take(8).map { s in s.reversed().reduce(UInt64(0)) { $0 << 8 | UInt64($1) } } }
        guard let sequence = u64(), let version = take(16), let mtime = u64(), let mode = u32(), let uid = u32(), let gid = u32(),
              let pathLength = u32(), let pathBytes = take(Int(pathLength)),
              let contentLength = u32(), let contentBytes = take(Int(contentLength)),
              let content = ChunkList(encoded: Array(contentBytes)), let count = u32() else { return nil }
        var small: [ChunkID: [UInt8]] = [:]
        for _ in 0..<count {
            guard let raw = take(32), let id = ChunkID(raw: raw), let length = u32(),
                  length <= UInt32(ChunkStore.maxChunkSize), let bytes = take(Int(length)) else { return nil }
            small[id] = Array(bytes)
        }
        guard at == b.count, let path = String(validating: pathBytes, as: UTF8.self) else { return nil }
        return Intent(sequence: Int64(bitPattern: sequence), version: VersionID(ID128(bytes: version) ?? .zero), path: path, mode: mode, uid: uid, gid: gid,
                      mtime: Int64(bitPattern: mtime), content: content, chunkBytes: small)
    }

    private static func le<T: FixedWidthInteger>(_ v: T) -> [UInt8] { withUnsafeBytes(of: v.littleEndian) { Array($0) } }
    fileprivate static func u32(_ b: [UInt8], _ at: Int) -> UInt32 {
        UInt32(b[at]) | UInt32(b[at + 1]) << 8 | UInt32(b[at + 2]) << 16 | UInt32(b[at + 3]) << 24
    }
}
