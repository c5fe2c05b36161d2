import Glibc
import UbiquityStore

/// The hidden views at the container root: `.versions/` and `.conflicts/`. Their inode
/// numbers live in a reserved range, as JuiceFS keeps its internal nodes apart, so they
/// never collide with the store's inodes.
///
///     .versions/                 mirrors the directories that contain histories
///     .versions/<path>/          for a file's path: one entry per version
///     .versions/<path>/<name>    the version's content, read-only
///     .conflicts/<path>/<name>   an unresolved conflict version of the file at <path>;
///                                rm discards it, mv onto <path> takes it (FileSystem+Sync)
struct VirtualViews {
    /// What the views read: versions and histories, conflicts, and the root, whose owner
    /// and time every view node shows. `.versions/` reads through `versions` (the
    /// versions' reader, or the store under its lock); `.conflicts/` is the synced view's,
    /// read from the store under its lock (`conflicts`, nil when the caller does not hold
    /// it: `readsSyncedView` says which requests need it).
    struct Source {
        let versions: any VersionReads
        let conflicts: (any FSConflicts)?
        let root: Inode
        let chunks: ChunkStore
        let stagingDirectory: String

        /// The store under its lock, for every view.
        init(store: any FileSystemStore, root: Inode) {
            self.init(versions: store, conflicts: store, root: root, chunks: store.chunks, stagingDirectory: store.stagingDirectory)
        }

        init(versions: any VersionReads, conflicts: (any FSConflicts)?, root: Inode, chunks: ChunkStore, stagingDirectory: String) {
            self.versions = versions
            self.conflicts = conflicts
            self.root = root
            self.chunks = chunks
            self.stagingDirectory = stagingDirectory
        }

        func conflictStore() throws(Errno) -> any FSConflicts {
            // `readsSyncedView` sent the request to the store's lock, in the same hold.
            guard let conflicts else { throw .io }
            return conflicts
        }
    }

    static let base = InodeNumber(rawValue: 1 << 56)
    static let versionsRoot = base
    static let conflictsRoot = base.advanced(by: 1)
    static let rootNames: Set<String> = [".versions", ".conflicts", KeyValueDoor.name]

    static func isVirtual(_ ino: InodeNumber) -> Bool { ino >= base }

    enum Node: Hashable {
        /// A directory of .versions/ mirroring `path` ("" is .versions itself).
        case directory(path: String)
        /// The list of versions of the file(s) last seen at `path`.
        case history(path: String)
        /// One version's content (`tinypix`: shown as a grid, like the file itself). Under
        /// .conflicts/ (`conflict`) it is a node of its own: those entries come and go
        /// (rm, mv), while one under .versions/ never changes, so the kernel may cache it.
        case version(row: Int64, size: Int64, time: Nanos, tinypix: Bool, conflict: Bool)
        /// A directory of .conflicts/ mirroring `path`.
        case conflictDirectory(path: String)
        /// The conflict versions of the file at `path`.
        case conflictList(path: String)
    }

    /// base + 2 is `.kv` (KeyValueDoor); numbers below base + 16 are kept for such roots.
    private var nodes = NodeNumbering<Node>(first: base.advanced(by: 16), permanent: [
        versionsRoot: .directory(path: ""), conflictsRoot: .conflictDirectory(path: ""),
    ])
    /// Nodes only listed (never referenced) are dropped once there are this many.
    static let unreferencedLimit = 10_000

    mutating func referenced(_ ino: InodeNumber) { nodes.referenced(ino) }

    mutating func forget(_ ino: InodeNumber, count: UInt64) { nodes.forget(ino, count: count) }

    mutating func pruneUnreferenced(pinned: () -> Set<InodeNumber>) {
        nodes.pruneUnreferenced(limit: Self.unreferencedLimit, pinned: pinned)
    }

    var nodeCount: Int { nodes.count }

    /// Whether a request on `ino` (a listing, or a lookup in it) reads the synced view
    /// (`.conflicts/`), and so needs the store's lock.
    func readsSyncedView(_ ino: InodeNumber) -> Bool {
        switch nodes.key(ino) {
        case .conflictDirectory, .conflictList: return true
        default: return false
        }
    }

    private mutating func number(_ node: Node) -> InodeNumber { nodes.number(node) }

    // MARK: listing

    /// The control entries a listing of the root shows. Like ZFS's `.zfs`, `.versions` is
    /// left out unless asked for (`find`, `du`, `rsync -a`, backups and indexers then see
    /// the live tree only; it works when named); `.conflicts` is listed only while it holds
    /// something, so its presence is the signal.
    mutating func rootEntries(store: any FileSystemStore, root: Inode, showVersions: Bool) throws(Errno) -> [DirectoryEntry] {
        var entries: [DirectoryEntry] = []
        if showVersions { entries.append(DirectoryEntry(name: ".versions", attributes: try attributes(Self.versionsRoot, root: root))) }
        if try storeCall({ () throws(StoreError) in try store.totalConflicts() }) > 0 {
            entries.append(DirectoryEntry(name: ".conflicts", attributes: try attributes(Self.conflictsRoot, root: root)))
        }
        return entries
    }

    mutating func entries(_ ino: InodeNumber, from source: Source) throws(Errno) -> [DirectoryEntry] {
        guard let node = nodes.key(ino) else { throw .notFound }
        var result: [DirectoryEntry] = []
        switch node {
        case .directory(let path):
            for (name, isHistory) in try storeCall({ () throws(StoreError) in try source.versions.historyChildren(of: path) }) {
                let child = path.isEmpty ? name : path + "/" + name
                let n = number(isHistory ? .history(path: child) : .directory(path: child))
                result.append(DirectoryEntry(name: name, attributes: try attributes(n, root: source.root)))
            }
        case .history(let path):
            result = try versionEntries(try versions(at: path, from: source), path: path, conflict: false, root: source.root)
        case .conflictDirectory(let path):
            let store = try source.conflictStore()
            for (name, isLeaf) in Self.children(of: path, among: try storeCall { () throws(StoreError) in try store.conflictedPaths() }) {
                let child = path.isEmpty ? name : path + "/" + name
                let n = number(isLeaf ? .conflictList(path: child) : .conflictDirectory(path: child))
                result.append(DirectoryEntry(name: name, attributes: try attributes(n, root: source.root)))
            }
        case .conflictList(let path):
            result = try versionEntries(try conflicts(at: path, store: try source.conflictStore()), path: path, conflict: true, root: source.root)
        case .version:
            throw .notDirectory
        }
        return result
    }

    /// The names directly below `path` among `keys` (conflicted paths), and whether each is
    /// itself a key (a file's entry) rather than only a directory on the way to one.
    private static func children(of path: String, among keys: [String]) -> [(String, Bool)] {
        var names: [String: Bool] = [:]
        let prefix = path.isEmpty ? "" : path + "/"
        for key in keys where key.hasPrefix(prefix) {
            let rest = key.dropFirst(prefix.count)
            if let slash = rest.firstIndex(of: "/") {
                names[String(rest[..<slash]), default: false] = names[String(rest[..<slash])] ?? false
            } else {
                names[String(rest)] = true
            }
        }
        return names.sorted { $0.key < $1.key }.map { ($0.key, $0.value) }
    }

    private mutating func versionEntries(_ list: [(String, Version)], path: String, conflict: Bool, root: Inode) throws(Errno) -> [DirectoryEntry] {
        let tinypix = TinyPixView.applies(to: path)
        var result: [DirectoryEntry] = []
        for (name, version) in list {
            let size = tinypix ? TinyPixView.viewSize(storedSize: version.size) : version.size
            let n = number(.version(row: version.row, size: size, time: version.committed, tinypix: tinypix, conflict: conflict))
            result.append(DirectoryEntry(name: name, attributes: try attributes(n, root: root)))
        }
        return result
    }

    /// The conflict version `name` in the conflict list `parent`, with the file's path.
    mutating func conflictVersion(parent: InodeNumber, name: String, store: any FileSystemStore) throws(Errno) -> (String, Version)? {
        guard case .conflictList(let path) = nodes.key(parent) else { return nil }
        guard let (_, version) = try conflicts(at: path, store: store).first(where: { $0.0.utf8.elementsEqual(name.utf8) }) else {
            throw .notFound
        }
        return (path, version)
    }

    mutating func lookup(parent: InodeNumber, name: String, from source: Source) throws(Errno) -> Attributes {
        if parent == Store.rootInode {
            return try attributes(name == ".versions" ? Self.versionsRoot : Self.conflictsRoot, root: source.root)
        }
        switch nodes.key(parent) {
        case .directory(let path):
            // One indexed row, not a listing: `ls -la` of a big history directory does a
            // lookup per entry.
            guard let isHistory = try storeCall({ () throws(StoreError) in try source.versions.historyChild(of: path, name: name) }) else {
                throw .notFound
            }
            let child = path.isEmpty ? name : path + "/" + name
            // Numbered before the call: `attributes(number(...))` would read the numbering
            // as it was before `number` added the node.
            let n = number(isHistory ? .history(path: child) : .directory(path: child))
            return try attributes(n, root: source.root)
        case .history(let path):
            // Only the versions committed in the millisecond the name gives (index range).
            var window: ClosedRange<Nanos> = .min ... .max
            if let millis = VersionName.millisecond(of: name), millis > Nanos.min / 1_000_000 + 1, millis < Nanos.max / 1_000_000 - 1 {
                window = millis * 1_000_000...(millis * 1_000_000 + 999_999)
            }
            let candidates = try versionEntries(try versions(at: path, committed: window, from: source), path: path, conflict: false,
                                                root: source.root)
            guard let entry = candidates.first(where: { $0.name.utf8.elementsEqual(name.utf8) }) else { throw .notFound }
            return entry.attributes
        default:
            guard let entry = try entries(parent, from: source).first(where: { $0.name.utf8.elementsEqual(name.utf8) }) else { throw .notFound }
            return entry.attributes
        }
    }

    /// A view node's attributes: its owner and time are the root's.
    func attributes(_ ino: InodeNumber, root: Inode) throws(Errno) -> Attributes {
        guard let node = nodes.key(ino) else { throw .notFound }
        switch node {
        case .directory, .history, .conflictDirectory, .conflictList:
            return Attributes(virtual: ino, directory: true, size: 0, time: root.mtime, uid: root.uid, gid: root.gid)
        case .version(_, let size, let time, _, let conflict):
            var a = Attributes(virtual: ino, directory: false, size: size, time: time, uid: root.uid, gid: root.gid)
            a.immutable = !conflict
            return a
        }
    }

    /// A version's content for reading.
    func content(_ ino: InodeNumber, from source: Source) throws(Errno) -> FileContent {
        guard case .version(let row, _, _, let tinypix, _) = nodes.key(ino) else { throw nodes.key(ino) == nil ? .notFound : .isDirectory }
        let list = try storeCall { () throws(StoreError) -> ChunkList in
            let stored = try source.versions.chunkList(row: row)
            return tinypix ? try TinyPixView.view(of: stored, chunks: source.chunks) : stored
        }
        return FileContent(base: list, chunks: source.chunks, stagingDirectory: source.stagingDirectory)
    }

    /// The conflict versions of the file at `path`, oldest first, with their names.
    private func conflicts(at path: String, store: any FSConflicts) throws(Errno) -> [(String, Version)] {
        var all = try storeCall { () throws(StoreError) in try store.conflicts(at: path) }
        all.sort { ($0.committed, $0.id) < ($1.committed, $1.id) }
        return Array(zip(VersionName.names(all, extension: VersionName.fileExtension(path)), all))
    }

    /// The versions shown at `path` (committed in `window`), oldest first, with their names.
    private func versions(at path: String, committed window: ClosedRange<Nanos> = .min ... .max, from source: Source) throws(Errno) -> [(String, Version)] {
        var all: [Version] = []
        for id in try storeCall({ () throws(StoreError) in try source.versions.histories(at: path) }) {
            all += try storeCall { () throws(StoreError) in try source.versions.versions(of: id, committed: window) }
        }
        all.sort { ($0.committed, $0.id) < ($1.committed, $1.id) }
        return Array(zip(VersionName.names(all, extension: VersionName.fileExtension(path)), all))
    }
}
