import Dispatch
import Glibc

/// Immutable chunks as files named by their SHA-256 under `chunks/xx/` (256-way fan-out).
///
/// Contract:
/// - `put` is idempotent: a chunk that exists is not written again (same name, same bytes).
/// - A chunk file appears only complete: bytes go to a temp name, then `rename` publishes it.
/// - `put` does not fsync; `sync()` is the durability barrier for all chunks written so far
///   (an fsync of each new chunk file and its directory, or one `syncfs` when there are
///   many) and callers run it before recording a durable version that names them.
/// - `read` re-hashes every chunk it returns and throws `.corruptChunk` on a mismatch, so
///   wrong bytes are never served. Verified chunks are kept in a small cache.
public final class ChunkStore: Sendable {
    public let directory: String
    private let dirFD: Int32
    private let cache = Locked(ChunkCache(capacityBytes: 64 << 20))
    /// Chunks being read ahead, so two readers never fetch the same one twice.
    private let prefetching = Locked<Set<ChunkID>>([])
    /// Chunk files written since the last `sync()`.
    private let unsynced = Locked<Set<ChunkID>>([])

    public init(directory: String) throws(StoreError) {
        self.directory = directory
        try makeDirectory(directory)
        for i in 0..<256 { try makeDirectory(directory + "/" + hexByte(i)) }
        dirFD = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if dirFD < 0 { throw .io(errno: errno, "open \(directory)") }
    }

    deinit { close(dirFD) }

    public func path(of id: ChunkID) -> String {
        let hex = id.hex
        return "\(directory)/\(hex.prefix(2))/\(hex)"
    }

    public func contains(_ id: ChunkID) -> Bool {
        access(path(of: id), F_OK) == 0
    }

    /// Stores `bytes` (whose hash is `id`) unless the chunk is already there.
    public func put(_ id: ChunkID, _ bytes: UnsafeRawBufferPointer) throws(StoreError) {
        let final = path(of: id)
        if access(final, F_OK) == 0 { return }
        let temp = final + ".tmp.\(getpid()).\(UInt32.random(in: 0...UInt32.max))"
        let fd = open(temp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o444)
        if fd < 0 { throw .io(errno: errno, "create chunk \(temp)") }
        var written = 0
        while written < bytes.count {
            let n = write(fd, bytes.baseAddress! + written, bytes.count - written)
            if n < 0 {
                if errno == EINTR { continue }
                let code = errno
                close(fd); unlink(temp)
                throw .io(errno: code, "write chunk \(id)")
            }
            written += n
        }
        // close can report a late write error (NFS, quota): never publish such a chunk.
        if close(fd) != 0 {
            let code = errno
            unlink(temp)
            throw .io(errno: code, "write chunk \(id)")
        }
        if rename(temp, final) != 0 {
            let code = errno
            unlink(temp)
            throw .io(errno: code, "publish chunk \(id)")
        }
        unsynced.withLock { _ = $0.insert(id) }
    }

    public func put(_ id: ChunkID, _ bytes: [UInt8]) throws(StoreError) {
        try withBytes(bytes) { (raw) throws(StoreError) in try put(id, raw) }
    }

    /// The chunk's bytes, verified against its name.
    public func read(_ id: ChunkID) throws(StoreError) -> [UInt8] {
        if let hit = cache.withLock({ $0.get(id) }) { return hit }
        let bytes = try readUnverified(id)
        guard ChunkID(hashing: bytes) == id else {
            log("ubiquity: chunk \(id) is corrupt: content hash mismatch (\(path(of: id))); run `ubiquity fsck`")
            throw .corruptChunk(id)
        }
        cache.withLock { $0.put(id, bytes) }
        return bytes
    }

    /// Reads and verifies `ids` into the cache in the background. The kernel reads ahead
    /// only 128 KiB at a time, so a sequential reader otherwise waits for each chunk's
    /// disk read and hash in turn; this overlaps them with serving the current request.
    public func prefetch(_ ids: [ChunkID]) {
        let wanted = prefetching.withLock { busy -> [ChunkID] in
            let fresh = ids.filter { !busy.contains($0) }
            busy.formUnion(fresh)
            return fresh
        }
        let missing = wanted.filter { id in cache.withLock { $0.contains(id) } == false }
        prefetching.withLock { busy in for id in wanted where !missing.contains(id) { busy.remove(id) } }
        for id in missing {
            DispatchQueue.global(qos: .utility).async { [self] in
                _ = try? read(id)
                prefetching.withLock { _ = $0.remove(id) }
            }
        }
    }

    /// The raw file content, for fsck and repair; not verified.
    public func readUnverified(_ id: ChunkID) throws(StoreError) -> [UInt8] {
        let p = path(of: id)
        let fd = open(p, O_RDONLY | O_CLOEXEC)
        if fd < 0 {
            if errno == ENOENT { throw .missingChunk(id) }
            throw .io(errno: errno, "open chunk \(p)")
        }
        defer { close(fd) }
        var st = stat()
        try check(fstat(fd, &st), "stat chunk \(p)")
        var bytes = [UInt8](repeating: 0, count: Int(st.st_size))
        var done = 0
        while done < bytes.count {
            let n = bytes.withUnsafeMutableBytes { pread(fd, $0.baseAddress! + done, $0.count - done, off_t(done)) }
            if n < 0 { if errno == EINTR { continue }; throw .io(errno: errno, "read chunk \(p)") }
            if n == 0 { break }
            done += n
        }
        if done < bytes.count { bytes.removeLast(bytes.count - done) } // shrank meanwhile: hash check fails
        return bytes
    }

    /// Every chunk id present (for fsck and gc).
    public func allChunkIDs() -> [ChunkID] {
        var ids: [ChunkID] = []
        for i in 0..<256 {
            guard let dir = opendir(directory + "/" + hexByte(i)) else { continue }
            while let entry = readdir(dir) {
                let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                    String(decoding: raw.prefix(while: { $0 != 0 }), as: UTF8.self)
                }
                if let id = ChunkID(hex: name) { ids.append(id) }
            }
            closedir(dir)
        }
        return ids
    }

    public func remove(_ id: ChunkID) {
        unlink(path(of: id))
        cache.withLock { $0.remove(id) }
    }

    /// Durability barrier: every chunk written so far reaches the disk before this returns.
    /// A few new chunks are fsynced one by one (an editor's save: one or two); many (a big
    /// copy) with one syncfs of the whole filesystem, which is then cheaper.
    public func sync() throws(StoreError) {
        let pending = unsynced.withLock { s -> Set<ChunkID> in defer { s = [] }; return s }
        do throws(StoreError) {
            if pending.count > 32 {
                try check(c_syncfs(dirFD), "syncfs \(directory)")
                return
            }
            var directories: Set<String> = []
            for id in pending {
                let p = path(of: id)
                try fsyncPath(p, flags: O_RDONLY)
                directories.insert(String(p[..<p.lastIndex(of: "/")!]))
            }
            for d in directories { try fsyncPath(d, flags: O_RDONLY | O_DIRECTORY) }
        } catch {
            // Not durable yet: the next barrier must try these chunks again.
            unsynced.withLock { $0.formUnion(pending) }
            throw error
        }
    }

    private func fsyncPath(_ path: String, flags: Int32) throws(StoreError) {
        let fd = open(path, flags | O_CLOEXEC)
        if fd < 0 { throw .io(errno: errno, "open \(path) to fsync") }
        defer { close(fd) }
        try check(fsync(fd), "fsync \(path)")
    }

    public func dropCache() { cache.withLock { $0.removeAll() } }
}

/// Verified chunks kept in memory, so a sequential read hashes each chunk once and
/// small random reads do not re-hash a whole chunk each time. Two generations give an
/// approximate LRU in O(1): new entries go to `young`; when it holds half the budget it
/// becomes `old` (dropping the previous old generation); a hit in `old` moves up.
struct ChunkCache {
    let capacityBytes: Int
    private var young: [ChunkID: [UInt8]] = [:]
    private var old: [ChunkID: [UInt8]] = [:]
    private var youngBytes = 0

    init(capacityBytes: Int) { self.capacityBytes = capacityBytes }

    func contains(_ id: ChunkID) -> Bool { young[id] != nil || old[id] != nil }

    mutating func get(_ id: ChunkID) -> [UInt8]? {
        if let hit = young[id] { return hit }
        guard let hit = old.removeValue(forKey: id) else { return nil }
        put(id, hit)
        return hit
    }

    mutating func put(_ id: ChunkID, _ value: [UInt8]) {
        guard young[id] == nil else { return }
        if youngBytes + value.count > capacityBytes / 2 {
            old = young
            young = [:]
            youngBytes = 0
        }
        young[id] = value
        youngBytes += value.count
    }

    mutating func remove(_ id: ChunkID) {
        if let v = young.removeValue(forKey: id) { youngBytes -= v.count }
        old[id] = nil
    }

    mutating func removeAll() { young = [:]; old = [:]; youngBytes = 0 }
}

func hexByte(_ i: Int) -> String {
    let digits = Array("0123456789abcdef")
    return String([digits[i >> 4], digits[i & 15]])
}

func makeDirectory(_ path: String) throws(StoreError) {
    if mkdir(path, 0o755) != 0 && errno != EEXIST { throw .io(errno: errno, "mkdir \(path)") }
}

/// Log lines go to stderr (the journal under systemd, the log file in the background).
public func log(_ message: String) {
    let line = message + "\n"
    _ = line.withCString { write(STDERR_FILENO, $0, strlen($0)) }
}

/// syncfs(2) is hidden behind _GNU_SOURCE in the Glibc module; declare it directly.
@_silgen_name("syncfs") private func c_syncfs(_ fd: Int32) -> Int32

/// `withUnsafeBytes` for typed throws (the standard one rethrows `any Error`).
func withBytes<R>(_ bytes: [UInt8], _ body: (UnsafeRawBufferPointer) throws(StoreError) -> R) throws(StoreError) -> R {
    var result: Result<R, StoreError>!
    bytes.withUnsafeBytes { raw in
        do throws(StoreError) { result = .success(try body(raw)) } catch { result = .failure(error) }
    }
    return try result.get()
}
