/// The metadata database's upkeep after gc: free pages given back, its size. The mark
/// reads the versions' reader (`VersionLog.markChunks`), the sweep is `ChunkStore.sweep`;
/// `FileSystem.collectGarbage` runs them.
extension Store {
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

    /// Disk space of the databases (metadata with the key-value store, small chunks), WAL
    /// included: O(1).
    public var databaseBytes: (metadata: Int64, smallChunks: Int64) {
        (SQLiteDatabase.diskBytes(path: db.path) + SQLiteDatabase.diskBytes(path: keyValues.path), chunks.smallChunkBytes)
    }
}
