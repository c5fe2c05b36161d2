import Glibc
import UbiquityStore

/// The backing directory on disk (docs/FORMAT.md): objects by hash, one journal per
/// device. Only plain file operations, so any shared directory works. Every failure is a
/// `StoreError.io` naming the file; the engine treats it as "offline" and retries.
struct Backing {
    static let formatLine = "ubiquity-backing 1\n"
    static let formatVersion = 1

    let directory: String
    let deviceID: String

    var journalPath: String { "\(directory)/devices/\(deviceID)/journal" }

    /// Checks the directory is there and in a format this program understands; writes
    /// FORMAT into an empty one.
    func open() throws(StoreError) {
        var st = stat()
        guard stat(directory, &st) == 0, st.st_mode & S_IFMT == S_IFDIR else {
            throw .io(errno: ENOENT, "the backing directory \(directory) is not there (unmounted disk or network share?)")
        }
        if let text = try readFile(directory + "/FORMAT") {
            let line = String(decoding: text, as: UTF8.self)
            guard line.hasPrefix("ubiquity-backing "),
                  let version = Int(line.dropFirst("ubiquity-backing ".count).prefix { $0.isNumber }) else {
                throw .unsupportedFormat("\(directory)/FORMAT does not name a ubiquity backing format")
            }
            if version > Self.formatVersion {
                throw .unsupportedFormat("the backing directory \(directory) has format \(version); this ubiquity understands up to \(Self.formatVersion): upgrade ubiquity")
            }
        } else {
            try writeAtomically(directory + "/FORMAT", Array(Self.formatLine.utf8))
        }
        for sub in ["objects", "devices", "devices/\(deviceID)"] { try makeDir(directory + "/" + sub) }
    }

    // MARK: objects

    func objectPath(_ id: ChunkID) -> String {
        let hex = id.hex
        return "\(directory)/objects/\(hex.prefix(2))/\(hex)"
    }

    func hasObject(_ id: ChunkID) -> Bool { access(objectPath(id), F_OK) == 0 }

    func putObject(_ id: ChunkID, _ bytes: [UInt8]) throws(StoreError) {
        let hex = id.hex
        try makeDir("\(directory)/objects/\(hex.prefix(2))")
        try writeAtomically(objectPath(id), bytes)
    }

    /// The object's bytes if present and matching its hash; nil if missing.
    func object(_ id: ChunkID) throws(StoreError) -> [UInt8]? {
        guard let bytes = try readFile(objectPath(id)) else { return nil }
        guard ChunkID(hashing: bytes) == id else { throw .corruptChunk(id) }
        return bytes
    }

    // MARK: journals

    /// Other devices' ids (directories under devices/ with a valid name); the names of
    /// anything else there, to log.
    func peers() throws(StoreError) -> (devices: [String], ignored: [String]) {
        var devices: [String] = [], ignored: [String] = []
        for name in try list(directory + "/devices") where name != deviceID {
            if RecordCodec.isHex(name, count: 16) { devices.append(name) } else { ignored.append(name) }
        }
        return (devices.sorted(), ignored.sorted())
    }

    /// Bytes of `device`'s journal from `offset` to its end (nil: no journal yet).
    func journal(of device: String, from offset: Int64) throws(StoreError) -> [UInt8]? {
        let path = "\(directory)/devices/\(device)/journal"
        let fd = Glibc.open(path, O_RDONLY | O_CLOEXEC)
        if fd < 0 {
            if errno == ENOENT { return nil }
            throw .io(errno: errno, "open \(path)")
        }
        defer { close(fd) }
        var st = stat()
        guard fstat(fd, &st) == 0 else { throw .io(errno: errno, "stat \(path)") }
        let size = Int64(st.st_size)
        if size <= offset { return [] }
        var out = [UInt8](repeating: 0, count: Int(size - offset))
        var done = 0
        while done < out.count {
            let n = out.withUnsafeMutableBytes { pread(fd, $0.baseAddress! + done, $0.count - done, off_t(offset) + off_t(done)) }
            if n < 0 { if errno == EINTR { continue }; throw .io(errno: errno, "read \(path)") }
            if n == 0 { break }
            done += n
        }
        return Array(out.prefix(done))
    }

    /// Appends lines to this device's journal and makes them durable. A journal left
    /// ending mid-line by a crash gets its `\n` first, so the fragment stays one
    /// malformed line that readers skip.
    func append(_ lines: [String]) throws(StoreError) {
        let path = journalPath
        let fd = Glibc.open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0o644)
        if fd < 0 { throw .io(errno: errno, "open \(path)") }
        defer { close(fd) }
        var st = stat()
        guard fstat(fd, &st) == 0 else { throw .io(errno: errno, "stat \(path)") }
        var bytes: [UInt8] = []
        if st.st_size > 0 {
            var last: UInt8 = 0
            if pread(fd, &last, 1, off_t(st.st_size - 1)) == 1, last != UInt8(ascii: "\n") { bytes.append(UInt8(ascii: "\n")) }
        }
        for line in lines { bytes += Array(line.utf8) }
        try writeAll(fd, bytes, path: path)
        guard fsync(fd) == 0 else { throw .io(errno: errno, "fsync \(path)") }
    }

    // MARK: files

    private func readFile(_ path: String) throws(StoreError) -> [UInt8]? {
        let fd = Glibc.open(path, O_RDONLY | O_CLOEXEC)
        if fd < 0 {
            if errno == ENOENT { return nil }
            throw .io(errno: errno, "open \(path)")
        }
        defer { close(fd) }
        var out: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 1 << 16)
        while true {
            let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress!, $0.count) }
            if n < 0 { if errno == EINTR { continue }; throw .io(errno: errno, "read \(path)") }
            if n == 0 { return out }
            out += buffer[0..<n]
        }
    }

    /// Temp name, write, fsync, rename: a reader sees the whole file or none.
    private func writeAtomically(_ path: String, _ bytes: [UInt8]) throws(StoreError) {
        let slash = path.lastIndex(of: "/")!
        let tempPath = "\(path[..<slash])/.tmp-\(deviceID)-\(randomHex(bytes: 6))"
        let fd = Glibc.open(tempPath, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o644)
        if fd < 0 { throw .io(errno: errno, "create \(tempPath)") }
        do throws(StoreError) {
            try writeAll(fd, bytes, path: tempPath)
            guard fsync(fd) == 0 else { throw .io(errno: errno, "fsync \(tempPath)") }
        } catch {
            close(fd)
            unlink(tempPath)
            throw error
        }
        close(fd)
        guard rename(tempPath, path) == 0 else {
            let code = errno
            unlink(tempPath)
            throw .io(errno: code, "rename \(tempPath)")
        }
    }

    private func writeAll(_ fd: Int32, _ bytes: [UInt8], path: String) throws(StoreError) {
        var done = 0
        while done < bytes.count {
            let n = bytes.withUnsafeBytes { write(fd, $0.baseAddress! + done, $0.count - done) }
            if n < 0 { if errno == EINTR { continue }; throw .io(errno: errno, "write \(path)") }
            done += n
        }
    }

    private func makeDir(_ path: String) throws(StoreError) {
        if mkdir(path, 0o755) != 0 && errno != EEXIST { throw .io(errno: errno, "mkdir \(path)") }
    }

    private func list(_ path: String) throws(StoreError) -> [String] {
        guard let dir = opendir(path) else { throw .io(errno: errno, "list \(path)") }
        defer { closedir(dir) }
        var names: [String] = []
        while let entry = readdir(dir) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix(while: { $0 != 0 }), as: UTF8.self) }
            if name != "." && name != ".." { names.append(name) }
        }
        return names
    }
}
