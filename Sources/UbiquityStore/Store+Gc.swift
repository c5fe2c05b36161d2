/// Garbage collection, the store's half: which chunks versions name ("mark"), a page of
/// version rows at a time so the caller can hold the filesystem's lock per page. The
/// sweep is `ChunkStore.sweep`; `FileSystem.collectGarbage` runs both.
extension Store {
    /// The chunks named by the version rows after `afterRow`, up to `limit` rows; returns
    /// the last row read (nil: no more rows) and how many were read.
    public func markChunks(afterRow: Int64, limit: Int, into marked: inout Set<ChunkID>) throws(StoreError) -> (last: Int64, rows: Int)? {
        var last: Int64?, rows = 0
        try db.query("SELECT row, chunks FROM versions WHERE row > ? ORDER BY row LIMIT ?", [.int(afterRow), .int(Int64(limit))]) { r in
            last = r.int(0)
            rows += 1
            guard let list = ChunkList(encoded: r.blob(1)) else { return }
            for i in 0..<list.count where !list.isHole(i) { marked.insert(list.ids[i]) }
        }
        return last.map { ($0, rows) }
    }

    /// Version rows in all (the mark's progress).
    public var versionRowCount: Int {
        (try? db.rows("SELECT count(*) FROM versions", []) { Int($0.int(0)) }.first) ?? 0
    }
}
