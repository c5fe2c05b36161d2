/// User extended attributes (`user.*`), stored with the inode. Not versioned. With the
/// overlay on, a set or a removal is a tree change (`TreeChange.xattr`): a frame of the
/// operation log, SQLite at the fold. Reads take the overlay's values over SQLite's rows,
/// which they read around the gate (and not at all for an inode made or dropped here).
extension Store {
    public func xattr(_ id: InodeNumber, _ name: String) throws(StoreError) -> [UInt8]? {
        if let known = tree.withLock({ $0.inodes.xattrs(id) }) { return known[name] }
        let here = overlay.xattrs(of: id)
        if let value = here.changed[name] { return value }
        if here.cleared { return nil }
        return try db.aroundGate { () throws(StoreError) in
            try db.rows("SELECT value FROM xattrs WHERE inode = ? AND name = ?", [.inode(id), .text(name)]) { $0.blob(0) }.first
        }
    }

    public func xattrNames(_ id: InodeNumber) throws(StoreError) -> [String] {
        try xattrs(of: id).map(\.name)
    }

    /// The inode's user xattrs by full name, in byte order of their names.
    /// The working set's entry of the inode keeps them once read (`InodeCache`).
    private func xattrs(of id: InodeNumber) throws(StoreError) -> [(name: String, value: [UInt8])] {
        var all: [String: [UInt8]]
        if let known = tree.withLock({ $0.inodes.xattrs(id) }) {
            all = known
        } else {
            let here = overlay.xattrs(of: id)
            all = [:]
            if !here.cleared {
                try db.aroundGate { () throws(StoreError) in
                    try db.query("SELECT name, value FROM xattrs WHERE inode = ?", [.inode(id)]) { all[$0.text(0)] = $0.blob(1) }
                }
            }
            for (name, value) in here.changed { all[name] = value }
            let read = all
            tree.withLock { $0.inodes.knowXattrs(id, read) }
        }
        return all.sorted { $0.key.utf8.lexicographicallyPrecedes($1.key.utf8) }.map { (name: $0.key, value: $0.value) }
    }

    /// The inode's user xattrs as a record carries them (names without `user.`).
    func currentXattrs(_ id: InodeNumber) throws(StoreError) -> [XattrEntry] {
        try xattrs(of: id).map { XattrEntry(name: String($0.name.dropFirst(5)), value: $0.value) }
    }

    public func setXattr(_ id: InodeNumber, _ name: String, _ value: [UInt8]) throws(StoreError) {
        try record(.xattr(id, name: name, value: value))
        try changed.insert(id)
    }

    /// Returns whether the attribute existed.
    public func removeXattr(_ id: InodeNumber, _ name: String) throws(StoreError) -> Bool {
        guard try xattr(id, name) != nil else { return false }
        try record(.xattr(id, name: name, value: nil))
        try changed.insert(id)
        return true
    }

    /// Another device's version shown on inode `id`: its xattrs replace the inode's.
    func dropXattrs(_ id: InodeNumber) throws(StoreError) {
        for name in try xattrNames(id) { try record(.xattr(id, name: name, value: nil)) }
    }

    /// A history that no live file shows at `path` (its file was deleted or renamed to a
    /// local-only name): a new file there continues it. Returns it with its newest version.
    /// Reads the overlay first and SQLite around the gate (a create asks this, and must
    /// not fold): a history the overlay placed is where the overlay says. What SQLite shows
    /// at the directory's names is read once per directory while SQLite stays as it is
    /// (`StoredHistories`). The one fold here is for a tombstone the fold may not write
    /// (below), which takes a file whose head is local-only at a synced path: a rename
    /// from a scratch name commits a synced version at once, so that is rare.
    public func deadHistory(at path: String) throws(StoreError) -> DeadHistory? {
        var found = overlay.historiesAt[NameKey(path)]?.first { overlay.histories[$0]?.live == false }
        // A tombstone the fold may not write (its file's head was local-only, and no
        // other device's version is live): whether it does is known once it is folded.
        if let fileID = found, let head = overlay.tombstonesToCheck[fileID] {
            if try head.map({ (row) throws(StoreError) in try isLocalVersion(row: row) }) == false {
                overlay.noteTombstoneChecked(fileID)
            } else {
                try foldTree()
                found = nil
            }
        }
        if found == nil, try !mayShowHistory(at: path) { return nil }
        // A history begun since the last fold has no version in SQLite.
        if let fileID = found, overlay.isFresh(fileID) { return continuing(fileID, stored: nil) }
        let (directory, name) = Self.splitHistoryPath(path)
        var here = try storedHistories(in: directory).map { $0[NameKey(name)] ?? [] }
        if found == nil {
            if here == nil { here = try deadHistoriesRead(at: path) }
            found = here?.first { !$0.live && overlay.histories[$0.fileID] == nil }?.fileID
        }
        guard let fileID = found else { return nil }
        let stored: (row: Int64, committed: Nanos, id: VersionID)?
        if let entry = here?.first(where: { $0.fileID == fileID }) {
            stored = entry.newest
        } else if overlay.newest[fileID] != nil, let mark = overlay.newestMarks[fileID], mark == index.versionsWrittenAside {
            // The overlay's newest (the delete's tombstone, whose parents are the file's
            // live heads) was made after every version SQLite holds of the history: none
            // was written since (`TreeOverlay.newestMarks`). `rm f; echo new > f` reads
            // nothing.
            stored = nil
        } else {
            stored = try db.aroundGate { () throws(StoreError) in
                try db.rows("SELECT row, committed, id FROM versions WHERE file_id = ? AND local = 0 ORDER BY committed DESC, row DESC LIMIT 1",
                            [.id(fileID)]) { (row: $0.int(0), committed: $0.int(1), id: $0.versionID(2)) }.first
            }
        }
        return continuing(fileID, stored: stored)
    }

    /// History `fileID` as a new file continues it: its newest version is the overlay's or
    /// `stored`, SQLite's, whichever is newer (a sync step may have taken in another
    /// device's since the overlay's).
    private func continuing(_ fileID: FileID, stored: (row: Int64, committed: Nanos, id: VersionID)?) -> DeadHistory {
        guard let newer = overlay.newest[fileID] else { return DeadHistory(fileID: fileID, head: stored?.row, headID: stored?.id) }
        guard let stored, (stored.committed, stored.row) > (newer.committed, newer.row) else {
            return DeadHistory(fileID: fileID, head: newer.row, headID: nil)
        }
        return DeadHistory(fileID: fileID, head: stored.row, headID: stored.id)
    }

    /// The dead histories SQLite shows at `path`, each with its newest version that is
    /// not local-only, in one statement: read for a directory whose histories are not kept
    /// (`StoredHistories`). nil when none the overlay did not move is among the first 8.
    private func deadHistoriesRead(at path: String) throws(StoreError) -> [StoredHistories.Entry]? {
        let shown = try db.aroundGate { () throws(StoreError) in
            try db.rows(Self.deadHistoriesAtPath + " LIMIT 8", [.text(path)]) { Self.storedHistoryEntry($0, from: 0) }
        }
        if shown.contains(where: { overlay.histories[$0.fileID] == nil }) { return shown }
        guard shown.count == 8 else { return nil }
        // Every one the page showed was moved by the overlay: ask with it folded.
        try foldTree()
        return try db.rows(Self.deadHistoriesAtPath + " LIMIT 1", [.text(path)]) { Self.storedHistoryEntry($0, from: 0) }
    }

    private static let deadHistoriesAtPath = """
        SELECT h.file_id, h.live, v.row, v.committed, v.id FROM histories h
        LEFT JOIN versions v ON v.row = (SELECT row FROM versions WHERE file_id = h.file_id AND local = 0
                                         ORDER BY committed DESC, row DESC LIMIT 1)
        WHERE h.path = ? AND h.live = 0
        """

    /// A history's row as both reads give it from column `first` on: file id, live, and
    /// its newest version that is not local-only (row, committed, id; NULL when none).
    private static func storedHistoryEntry(_ r: SQLRow, from first: Int32) -> StoredHistories.Entry {
        let newest = r.isNull(first + 2) ? nil : (row: r.int(first + 2), committed: r.int(first + 3), id: r.versionID(first + 4))
        return StoredHistories.Entry(fileID: r.fileID(first), live: r.int(first + 1) != 0, newest: newest)
    }

    /// The histories SQLite shows at the names of the directory at `directory`, each with
    /// its newest version that is not local-only: one read per directory while SQLite
    /// reads the same (`Index.changeMark`), once a few creates asked there (nil before
    /// that, and for more than `StoredHistories` keeps: each name is read by itself).
    private func storedHistories(in directory: String) throws(StoreError) -> [NameKey: [StoredHistories.Entry]]? {
        if let known = storedHistories.directory(directory, at: index.changeMark) { return known }
        guard storedHistories.shouldRead(directory, at: index.changeMark) else { return nil }
        let rows = try db.aroundGate { () throws(StoreError) in
            try db.rows("""
                SELECT d.name, h.file_id, h.live, v.row, v.committed, v.id
                FROM history_dirs d JOIN histories h ON h.path = ? || d.name
                LEFT JOIN versions v ON v.row = (SELECT row FROM versions WHERE file_id = h.file_id AND local = 0
                                                 ORDER BY committed DESC, row DESC LIMIT 1)
                WHERE d.parent = ? AND d.leaves > 0 LIMIT ?
                """, [.text(directory.isEmpty ? "" : directory + "/"), .text(directory),
                      .int(Int64(storedHistories.perDirectory + 1))]) { (name: $0.text(0), entry: Self.storedHistoryEntry($0, from: 1)) }
        }
        // The mark after the read: a read that waited for the folder's loan to end saw
        // what it wrote.
        let mark = index.changeMark
        storedHistories.load(directory, rows, at: mark)
        return storedHistories.directory(directory, at: mark) ?? nil
    }

    /// A history path's directory ("" for the root) and last name.
    static func splitHistoryPath(_ path: String) -> (directory: String, name: String) {
        let slash = path.utf8.lastIndex(of: UInt8(ascii: "/"))
        return (slash.map { String(path[..<$0]) } ?? "", slash.map { String(path[path.index(after: $0)...]) } ?? path)
    }

    /// Whether SQLite may show a history at `path`: false only when it surely does not.
    /// A directory's names are read once, around the gate (`HistoryNames`), and tell of
    /// the directories below it too: the directories from the nearest known one down are
    /// read until one does not name the way down, so a new tree costs one read or a few,
    /// not one per directory. A directory with too many names is marked after reading one
    /// more than are kept.
    private func mayShowHistory(at path: String) throws(StoreError) -> Bool {
        let (directory, name) = Self.splitHistoryPath(path)
        if let known = historyNames.mayHave(directory, name) { return known }
        for way in historyNames.unknownWayDown(to: directory) {
            let rows = try db.aroundGate { () throws(StoreError) in
                try db.rows("SELECT name, leaves, total FROM history_dirs WHERE parent = ? LIMIT ?",
                            [.text(way), .int(Int64(historyNames.perDirectory + 1))]) {
                    (name: $0.text(0), leaf: $0.int(1) > 0, below: $0.int(2) > $0.int(1))
                }
            }
            historyNames.load(way, rows)
            if let known = historyNames.mayHave(directory, name) { return known }
        }
        return true
    }
}
