/// The metadata database's schema. `formatVersion` is stored in `settings`; a store written
/// by a newer program is refused rather than misread.
enum Schema {
    static let formatVersion = 3

    static let statements = [
        """
        CREATE TABLE IF NOT EXISTS settings(key TEXT PRIMARY KEY, value TEXT NOT NULL)
        """,
        """
        CREATE TABLE IF NOT EXISTS inodes(
            id INTEGER PRIMARY KEY, kind INTEGER NOT NULL, mode INTEGER NOT NULL,
            uid INTEGER NOT NULL, gid INTEGER NOT NULL, size INTEGER NOT NULL,
            atime INTEGER NOT NULL, mtime INTEGER NOT NULL, ctime INTEGER NOT NULL,
            rdev INTEGER NOT NULL, target TEXT, file_id TEXT, head INTEGER, allocated INTEGER)
        """,
        // Directory entries: names are UTF-8 (the filesystem refuses others with EILSEQ).
        """
        CREATE TABLE IF NOT EXISTS entries(
            parent INTEGER NOT NULL, name TEXT NOT NULL, inode INTEGER NOT NULL,
            PRIMARY KEY(parent, name)) WITHOUT ROWID
        """,
        "CREATE INDEX IF NOT EXISTS entries_inode ON entries(inode)",
        // Versions are append-only. `chunks` is ChunkList.encoded. `durable` = 1 once a
        // durability barrier has run after the version was written (Store.markDurable).
        """
        CREATE TABLE IF NOT EXISTS versions(
            row INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, file_id TEXT NOT NULL,
            parents TEXT NOT NULL, device_id TEXT NOT NULL, device_name TEXT NOT NULL,
            committed INTEGER NOT NULL, mtime INTEGER NOT NULL, mode INTEGER NOT NULL,
            size INTEGER NOT NULL, tombstone INTEGER NOT NULL, local INTEGER NOT NULL,
            path TEXT NOT NULL, chunks BLOB NOT NULL, durable INTEGER NOT NULL DEFAULT 0,
            kind INTEGER NOT NULL DEFAULT 1, target TEXT, xattrs BLOB, meta INTEGER NOT NULL DEFAULT 0,
            uploaded INTEGER NOT NULL DEFAULT 0)
        """,
        "CREATE INDEX IF NOT EXISTS versions_file ON versions(file_id, committed)",
        "CREATE INDEX IF NOT EXISTS versions_pending ON versions(durable) WHERE durable = 0",
        "CREATE INDEX IF NOT EXISTS versions_upload ON versions(uploaded) WHERE uploaded = 0",
        // Where each history is shown under .versions/: the file's current path, or the
        // last path it had before it was deleted.
        """
        CREATE TABLE IF NOT EXISTS histories(
            file_id TEXT PRIMARY KEY, path TEXT NOT NULL, live INTEGER NOT NULL)
        """,
        "CREATE INDEX IF NOT EXISTS histories_path ON histories(path)",
        // The directories the histories' paths make (format 3): `leaves` histories are shown
        // at exactly parent/name, `total` at or below it (Store+Histories).
        """
        CREATE TABLE IF NOT EXISTS history_dirs(
            parent TEXT NOT NULL, name TEXT NOT NULL, leaves INTEGER NOT NULL, total INTEGER NOT NULL,
            PRIMARY KEY(parent, name)) WITHOUT ROWID
        """,
        """
        CREATE TABLE IF NOT EXISTS xattrs(
            inode INTEGER NOT NULL, name TEXT NOT NULL, value BLOB NOT NULL,
            PRIMARY KEY(inode, name)) WITHOUT ROWID
        """,
        // Sync: how far this device has read each other device's journal (bytes).
        """
        CREATE TABLE IF NOT EXISTS sync_peers(device TEXT PRIMARY KEY, offset INTEGER NOT NULL)
        """,
    ]

    /// Columns added since format 1, added to an older store when it is opened.
    /// Format 2 (sync), on versions:
    /// `kind`/`target`: records of directories and symlinks share the versions table (their
    /// file_id is `dir:<path>` / `link:<path>`); `meta` = 1: a record that changed only
    /// path, mode, mtime or xattrs; `uploaded` = 1: in the backing directory.
    /// Format 3 (sparse files: holes in chunk lists, see `ChunkList.encoded`), on inodes:
    /// `allocated` = bytes of the current content not in holes (NULL: as `size`).
    static let addedColumns = [
        ("versions", "kind", "INTEGER NOT NULL DEFAULT 1"), ("versions", "target", "TEXT"), ("versions", "xattrs", "BLOB"),
        ("versions", "meta", "INTEGER NOT NULL DEFAULT 0"), ("versions", "uploaded", "INTEGER NOT NULL DEFAULT 0"),
        ("inodes", "allocated", "INTEGER"),
    ]
}

extension Schema {
    static func migrate(_ db: SQLiteDatabase) throws(StoreError) {
        // A table must have its new columns before an index on one of them is made.
        for table in ["versions", "inodes"] {
            guard try db.rows("SELECT count(*) FROM sqlite_master WHERE name = ?", [.text(table)], { $0.int(0) }).first == 1 else { continue }
            let columns = Set(try db.rows("PRAGMA table_info(\(table))", []) { $0.text(1) })
            for (t, name, type) in addedColumns where t == table && !columns.contains(name) {
                try db.execute("ALTER TABLE \(table) ADD COLUMN \(name) \(type)")
            }
        }
        let exists = { (table: String) throws(StoreError) -> Bool in
            try db.rows("SELECT count(*) FROM sqlite_master WHERE name = ?", [.text(table)], { $0.int(0) }).first == 1
        }
        let hadHistories = try exists("histories")
        let hadDirectories = try exists("history_dirs")
        let upgradingToDirectories = hadHistories && !hadDirectories
        for statement in statements { try db.execute(statement) }
        if upgradingToDirectories { try Store.buildHistoryDirectories(db) }
    }
}
