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
    /// local-only name): a new file there continues it. Returns its id and newest version.
    /// Reads the overlay first and SQLite around the gate (a create asks this, and must
    /// not fold): a history the overlay placed is where the overlay says. The one fold
    /// here is for a tombstone the fold may not write (below), which takes a file whose
    /// head is local-only at a synced path: a rename from a scratch name commits a synced
    /// version at once, so that is rare.
    public func deadHistory(at path: String) throws(StoreError) -> (fileID: FileID, head: Int64?)? {
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
        if found == nil {
            let shown = try db.aroundGate { () throws(StoreError) in
                try db.rows("SELECT file_id FROM histories WHERE path = ? AND live = 0 LIMIT 8", [.text(path)], { $0.fileID(0) })
            }
            found = shown.first { overlay.histories[$0] == nil }
            if found == nil && shown.count == 8 {
                // Every one the page showed was moved by the overlay: ask with it folded.
                try foldTree()
                found = try db.rows("SELECT file_id FROM histories WHERE path = ? AND live = 0 LIMIT 1", [.text(path)], { $0.fileID(0) }).first
            }
        }
        guard let fileID = found else { return nil }
        let stored = try db.aroundGate { () throws(StoreError) in
            try db.rows("SELECT row, committed FROM versions WHERE file_id = ? AND local = 0 ORDER BY committed DESC, row DESC LIMIT 1",
                        [.id(fileID)]) { (row: $0.int(0), committed: $0.int(1)) }.first
        }
        guard let newer = overlay.newest[fileID] else { return (fileID, stored?.row) }
        guard let stored, (stored.committed, stored.row) > (newer.committed, newer.row) else { return (fileID, newer.row) }
        return (fileID, stored.row)
    }

    /// Whether SQLite may show a history at `path`: false only when it surely does not.
    /// A directory's names are read once, around the gate (`HistoryNames`); a directory
    /// with too many is marked after reading one more than are kept.
    private func mayShowHistory(at path: String) throws(StoreError) -> Bool {
        let slash = path.utf8.lastIndex(of: UInt8(ascii: "/"))
        let directory = slash.map { String(path[..<$0]) } ?? ""
        let name = slash.map { String(path[path.index(after: $0)...]) } ?? path
        if let known = historyNames.mayHave(directory, name) { return known }
        let shown = try db.aroundGate { () throws(StoreError) in
            try db.rows("SELECT name FROM history_dirs WHERE parent = ? AND leaves > 0 LIMIT ?",
                        [.text(directory), .int(Int64(historyNames.perDirectory + 1))]) { $0.text(0) }
        }
        historyNames.load(directory, shown)
        return historyNames.mayHave(directory, name) ?? true
    }
}
