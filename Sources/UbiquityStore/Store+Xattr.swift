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
    public func deadHistory(at path: String) throws(StoreError) -> (fileID: FileID, head: Int64?)? {
        guard let fileID = try db.rows("SELECT file_id FROM histories WHERE path = ? AND live = 0 LIMIT 1", [.text(path)], { $0.fileID(0) }).first else { return nil }
        let head = try db.rows("SELECT row FROM versions WHERE file_id = ? AND local = 0 ORDER BY committed DESC, row DESC LIMIT 1", [.id(fileID)]) { $0.int(0) }.first
        return (fileID, head)
    }
}
