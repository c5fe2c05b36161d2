/// Versions and histories. A version is appended, never changed; a file's current version
/// is its inode's `head`. Local-only files keep only their latest version (`local = 1`),
/// which is never listed or synced.
extension Store {
    static let versionColumns = "row, id, file_id, parents, device_id, device_name, committed, mtime, mode, size, tombstone, local, path"

    static func version(from r: SQLRow) -> Version {
        Version(row: r.int(0), id: r.text(1), fileID: r.text(2),
                parents: r.text(3).split(separator: ",").map(String.init),
                deviceID: r.text(4), deviceName: r.text(5), committed: r.int(6), mtime: r.int(7),
                mode: UInt32(r.int(8)), size: r.int(9), isTombstone: r.int(10) != 0, isLocal: r.int(11) != 0,
                path: r.text(12))
    }

    /// Records a new current version of a file and returns it.
    /// - Parameters:
    ///   - local: the file is local-only; its previous local version is dropped.
    @discardableResult
    public func commit(_ id: InodeNumber, content: ChunkList, path: String, local: Bool) throws(StoreError) -> Version {
        guard var inode = inodes[id], let fileID = inode.fileID else { throw .noSuchVersion("inode \(id) is not a file") }
        let previous = try headVersion(inode.head ?? continuedParents[id])
        let now = nowNanos()
        let newVersion = Version(row: 0, id: randomHex(bytes: 16), fileID: fileID,
                              parents: previous.flatMap { $0.isLocal ? nil : [$0.id] } ?? [],
                              deviceID: deviceID, deviceName: deviceName, committed: now, mtime: inode.mtime,
                              mode: inode.mode, size: content.totalSize, isTombstone: false, isLocal: local, path: path)
        let row = try db.transaction { () throws(StoreError) -> Int64 in
            // A local file keeps only its latest version; never drop one that another inode
            // still shows (t-differential.py seed 105 left a hard link pointing at nothing).
            if let previous, previous.isLocal, !inodes.values.contains(where: { $0.id != id && $0.head == previous.row }) {
                try db.query("DELETE FROM versions WHERE row = ?", [.int(previous.row)])
            }
            let row = try insert(newVersion, chunks: content.encoded)
            inode.head = row
            inode.size = content.totalSize
            try persist(inode)
            if !local { try setHistory(fileID, path: path, live: true) }
            return row
        }
        update(memoryOnly: inode)
        continuedParents[id] = nil
        return newVersion.withRow(row)
    }

    /// Records that a file's last name is gone: a tombstone version (kept in its history).
    public func commitTombstone(fileID: String, head: Int64?, path: String) throws(StoreError) {
        let previous = try headVersion(head)
        guard let previous, !previous.isLocal else { return }
        let tombstone = Version(row: 0, id: randomHex(bytes: 16), fileID: fileID, parents: [previous.id],
                                deviceID: deviceID, deviceName: deviceName, committed: nowNanos(), mtime: nowNanos(),
                                mode: previous.mode, size: 0, isTombstone: true, isLocal: false, path: path)
        try db.transaction { () throws(StoreError) in
            _ = try insert(tombstone, chunks: [])
            try setHistory(fileID, path: path, live: false)
        }
    }

    /// Gives inode `id` the history `fileID` (rename over an existing file continues the
    /// target's history). Its next commit becomes a child of `head`.
    public func adoptHistory(_ id: InodeNumber, fileID: String, head: Int64?) throws(StoreError) {
        guard var inode = inodes[id] else { return }
        inode.fileID = fileID
        inode.head = head
        try persist(inode)
        update(memoryOnly: inode)
    }

    /// A new, empty file continues the history `fileID`: its first commit becomes a child
    /// of `parent`, but its content stays its own (empty), unlike `adoptHistory`.
    public func continueHistory(_ id: InodeNumber, fileID: String, parent: Int64?) throws(StoreError) {
        try adoptHistory(id, fileID: fileID, head: nil)
        continuedParents[id] = parent
    }

    /// Moves where a history is shown (after a rename).
    public func setHistory(_ fileID: String, path: String, live: Bool) throws(StoreError) {
        try db.query("REPLACE INTO histories(file_id, path, live) VALUES(?, ?, ?)", [.text(fileID), .text(path), .int(live ? 1 : 0)])
    }

    /// Marks a history as having no live file (it stays shown at its last path).
    public func retireHistory(_ fileID: String) throws(StoreError) {
        try db.query("UPDATE histories SET live = 0 WHERE file_id = ?", [.text(fileID)])
    }

    /// Stops showing a history under .versions/ (its versions stay in the database).
    public func dropHistory(_ fileID: String) throws(StoreError) {
        try db.query("DELETE FROM histories WHERE file_id = ?", [.text(fileID)])
    }

    /// Every (path, fileID) shown under .versions/.
    public func histories() throws(StoreError) -> [(path: String, fileID: String)] {
        try db.rows("SELECT path, file_id FROM histories", []) { ($0.text(0), $0.text(1)) }
    }

    /// A file's versions, oldest first (tombstones and local versions excluded).
    public func versions(of fileID: String) throws(StoreError) -> [Version] {
        try db.rows("SELECT \(Store.versionColumns) FROM versions WHERE file_id = ? AND tombstone = 0 AND local = 0 ORDER BY committed, id",
                    [.text(fileID)], Store.version(from:))
    }

    func headVersion(_ row: Int64?) throws(StoreError) -> Version? {
        guard let row else { return nil }
        return try version(row: row)
    }

    public func version(row: Int64) throws(StoreError) -> Version? {
        try db.rows("SELECT \(Store.versionColumns) FROM versions WHERE row = ?", [.int(row)], Store.version(from:)).first
    }

    public func version(id: String) throws(StoreError) -> Version? {
        try db.rows("SELECT \(Store.versionColumns) FROM versions WHERE id = ?", [.text(id)], Store.version(from:)).first
    }

    public func chunkList(row: Int64) throws(StoreError) -> ChunkList {
        guard let blob = try db.rows("SELECT chunks FROM versions WHERE row = ?", [.int(row)], { $0.blob(0) }).first else {
            throw .noSuchVersion("version row \(row)")
        }
        guard let list = ChunkList(encoded: blob) else { throw .database("version row \(row) has a malformed chunk list") }
        return list
    }

    /// Every version's row and chunk list (fsck, gc).
    public func allChunkLists(_ body: (Int64, String, ChunkList?) throws(StoreError) -> Void) throws(StoreError) {
        let rows = try db.rows("SELECT row, id, chunks FROM versions", []) { ($0.int(0), $0.text(1), $0.blob(2)) }
        for (row, id, blob) in rows { try body(row, id, ChunkList(encoded: blob)) }
    }

    public var versionCount: Int {
        (try? db.rows("SELECT count(*) FROM versions WHERE tombstone = 0 AND local = 0", []) { Int($0.int(0)) }.first) ?? 0
    }

    private func insert(_ v: Version, chunks: [UInt8]) throws(StoreError) -> Int64 {
        try db.query("""
            INSERT INTO versions(id, file_id, parents, device_id, device_name, committed, mtime, mode, size, tombstone, local, path, chunks)
            VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?)
            """, [.text(v.id), .text(v.fileID), .text(v.parents.joined(separator: ",")), .text(v.deviceID),
                  .text(v.deviceName), .int(v.committed), .int(v.mtime), .int(Int64(v.mode)), .int(v.size),
                  .int(v.isTombstone ? 1 : 0), .int(v.isLocal ? 1 : 0), .text(v.path), .blob(chunks)])
        return db.lastInsertRowID
    }

    private func update(memoryOnly inode: Inode) {
        let nlink = inodes[inode.id]?.nlink ?? 0
        inodes[inode.id] = inode
        inodes[inode.id]!.nlink = nlink
    }
}

extension Version {
    func withRow(_ row: Int64) -> Version {
        Version(row: row, id: id, fileID: fileID, parents: parents, deviceID: deviceID, deviceName: deviceName,
                committed: committed, mtime: mtime, mode: mode, size: size, isTombstone: isTombstone,
                isLocal: isLocal, path: path)
    }
}
