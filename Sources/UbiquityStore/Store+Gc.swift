import Glibc

/// Garbage collection, the store's half: which chunks versions name ("mark"), a page of
/// version rows at a time so the caller can hold the filesystem's lock per page. The
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

    /// Gives free pages of the metadata database back to the filesystem (stores created
    /// with incremental auto-vacuum, format 5 on; older ones reuse their free pages).
    public func compactDatabase() throws(StoreError) {
        try db.commitBatch()
        try db.execute("PRAGMA incremental_vacuum")
    }

    /// The version rows files show now (their inodes' heads), for gc's space report.
    public func currentVersionRows() throws(StoreError) -> Set<Int64> {
        Set(try db.rows("SELECT head FROM inodes WHERE head IS NOT NULL AND nlink > 0", []) { $0.int(0) })
    }

    /// Disk space of the databases (metadata, small chunks), WAL included: O(1).
    public var databaseBytes: (metadata: Int64, smallChunks: Int64) {
        var total: Int64 = 0
        for p in [db.path, db.path + "-wal"] {
            var st = stat()
            if stat(p, &st) == 0 { total += Int64(st.st_blocks) * 512 }
        }
        return (total, chunks.smallChunkBytes)
    }

    /// Version rows in all (the mark's progress).
    public var versionRowCount: Int {
        (try? db.rows("SELECT count(*) FROM versions", []) { Int($0.int(0)) }.first) ?? 0
    }
}
