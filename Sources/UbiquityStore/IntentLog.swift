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
/// The file is written ahead in zeros (`growStep` at a time) and frames overwrite them, so
/// the fdatasync of an fsync flushes the frame's blocks only: an append that grows the file
/// makes ext4 flush its inode too (`scripts/bench/log-flush.c` measures both). Emptied,
/// the log starts again at offset 0 over what it held.
/// So a reader stops at the first frame whose sequence is not above the one before (what
/// follows is an earlier round's), and replay skips what `intent_applied` covers.
///
/// A frame: length (4 bytes LE) of the payload, the payload, and the CRC-32C of length and
/// payload (`FrameCheck`; an `intent.log` of formats 7 to 18 has the first 8 bytes of the
/// payload's SHA-256 and is converted at open, `convertOlderLog`); a frame that is cut
/// short or does not match ends the log (a write torn by the crash, or the zeros written
/// ahead). Payload: sequence
/// (8), version id (16 bytes), mtime (8), mode, uid,
/// gid (4 each), path length (4) and UTF-8 path, content length (4) and
/// `ChunkList.encoded`, count of chunks carried (4) and for each its 32-byte id, length
/// (4) and bytes.
/// Integers little-endian.
/// Not thread-safe: the store's owner serializes access (the store's lock).
final class IntentLog {
    let path: String
    private var fd: Int32 = -1
    /// Bytes of frames since the log was last emptied: where the next frame goes.
    private(set) var size: Int64 = 0
    /// Bytes of the file written (frames, or zeros ahead of them).
    private var written: Int64 = 0

    /// How far ahead of the frames the file is written in zeros, and the most an emptied
    /// log keeps written (a burst of big fsynced frames must not leave a big file behind).
    static let growStep: Int64 = 1 << 20
    static let keptWhenEmptied: Int64 = 4 << 20

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
            fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0o600)
            if fd < 0 { throw .io(errno: errno, "open \(path)") }
            var st = stat()
            written = fstat(fd, &st) == 0 ? max(size, Int64(st.st_size)) : size
        }
        let payload = Self.encode(intent)
        guard payload.count <= Self.maxFrame else { throw .io(errno: EFBIG, "intent of \(payload.count) bytes") }
        let frame = Self.frame(payload)
        let end = size + Int64(frame.count)
        try StoreError.wrap { () throws(SystemError) in
            if end > written {
                // Zeros first: a frame written past them would leave a hole if they failed.
                let target = (end / Self.growStep + 1) * Self.growStep
                let zeros = [UInt8](repeating: 0, count: Int(target - written))
                try writeAll(fd, zeros, at: written, path: path)
                written = target
            }
            try writeAll(fd, frame, at: size, path: path)
        }
        size = end
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
        let fresh = open(temp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
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
        written = size
        try StoreError.wrap { () throws(SystemError) in try fsyncPath(String(path[..<path.lastIndex(of: "/")!]), directory: true) }
    }

    /// Empties the log: every intent in it is durable in the database. The file stays
    /// written (up to `keptWhenEmptied`); a zero length at offset 0 ends it for a reader,
    /// and the next frames overwrite it from there. Neither needs a flush: a crash may
    /// bring the old frames back, and replay skips them (`intent_applied`).
    func clear() {
        guard size > 0 else { return }
        if fd >= 0 && written <= Self.keptWhenEmptied {
            var zero: UInt32 = 0
            if pwrite(fd, &zero, 4, 0) != 4 { _ = ftruncate(fd, 0); written = 0 }
        } else if fd >= 0 {
            _ = ftruncate(fd, 0)
            written = 0
        } else {
            _ = truncate(path, 0)
        }
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
        var intents: [Intent] = [], end: Int64 = 0
        for (payload, frameEnd) in try payloads(path: path, check: check) {
            // A frame no later than the one before is an earlier round's (`clear`).
            guard let intent = decode(payload), intents.last.map({ intent.sequence > $0.sequence }) != false else { break }
            intents.append(intent)
            end = frameEnd
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

    /// The whole frames' payloads, each with where it ends. Format 7 to 18 checked the
    /// payload alone; format 19 checks length and payload.
    private static func payloads(path: String, check: FrameCheck) throws(StoreError) -> [(payload: [UInt8], end: Int64)] {
        guard let bytes = try StoreError.wrap({ () throws(SystemError) in try readFile(path, limit: 1 << 30) }) else { return [] }
        var payloads: [(payload: [UInt8], end: Int64)] = []
        var at = 0
        while bytes.count - at >= 4 {
            let length = Int(Self.u32(bytes, at))
            guard length <= maxFrame, bytes.count - at - 4 >= length + check.size else { break }
            let payload = Array(bytes[at + 4..<at + 4 + length])
            let computed = payload.withUnsafeBytes { p in
                check == .crc32c ? bytes[at..<at + 4].withUnsafeBytes { l in check.compute(l, p) } : check.compute(p)
            }
            guard computed.elementsEqual(bytes[at + 4 + length..<at + 4 + length + check.size]) else { break }
            at += 4 + length + check.size
            payloads.append((payload, Int64(at)))
        }
        return payloads
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
            let payloads = try payloads(path: older, check: .sha256).map(\.payload)
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
