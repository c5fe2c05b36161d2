import Glibc
import UbiquitySystem

/// A backing store in a directory every device can open: a local folder, NFS/SMB, sshfs,
/// a USB disk. Key `a/b/c` is the file `<root>/a/b/c`. Objects are written to a temp name
/// (`.tmp-…`, never listed) and fsynced, then renamed into place (`link` when the key must
/// be absent) and the directory fsynced: atomic and durable, as the protocol asks.
public struct DirectoryStore: BackingStore {
    public let root: String
    /// The largest object `get` reads whole (a range may be read from any object): a
    /// larger file in a shared directory is damage, not something to load.
    public let maxObjectSize: Int64
    static let tempPrefix = ".tmp-"
    /// The names of the directories listed, kept between LISTs where inotify sees every
    /// change (shared by the copies of this value).
    let listings: DirectoryListings

    /// `root` relative to the working directory is made absolute here (the helpers below
    /// build absolute paths).
    public init(root: String, maxObjectSize: Int64 = 1 << 30) {
        var absolute = root
        if !root.hasPrefix("/") {
            var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
            if getcwd(&buffer, buffer.count) != nil {
                absolute = String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self) + "/" + root
            }
        }
        self.root = absolute.count > 1 && absolute.hasSuffix("/") ? String(absolute.dropLast()) : absolute
        self.maxObjectSize = maxObjectSize
        listings = DirectoryListings()
    }

    public var location: String { root }

    func path(_ key: BackingKey) -> String { root + "/" + key.path }

    public func put(_ key: BackingKey, _ bytes: [UInt8], ifAbsent: Bool) throws(BackingError) {
        let path = path(key)
        let name = key.path.split(separator: "/").last!
        guard !name.hasPrefix(Self.tempPrefix) else { throw .permanent("\(path): keys may not start with \(Self.tempPrefix)") }
        try checkRoot()
        let directory = String(path[..<path.lastIndex(of: "/")!])
        do {
            try makeDirectories(directory)
            try writeFileAtomically(path, bytes, tempPrefix: Self.tempPrefix, noReplace: ifAbsent, durable: true)
        } catch {
            throw error.code == EEXIST && ifAbsent ? .exists(key.path) : Self.classify(error)
        }
    }

    public func get(_ key: BackingKey, range: Range<Int64>?) throws(BackingError) -> [UInt8] {
        let path = path(key)
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        if fd < 0 { throw try missing(key, errno: errno, "open \(path)") }
        defer { close(fd) }
        var st = Glibc.stat()
        guard fstat(fd, &st) == 0 else { throw Self.classify(.last("stat \(path)")) }
        guard st.st_mode & S_IFMT == S_IFREG else { throw .notFound(key.path) }
        let size = Int64(st.st_size)
        let want = range.map { max(0, min($0.lowerBound, size))..<max(0, min($0.upperBound, size)) } ?? 0..<size
        guard want.upperBound - want.lowerBound <= maxObjectSize else {
            throw .garbage("\(path) is \(size) bytes, more than the \(maxObjectSize) an object may have")
        }
        do {
            return try readBytes(fd, count: Int(want.upperBound - want.lowerBound), at: want.lowerBound, path: path)
        } catch {
            throw Self.classify(error)
        }
    }

    public func stat(_ key: BackingKey) throws(BackingError) -> ObjectInfo? {
        var st = Glibc.stat()
        let path = path(key)
        guard statPath(path, &st) == 0 else {
            let code = errno
            if code == ENOENT || code == ENOTDIR {
                try checkRoot()
                return nil
            }
            throw Self.classify(SystemError(code, "stat \(path)"))
        }
        guard st.st_mode & S_IFMT == S_IFREG else { return nil }
        return ObjectInfo(key: key, size: Int64(st.st_size))
    }

    public func delete(_ key: BackingKey) throws(BackingError) {
        let path = path(key)
        if unlink(path) != 0 {
            let code = errno
            if code == ENOENT || code == ENOTDIR { return try checkRoot() }
            throw Self.classify(SystemError(code, "delete \(path)"))
        }
    }

    /// A depth-first walk in key order: siblings sort by name, a directory's name counting
    /// as `name/` (so `a-b` comes before `a/x`, as bytes compare), and subtrees entirely
    /// before `after` or outside `prefix` are not entered. A page costs the directories on
    /// its way, not the whole tree.
    public func list(prefix: String, after: BackingKey?, limit: Int) throws(BackingError) -> ObjectListing {
        try checkRoot()
        var found: [ObjectInfo] = []
        let want = max(1, min(limit, 1 << 20))
        try walk(directory: "", prefix: prefix, after: after?.path, into: &found, want: want + 1)
        let more = found.count > want
        return ObjectListing(objects: Array(found.prefix(want)), more: more)
    }

    /// What a name in a directory could be, judged from the name alone: a file key that
    /// may be listed, a directory that may hold keys to list. Only these are looked at
    /// (lstat) and sorted, so a LIST after a cursor costs the names after it, not every
    /// entry of the directory (the log's idle poll lists a few of its thousands).
    struct Candidate: Equatable {
        let name: String
        let asFile: Bool
        let asDirectory: Bool
    }

    static func candidates(_ names: [String], directory: String, prefix: String, after: String?) -> [Candidate] {
        var result: [Candidate] = []
        for name in names where !name.hasPrefix(tempPrefix) {
            let fileKey = directory + name
            let directoryKey = fileKey + "/"
            let asFile = fileKey.hasPrefix(prefix) && (after.map { $0.utf8.lexicographicallyPrecedes(fileKey.utf8) } ?? true)
            // Enter only where keys can match the prefix and some may come after `after`:
            // every key below starts with `directoryKey`, so all of them sort before
            // `after` when `directoryKey` does and `after` is not below it.
            let asDirectory = (directoryKey.hasPrefix(prefix) || prefix.hasPrefix(directoryKey))
                && (after.map { $0.hasPrefix(directoryKey) || !directoryKey.utf8.lexicographicallyPrecedes($0.utf8) } ?? true)
            if asFile || asDirectory { result.append(Candidate(name: name, asFile: asFile, asDirectory: asDirectory)) }
        }
        return result
    }

    /// Of `names` in byte order, those that `candidates` may keep for a LIST after `after`:
    /// every name from `after`'s own (its part below `directory`) on, and the names before
    /// it that are prefixes of it (a directory `x` holds keys after `x/y`, and sorts before
    /// it). Any other name before it differs from it at a byte that is smaller, so neither
    /// the name nor a key below it comes after `after`. The log's poll then costs the
    /// segments after the cursor, not all of a day's.
    static func mayFollow(_ names: [String], directory: String, after: String?) -> [String] {
        guard let after, after.utf8.starts(with: directory.utf8) else { return names }
        let own = Array(after.utf8.dropFirst(directory.utf8.count))
        let from = DirectoryListings.firstNotBefore(own, in: names)
        var result: [String] = []
        for length in 1..<max(1, own.count) {
            let i = DirectoryListings.firstNotBefore(own[..<length], in: names)
            if i < from && names[i].utf8.elementsEqual(own[..<length]) { result.append(names[i]) }
        }
        return result + names[from...]
    }

    private func walk(directory: String, prefix: String, after: String?, into found: inout [ObjectInfo], want: Int) throws(BackingError) {
        let full = directory.isEmpty ? root : root + "/" + directory.dropLast()
        let listed: (names: [String], sorted: Bool)
        do { listed = try listings.names(full) } catch {
            if error.code == ENOENT || error.code == ENOTDIR { return }
            throw Self.classify(error)
        }
        let names = listed.sorted ? Self.mayFollow(listed.names, directory: directory, after: after) : listed.names
        var entries: [(sortKey: String, size: Int64?)] = [] // size nil: a directory
        for candidate in Self.candidates(names, directory: directory, prefix: prefix, after: after) {
            var st = Glibc.stat()
            guard lstat(full + "/" + candidate.name, &st) == 0 else { continue } // gone meanwhile
            let kind = st.st_mode & S_IFMT
            if kind == S_IFDIR && candidate.asDirectory {
                entries.append((candidate.name + "/", nil))
            } else if kind == S_IFREG && candidate.asFile {
                entries.append((candidate.name, Int64(st.st_size)))
            }
        }
        entries.sort { $0.sortKey.utf8.lexicographicallyPrecedes($1.sortKey.utf8) }
        for entry in entries {
            if found.count >= want { return }
            let key = directory + entry.sortKey
            if let size = entry.size {
                guard let bk = BackingKey(key) else { continue }
                found.append(ObjectInfo(key: bk, size: size))
            } else {
                try walk(directory: key, prefix: prefix, after: after, into: &found, want: want)
            }
        }
    }

    /// The root itself missing is the store being offline (an unmounted disk or share),
    /// not an object missing.
    private func checkRoot() throws(BackingError) {
        var st = Glibc.stat()
        guard statPath(root, &st) == 0, st.st_mode & S_IFMT == S_IFDIR else {
            throw .transient("the backing directory \(root) is not there (an unmounted disk or network share?)")
        }
    }

    private func missing(_ key: BackingKey, errno code: Int32, _ context: String) throws(BackingError) -> BackingError {
        if code == ENOENT || code == ENOTDIR {
            try checkRoot()
            return .notFound(key.path)
        }
        return Self.classify(SystemError(code, context))
    }

    /// errno to the protocol's kinds: what a person must fix is permanent; what may pass
    /// (a network filesystem's hiccup, a full disk someone cleans) is transient.
    static func classify(_ error: SystemError) -> BackingError {
        switch error.code {
        case EACCES, EPERM, EROFS, ENOTDIR, EISDIR, ENAMETOOLONG, EINVAL, ELOOP:
            return .permanent("\(error)")
        case ENOENT:
            return .notFound("\(error)")
        default: // EIO, ESTALE, ENOTCONN, ETIMEDOUT, ENOSPC, EDQUOT, EAGAIN, ...
            return .transient("\(error)")
        }
    }
}

/// stat(2) by path (inside `DirectoryStore`, `stat` names the protocol's method).
private func statPath(_ path: String, _ st: inout stat) -> Int32 { stat(path, &st) }
