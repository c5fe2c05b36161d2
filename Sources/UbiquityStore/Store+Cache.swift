/// The cache limit and the content totals (store format 12). SQLite triggers keep one row
/// of totals over the regular files (how many, their bytes, the bytes here and not here)
/// in the transaction of every inode change, so `ubiquity status` and the cache limit read
/// them in O(1) however big the container. `inodes.used` says when a file was last opened
/// on this device; the partial index `inodes_cached` lists, least recently used first, the
/// files whose local copies could go.
extension Store {
    /// Files the cache limit may evict: regular, named, not pinned, with more than the bytes
    /// records carry inline, and some of their content here. The index and its query share it.
    static let evictableCondition = "kind = 1 AND nlink > 0 AND keep != 1 AND size > \(inlineChunkLimit) AND absent < coalesce(allocated, size)"
    /// The size part of `evictableCondition`: a file this small keeps its bytes in its
    /// records, so when it was used never matters and is not written (else a first read of
    /// each of a million small files would write two pages of `inodes` apiece).
    public static func usesMatter(size: Int64) -> Bool { size > Int64(inlineChunkLimit) }

    static let contentTotalsSchema = [
        """
        CREATE TABLE IF NOT EXISTS content_totals(
            one INTEGER PRIMARY KEY CHECK (one = 1), files INTEGER NOT NULL, size INTEGER NOT NULL,
            allocated INTEGER NOT NULL, absent INTEGER NOT NULL, absent_files INTEGER NOT NULL)
        """,
        "CREATE TRIGGER IF NOT EXISTS content_totals_insert AFTER INSERT ON inodes WHEN \(counted("NEW")) BEGIN \(addTotals("NEW", +1)) END",
        "CREATE TRIGGER IF NOT EXISTS content_totals_delete AFTER DELETE ON inodes WHEN \(counted("OLD")) BEGIN \(addTotals("OLD", -1)) END",
        // Both rows weighed by whether they count, so a file that gains or loses its last
        // name (nlink), or changes size, moves the totals by the difference.
        """
        CREATE TRIGGER IF NOT EXISTS content_totals_update AFTER UPDATE OF kind, nlink, size, allocated, absent ON inodes
        WHEN (\(counted("OLD")) OR \(counted("NEW"))) AND (OLD.kind IS NOT NEW.kind OR OLD.nlink IS NOT NEW.nlink
              OR OLD.size IS NOT NEW.size OR OLD.allocated IS NOT NEW.allocated OR OLD.absent IS NOT NEW.absent) BEGIN
            UPDATE content_totals SET files = files + \(weight("NEW")) - \(weight("OLD")),
                size = size + \(weight("NEW")) * NEW.size - \(weight("OLD")) * OLD.size,
                allocated = allocated + \(weight("NEW")) * coalesce(NEW.allocated, NEW.size) - \(weight("OLD")) * coalesce(OLD.allocated, OLD.size),
                absent = absent + \(weight("NEW")) * NEW.absent - \(weight("OLD")) * OLD.absent,
                absent_files = absent_files + (\(counted("NEW")) AND NEW.absent > 0) - (\(counted("OLD")) AND OLD.absent > 0);
        END
        """,
    ]

    /// What the totals count: regular files with a name (an unlinked file still open, or
    /// still known to the kernel, is on its way out).
    private static func counted(_ row: String) -> String { "(\(row).kind = 1 AND \(row).nlink > 0)" }
    private static func weight(_ row: String) -> String { "(\(counted(row)))" }
    private static func addTotals(_ row: String, _ sign: Int) -> String {
        let op = sign > 0 ? "+" : "-"
        return """
            UPDATE content_totals SET files = files \(op) 1, size = size \(op) \(row).size,
                allocated = allocated \(op) coalesce(\(row).allocated, \(row).size), absent = absent \(op) \(row).absent,
                absent_files = absent_files \(op) (\(row).absent > 0);
            """
    }
    private static let countedFiles = "FROM inodes WHERE kind = 1 AND nlink > 0"

    /// The totals from one walk of the files (the upgrade to format 12).
    static func recountContentTotals(_ db: SQLiteDatabase) throws(StoreError) {
        try db.execute("""
            REPLACE INTO content_totals(one, files, size, allocated, absent, absent_files)
            SELECT 1, count(*), coalesce(sum(size), 0), coalesce(sum(coalesce(allocated, size)), 0),
                   coalesce(sum(absent), 0), coalesce(sum(absent > 0), 0) \(countedFiles)
            """)
    }

    /// The totals as the triggers keep them (nil: a store of an older format, read-only).
    public func contentTotals() -> ContentTotals? {
        try? db.rows("SELECT files, size, allocated, absent, absent_files FROM content_totals WHERE one = 1", []) { r in
            ContentTotals(files: max(r.int(0), 0), size: max(r.int(1), 0), allocated: max(r.int(2), 0),
                          absent: max(r.int(3), 0), absentFiles: max(r.int(4), 0))
        }.first
    }

    /// The totals from a walk of every file (tests compare them with the kept ones).
    func countedContentTotals() throws(StoreError) -> ContentTotals {
        try db.rows("""
            SELECT count(*), coalesce(sum(size), 0), coalesce(sum(coalesce(allocated, size)), 0),
                   coalesce(sum(absent), 0), coalesce(sum(absent > 0), 0) \(Self.countedFiles)
            """, []) { r in
            ContentTotals(files: r.int(0), size: r.int(1), allocated: r.int(2), absent: r.int(3), absentFiles: r.int(4))
        }.first ?? ContentTotals()
    }

    /// Writes when files were last opened (batched by the filesystem: an open costs no write).
    public func noteUses(_ uses: some Collection<(key: InodeNumber, value: Nanos)>) throws(StoreError) {
        guard !uses.isEmpty else { return }
        // Committed at once, not left in the group-commit batch: each use dirties a page of
        // its own (inodes all over a big tree), and a batch that gathered the slices of a
        // pass (tens of thousands of uses after random reads over a big tree) would be
        // written by one commit that holds the lock for up to a second.
        try standaloneStep { () throws(StoreError) in
            for (ino, time) in uses where ino.fitsColumn {
                try db.query("UPDATE inodes SET used = max(used, ?) WHERE id = ?", [.int(time), .inode(ino)])
            }
        }
    }

    /// The pinned files (an index: the cost is in proportion to them).
    public func pinnedFiles() throws(StoreError) -> [InodeNumber] {
        try db.rows("SELECT id FROM inodes INDEXED BY inodes_pinned WHERE keep = 1", []) { $0.inode(0) }
    }

    /// Files the cache limit may evict, least recently used first, after `after` (a
    /// cursor: `(used, inode)` of the last one seen), at most `limit`.
    public func evictionCandidates(after: (used: Nanos, ino: InodeNumber), limit: Int) throws(StoreError) -> [(used: Nanos, ino: InodeNumber)] {
        try db.rows("""
            SELECT used, id FROM inodes INDEXED BY inodes_cached WHERE \(Self.evictableCondition)
              AND (used > ? OR (used = ? AND id > ?)) ORDER BY used, id LIMIT ?
            """, [.int(after.used), .int(after.used), .inode(after.ino), .int(Int64(limit))]) { r in
            (r.int(0), r.inode(1))
        }
    }
}

/// The regular files of the tree, counted by the store's triggers.
public struct ContentTotals: Sendable, Equatable {
    public var files: Int64 = 0
    /// Their bytes (`du --apparent-size`).
    public var size: Int64 = 0
    /// Their bytes outside holes, and of those the ones not on this device.
    public var allocated: Int64 = 0
    public var absent: Int64 = 0
    /// Files with some content not here.
    public var absentFiles: Int64 = 0

    /// The bytes of current contents on this device (what the cache limit counts).
    public var here: Int64 { max(allocated - absent, 0) }
}
