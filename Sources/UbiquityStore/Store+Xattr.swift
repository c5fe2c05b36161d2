/// User extended attributes (`user.*`), stored with the inode. Not versioned.
extension Store {
    public func xattr(_ id: InodeNumber, _ name: String) throws(StoreError) -> [UInt8]? {
        try db.rows("SELECT value FROM xattrs WHERE inode = ? AND name = ?", [.inode(id), .text(name)]) { $0.blob(0) }.first
    }

    public func xattrNames(_ id: InodeNumber) throws(StoreError) -> [String] {
        try db.rows("SELECT name FROM xattrs WHERE inode = ? ORDER BY name", [.inode(id)]) { $0.text(0) }
    }

    public func setXattr(_ id: InodeNumber, _ name: String, _ value: [UInt8]) throws(StoreError) {
        try db.query("REPLACE INTO xattrs(inode, name, value) VALUES(?, ?, ?)", [.inode(id), .text(name), .blob(value)])
        try changed.insert(id)
    }

    /// Returns whether the attribute existed.
    public func removeXattr(_ id: InodeNumber, _ name: String) throws(StoreError) -> Bool {
        try db.query("DELETE FROM xattrs WHERE inode = ? AND name = ?", [.inode(id), .text(name)])
        let removed = db.changes > 0
        try changed.insert(id)
        return removed
    }

    /// A history that no live file shows at `path` (its file was deleted or renamed to a
    /// local-only name): a new file there continues it. Returns its id and newest version.
    /// Reads the overlay first and SQLite around the gate (a create asks this, and must
    /// not fold): a history the overlay placed is where the overlay says.
    public func deadHistory(at path: String) throws(StoreError) -> (fileID: FileID, head: Int64?)? {
        var found = overlay.historiesAt[NameKey(path)]?.first { overlay.histories[$0]?.live == false }
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
}
