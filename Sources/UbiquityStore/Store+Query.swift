import Glibc
import UbiquitySystem

/// A file as a live query reports it (the container's NSMetadataQuery items).
public struct QueryItem: Sendable, Equatable {
    public enum SyncState: String, Sendable {
        /// A name that never syncs (`.nosync`, an editor's scratch file: README).
        case localOnly = "local-only"
        /// Saved here, not in the backing directory yet.
        case pending
        case uploaded
        /// Its current version came from another device.
        case remote
        /// Another device's concurrent version waits under `.conflicts/`.
        case conflict
    }

    public var path: String
    public var size: Int64
    public var mtime: Nanos
    /// When its history began (its first version), else its inode's change time.
    public var created: Nanos
    public var state: SyncState
    /// How much of it is on this device (files on demand).
    public var downloaded = DownloadState.current
}

/// Which files a query covers: `Documents/` is the documents scope, the rest data (as in
/// an iCloud container); hidden names (a component starting with `.`) only when asked.
public struct QueryFilter: Sendable {
    public enum Scope: String, Sendable, CaseIterable { case documents, data, all }
    public var scope: Scope = .all
    /// An fnmatch(3) pattern for the file's name (not its directories).
    public var name: String?
    public var includeHidden = false

    public init(scope: Scope = .all, name: String? = nil, includeHidden: Bool = false) {
        self.scope = scope
        self.name = name
        self.includeHidden = includeHidden
    }

    public static let documentsDirectory = "Documents"

    /// Whether a file at `path` matches.
    public func matches(_ path: String) -> Bool {
        let inDocuments = path.hasPrefix(Self.documentsDirectory + "/")
        switch scope {
        case .documents where !inDocuments: return false
        case .data where inDocuments: return false
        default: break
        }
        if !includeHidden && path.split(separator: "/").contains(where: { $0.hasPrefix(".") }) { return false }
        if let name {
            let base = path.split(separator: "/").last.map(String.init) ?? path
            return fnmatch(name, base, 0) == 0
        }
        return true
    }

    /// Whether anything below directory `path` can match (the documents scope needs only
    /// `Documents/`; hidden directories hold only hidden files).
    func mayMatchBelow(_ path: String) -> Bool {
        if path.isEmpty { return true }
        if scope == .documents && !(path == Self.documentsDirectory || path.hasPrefix(Self.documentsDirectory + "/")) { return false }
        if scope == .data && path == Self.documentsDirectory { return false }
        if !includeHidden && path.split(separator: "/").contains(where: { $0.hasPrefix(".") }) { return false }
        return true
    }
}

extension Store {
    /// The paths that gained a conflict version since the last call (for watchers).
    public func takeNewConflicts() -> [String] { replica.takeNewConflicts() }

    /// Pins this connection to the database as it is now (a read transaction), so a long
    /// listing sees one state while the daemon goes on writing. Use on a store opened
    /// read-only next to the daemon's, after the daemon committed its batch.
    public func beginSnapshot() throws(StoreError) {
        // A listing reads every page once: a small cache (2 MiB) is enough.
        try db.execute("PRAGMA cache_size=-2048")
        try db.execute("BEGIN")
        _ = try db.rows("SELECT count(*) FROM settings", []) { $0.int(0) } // the first read fixes the snapshot
    }

    public func endSnapshot() throws(StoreError) { try db.execute("COMMIT") }

    /// Calls `body` with every regular file that matches `filter`, directory by directory
    /// in name order (memory: the directories still to visit, not the tree). Returns how
    /// many directories it read (tests count the work).
    @discardableResult
    public func forEachQueryItem(_ filter: QueryFilter, _ body: (QueryItem) throws(StoreError) -> Void) throws(StoreError) -> Int {
        let conflicted = Set(try replica.conflictedPaths().map(NameKey.init))
        var pending: [(InodeNumber, String)] = [(Store.rootInode, "")]
        var directories = 0
        while let (dir, prefix) = pending.popLast() {
            directories += 1
            var subdirectories: [(InodeNumber, String)] = []
            try db.query("""
                SELECT e.name, i.id, i.kind, i.size, i.mtime, i.ctime, i.head, i.file_id, i.allocated, i.absent FROM entries e
                JOIN inodes i ON i.id = e.inode WHERE e.parent = ? ORDER BY e.name
                """, [.inode(dir)]) { (r) throws(StoreError) in
                let path = prefix.isEmpty ? r.text(0) : prefix + "/" + r.text(0)
                switch NodeKind(rawValue: r.int(2)) {
                case .directory:
                    if filter.mayMatchBelow(path) { subdirectories.append((r.inode(1), path)) }
                case .file:
                    guard filter.matches(path) else { return }
                    let head = r.isNull(6) ? nil : r.int(6)
                    var item = try queryItem(path: path, size: r.int(3), mtime: r.int(4), ctime: r.int(5), head: head,
                                             fileID: r.optionalFileID(7), conflicted: conflicted.contains(NameKey(path)))
                    item.downloaded = DownloadState(allocated: r.isNull(8) ? r.int(3) : r.int(8), absent: r.int(9))
                    try body(item)
                default: break
                }
            }
            // Visited in name order: the last pushed is the first popped.
            pending += subdirectories.reversed()
        }
        return directories
    }

    /// The query item of the file at `path` now, nil if it is not a regular file.
    public func queryItem(at path: String) throws(StoreError) -> QueryItem? {
        guard let (_, _, id) = locate(path), let inode = inode(id), inode.kind == .file else { return nil }
        var item = try queryItem(path: path, size: inode.size, mtime: inode.mtime, ctime: inode.ctime, head: inode.head,
                                 fileID: inode.fileID, conflicted: try replica.conflictCount(at: path) > 0)
        item.downloaded = DownloadState(allocated: inode.allocated, absent: inode.absent)
        return item
    }

    private func queryItem(path: String, size: Int64, mtime: Nanos, ctime: Nanos, head: Int64?, fileID: FileID?,
                           conflicted: Bool) throws(StoreError) -> QueryItem {
        var state = QueryItem.SyncState.pending
        if let head, let (device, uploaded, local) = try db.rows("SELECT device_id, uploaded, local FROM \(Store.versionsWithDevices) WHERE row = ?",
                                                                   [.int(head)], { ($0.deviceID(0), $0.int(1) != 0, $0.int(2) != 0) }).first {
            state = local ? .localOnly : device != deviceID ? .remote : uploaded ? .uploaded : .pending
        }
        if LocalOnly.contains(path) { state = .localOnly }
        if conflicted { state = .conflict }
        var created = ctime
        if let fileID, let first = try db.rows("SELECT min(committed) FROM versions WHERE file_id = ?", [.id(fileID)], {
            $0.isNull(0) ? nil : $0.int(0)
        }).first ?? nil {
            created = first
        }
        return QueryItem(path: path, size: size, mtime: mtime, created: created, state: state)
    }
}
