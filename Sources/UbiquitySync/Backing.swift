import Glibc
import UbiquityStore
import UbiquitySystem

/// The backing directory on disk (docs/FORMAT.md): objects by hash, one journal per
/// device. Only plain file operations, so any shared directory works. Every failure is a
/// `StoreError.io` naming the file; the engine treats it as "offline" and retries.
struct Backing {
    /// Format 2 adds holes to file records (`hole:<length>` chunk items, docs/FORMAT.md);
    /// format 3 carries chunks of up to 1 KiB inside their records (`inline`); format 4
    /// collects the directory: devices rewrite their journals (generations) and unused
    /// objects go through fossils. A device upgrades an older directory when it first
    /// opens it, so devices still on an older format stop with "upgrade ubiquity" instead
    /// of waiting forever for objects that are never written, skipping records they
    /// cannot read, or reading a journal that is no longer written.
    static let formatVersion = 4
    static var formatLine: String { "ubiquity-backing \(formatVersion)\n" }

    let directory: String
    let deviceID: String

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

    /// The object's bytes if present (or a fossil: see BackingCollector) and matching its
    /// hash; nil if missing.
    func object(_ id: ChunkID) throws(StoreError) -> [UInt8]? {
        var found = try readFile(objectPath(id))
        if found == nil, let fossil = try fossil(of: id) { found = try readFile(fossil) }
        guard let bytes = found else { return nil }
        guard ChunkID(hashing: bytes) == id else { throw .corruptChunk(id) }
        return bytes
    }

    static let fossilMark = ".fossil-"

    /// The path of a fossil of the object, if there is one (its directory is listed: only
    /// for objects found missing, which is rare).
    func fossil(of id: ChunkID) throws(StoreError) -> String? {
        let hex = id.hex
        let dir = "\(directory)/objects/\(hex.prefix(2))"
        let prefix = hex + Self.fossilMark
        let names: [String]
        do { names = try directoryEntries(dir) } catch { return nil }
        return names.first { $0.hasPrefix(prefix) }.map { dir + "/" + $0 }
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

    /// Generation 0 is `journal`, generation n `journal.<n>` (format 4).
    static func journalName(_ generation: Int64) -> String { generation == 0 ? "journal" : "journal.\(generation)" }

    static func generation(ofJournal name: String) -> Int64? {
        if name == "journal" { return 0 }
        guard name.hasPrefix("journal."), case let digits = name.dropFirst("journal.".count),
              !digits.isEmpty, digits.count <= 18, digits.first != "0", digits.allSatisfy({ $0.isASCII && $0.isNumber }) else { return nil }
        return Int64(digits)
    }

    func journalPath(of device: String, generation: Int64) -> String {
        "\(directory)/devices/\(device)/\(Self.journalName(generation))"
    }

    /// The generations of `device`'s journal present, lowest first: the last is current
    /// (older ones are left only by a device that stopped while rewriting its journal).
    func generations(of device: String) throws(StoreError) -> [Int64] {
        let names: [String]
        do { names = try directoryEntries("\(directory)/devices/\(device)") } catch {
            if error.code == ENOENT { return [] }
            throw .io(errno: error.code, error.context)
        }
        return names.compactMap(Self.generation(ofJournal:)).sorted()
    }

    /// Up to `limit` bytes of a journal from `offset` (nil: no such journal).
    func journal(of device: String, generation: Int64, from offset: Int64, limit: Int) throws(StoreError) -> [UInt8]? {
        let path = journalPath(of: device, generation: generation)
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

    /// Complete lines of a journal from `offset`, read in one window: memory stays bounded
    /// however large a (possibly hostile) journal grows. A window without a newline is
    /// widened up to `maxLine`; a longer "line" is returned as `skipped` bytes, which never
    /// parse. `end`: the offset after the last line (or the skipped bytes); `atEnd`: the
    /// journal holds nothing after it but an incomplete line.
    struct Lines {
        var lines: [(start: Int64, bytes: ArraySlice<UInt8>)] = []
        var end: Int64
        var atEnd: Bool
        var skipped = 0
    }

    func lines(of device: String, generation: Int64, from offset: Int64) throws(StoreError) -> Lines? {
        var window = Self.journalWindow
        while true {
            guard let bytes = try journal(of: device, generation: generation, from: offset, limit: window) else { return nil }
            let full = bytes.count == window
            var result = Lines(end: offset, atEnd: !full)
            var start = 0
            while let newline = bytes[start...].firstIndex(of: UInt8(ascii: "\n")) {
                result.lines.append((offset + Int64(start), bytes[start..<newline]))
                start = newline + 1
            }
            if start == 0 && full {
                if window < Self.maxLine { window = min(window * 4, Self.maxLine); continue }
                result.skipped = bytes.count
                start = bytes.count
            }
            result.end = offset + Int64(start)
            return result
        }
    }

    /// Appends lines to this device's journal and makes them durable. A journal left
    /// ending mid-line by a crash gets its `\n` first, so the fragment stays one
    /// malformed line that readers skip.
    func append(_ lines: [String]) throws(StoreError) {
        let path = journalPath(of: deviceID, generation: try generations(of: deviceID).last ?? 0)
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

    /// Rewrites this device's journal as generation `generation` (a checkpoint): `write`
    /// is given a function that adds lines; the new journal is made durable under a temp
    /// name and renamed into place, then older generations are deleted. Returns its size.
    func rewriteJournal(generation: Int64, _ write: (_ add: ([String]) throws(StoreError) -> Void) throws(StoreError) -> Void) throws(StoreError) -> Int64 {
        let dir = "\(directory)/devices/\(deviceID)"
        let temp = "\(dir)/.tmp-\(Self.journalName(generation))"
        let fd = Glibc.open(temp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
        if fd < 0 { throw .io(errno: errno, "open \(temp)") }
        var size: Int64 = 0
        do throws(StoreError) {
            defer { close(fd) }
            try write { (lines) throws(StoreError) in
                var bytes: [UInt8] = []
                for line in lines { bytes += Array(line.utf8) }
                try io { () throws(SystemError) in try writeAll(fd, bytes, path: temp) }
                size += Int64(bytes.count)
            }
            guard fsync(fd) == 0 else { throw .io(errno: errno, "fsync \(temp)") }
        } catch {
            unlink(temp)
            throw error
        }
        let path = journalPath(of: deviceID, generation: generation)
        guard rename(temp, path) == 0 else { let e = errno; unlink(temp); throw .io(errno: e, "rename \(temp)") }
        try io { () throws(SystemError) in try fsyncPath(dir, directory: true) }
        for old in try generations(of: deviceID) where old < generation {
            let oldPath = journalPath(of: deviceID, generation: old)
            if unlink(oldPath) != 0 && errno != ENOENT { throw .io(errno: errno, "unlink \(oldPath)") }
        }
        return size
    }

    // MARK: files

    /// The largest file this reads whole from the shared directory (FORMAT, objects): a
    /// chunk is at most 4 MiB, so anything larger is damage and is not loaded.
    static let maxFileSize = 8 << 20

    func readFile(_ path: String) throws(StoreError) -> [UInt8]? {
        try io { () throws(SystemError) in try UbiquitySystem.readFile(path, limit: Self.maxFileSize) }
    }

    private func writeAtomically(_ path: String, _ bytes: [UInt8]) throws(StoreError) {
        try io { () throws(SystemError) in try writeFileAtomically(path, bytes, tempPrefix: ".tmp-\(deviceID)-") }
    }

    private func makeDir(_ path: String) throws(StoreError) {
        try io { () throws(SystemError) in try makeDirectory(path) }
    }

    func list(_ path: String) throws(StoreError) -> [String] {
        try io { () throws(SystemError) in try directoryEntries(path) }
    }

    func io<T>(_ body: () throws(SystemError) -> T) throws(StoreError) -> T {
        do { return try body() } catch { throw .io(errno: error.code, error.context) }
    }
}
