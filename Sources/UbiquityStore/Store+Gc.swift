/// Garbage collection, the store's half: which chunks versions name ("mark"), a page of
/// version rows at a time so the caller can hold the store's lock per page. The
/// sweep is `ChunkStore.sweep`; `FileSystem.collectGarbage` runs both.
extension Store {
    /// The chunks named by the version rows after `afterRow`, up to `limit` rows; returns
    /// the last row read (nil: no more rows) and how many were read.
    public func markChunks(afterRow: Int64, limit: Int, _ body: (Int64, ChunkList) -> Void) throws(StoreError) -> (last: Int64, rows: Int)? {
        var last: Int64?, rows = 0
        try db.query("SELECT row, chunks FROM versions WHERE row > ? ORDER BY row LIMIT ?", [.int(afterRow), .int(Int64(limit))]) { r in
            last = r.int(0)
            rows += 1
            guard let list = ChunkList(encoded: r.blob(1)) else { return }
            body(r.int(0), list)
        }
        return last.map { ($0, rows) }
    }

    /// Gives a `vacuumStep` of free pages of the metadata database back to the filesystem (stores
    /// created with incremental auto-vacuum, format 5 on; older ones reuse their free
    /// pages). Returns whether free pages remain: the caller repeats, taking its lock
    /// for each step only.
    public func compactDatabaseStep() throws(StoreError) -> Bool {
        try commitBatch() // the store's: small chunks first, and the intent sequence noted
        return try db.vacuumStep()
    }

    /// Whether the metadata database holds many free pages: at least 256 and a 32nd of the
    /// file (what a sync step's consumed change set, an upload's marks or a prune leave).
    /// Three PRAGMA reads. `FileSystem.compactIfMuchFree` gives them back then: SQLite
    /// reuses free pages, but a store that just took in or recorded thousands of changes
    /// would otherwise keep a few percent of its size free for good.
    public func hasMuchFreeSpace() throws(StoreError) -> Bool {
        let value = { (pragma: String) throws(StoreError) -> Int64 in try self.db.rows("PRAGMA \(pragma)", []) { $0.int(0) }.first ?? 0 }
        // Only an incremental auto-vacuum database (made at format 5 or later) can give
        // pages back; an older one reuses them.
        guard try value("auto_vacuum") == 2 else { return false }
        let free = try value("freelist_count"), pages = try value("page_count")
        return free >= 256 && free * 32 >= pages
    }

    /// The version rows files show now (their inodes' heads) of up to `limit` inodes after
    /// inode `after`, for gc's space report; returns the last inode read (nil: done).
    public func currentVersionRows(afterInode after: InodeNumber, limit: Int, into rows: inout Set<Int64>) throws(StoreError) -> InodeNumber? {
        var last: InodeNumber?
        try db.query("SELECT id, head, nlink FROM inodes WHERE id > ? ORDER BY id LIMIT ?", [.inode(after), .int(Int64(limit))]) { r in
            last = r.inode(0)
            if !r.isNull(1) && r.int(2) > 0 { rows.insert(r.int(1)) } // a file with a name
        }
        return last
    }

    /// Disk space of the databases (metadata with the key-value store, small chunks), WAL
    /// included: O(1).
    public var databaseBytes: (metadata: Int64, smallChunks: Int64) {
        (SQLiteDatabase.diskBytes(path: db.path) + SQLiteDatabase.diskBytes(path: keyValues.path), chunks.smallChunkBytes)
    }

    /// About how many version rows there are (the mark's progress): the highest row, read
    /// from the end of the table's index, not a count of every row.
    public var versionRowCount: Int {
        (try? db.rows("SELECT max(row) FROM versions", []) { Int($0.int(0)) }.first) ?? 0
    }
}
