import Glibc
import UbiquityStore
import UbiquitySystem

/// The backing directory on disk (docs/FORMAT.md): objects by hash, one journal per
/// device. Only plain file operations, so any shared directory works. Every failure is a
/// `StoreError.io` naming the file; the engine treats it as "offline" and retries.
struct Backing {
    /// Format 2 adds holes to file records (`hole:<length>` chunk items, docs/FORMAT.md);
    /// format 3 carries chunks of up to 1 KiB inside their records (`inline`). A device
    /// upgrades an older directory when it first opens it, so devices still on an older
    /// format stop with "upgrade ubiquity" instead of waiting forever for objects that
    /// are never written, or skipping records they cannot read.
    static let formatVersion = 3
    static var formatLine: String { "ubiquity-backing \(formatVersion)\n" }

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
            if version < Self.formatVersion {
                try writeAtomically(directory + "/FORMAT", Array(Self.formatLine.utf8))
                log("ubiquity: sync: upgraded the backing directory \(directory) from format \(version) to \(Self.formatVersion); devices running an older ubiquity must upgrade to sync")
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
            if Hex.isLowercase(name, count: 16) { devices.append(name) } else { ignored.append(name) }
        }
        return (devices.sorted(), ignored.sorted())
    }

    /// How much of a journal one read loads, and the longest line a reader accepts (a
    /// file's record lists its chunks: 256 MiB of line is a file of about 200 GiB).
    static let journalWindow = 4 << 20
    static let maxLine = 256 << 20

    /// Up to `limit` bytes of `device`'s journal from `offset` (nil: no journal yet).
    func journal(of device: String, from offset: Int64, limit: Int) throws(StoreError) -> [UInt8]? {
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
        let count = Int(min(size - offset, Int64(limit)))
        return try io { () throws(SystemError) in try readBytes(fd, count: count, at: offset, path: path) }
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
        try io { () throws(SystemError) in try writeAll(fd, bytes, path: path) }
        guard fsync(fd) == 0 else { throw .io(errno: errno, "fsync \(path)") }
    }

    // MARK: files

    /// The largest file this reads whole from the shared directory (FORMAT, objects): a
    /// chunk is at most 4 MiB, so anything larger is damage and is not loaded.
    static let maxFileSize = 8 << 20

    private func readFile(_ path: String) throws(StoreError) -> [UInt8]? {
        try io { () throws(SystemError) in try UbiquitySystem.readFile(path, limit: Self.maxFileSize) }
    }

    private func writeAtomically(_ path: String, _ bytes: [UInt8]) throws(StoreError) {
        try io { () throws(SystemError) in try writeFileAtomically(path, bytes, tempPrefix: ".tmp-\(deviceID)-") }
    }

    private func makeDir(_ path: String) throws(StoreError) {
        try io { () throws(SystemError) in try makeDirectory(path) }
    }

    private func list(_ path: String) throws(StoreError) -> [String] {
        try io { () throws(SystemError) in try directoryEntries(path) }
    }

    private func io<T>(_ body: () throws(SystemError) -> T) throws(StoreError) -> T {
        do { return try body() } catch { throw .io(errno: error.code, error.context) }
    }
}
