import UbiquitySystem

/// The metadata database's schema. `formatVersion` is stored in `settings`; a store written
/// by a newer program is refused rather than misread.
enum Schema {
    static let formatVersion = 23

    static let statements = [
        """
        CREATE TABLE IF NOT EXISTS settings(key TEXT PRIMARY KEY, value TEXT NOT NULL)
        """,
        """
        CREATE TABLE IF NOT EXISTS inodes(
            id INTEGER PRIMARY KEY, kind INTEGER NOT NULL, mode INTEGER NOT NULL,
            uid INTEGER NOT NULL, gid INTEGER NOT NULL, size INTEGER NOT NULL,
            atime INTEGER NOT NULL, mtime INTEGER NOT NULL, ctime INTEGER NOT NULL,
            rdev INTEGER NOT NULL, target TEXT, file_id BLOB, head INTEGER, allocated INTEGER,
            nlink INTEGER NOT NULL DEFAULT 0, parent INTEGER, name TEXT, absent INTEGER NOT NULL DEFAULT 0,
            keep INTEGER NOT NULL DEFAULT 0, used INTEGER NOT NULL DEFAULT 0)
        """,
        // Directory entries: names are UTF-8 (the filesystem refuses others with EILSEQ).
        """
        CREATE TABLE IF NOT EXISTS entries(
            parent INTEGER NOT NULL, name TEXT NOT NULL, inode INTEGER NOT NULL,
            PRIMARY KEY(parent, name)) WITHOUT ROWID
        """,
        "CREATE INDEX IF NOT EXISTS entries_inode ON entries(inode)",
        // Versions are append-only. `chunks` is ChunkList.encoded (format 14: a chunk of at
        // most 64 bytes is kept there, its bytes in place of its hash). `durable` = 1 once a
        // durability barrier has run after the version was written (Store.markDurable).
        // Ids are bytes (format 13, `IDs.swift`): `id` 16 bytes, `file_id` the history's 16
        // (the text `dir:<path>` / `link:<path>` for a directory's or symlink's record),
        // `parents` their ids one after another. Stores upgraded from format 12 keep the
        // TEXT declarations, which store bytes as bytes all the same.
        """
        CREATE TABLE IF NOT EXISTS versions(
            row INTEGER PRIMARY KEY, id BLOB NOT NULL UNIQUE, file_id BLOB NOT NULL,
            parents BLOB NOT NULL, device INTEGER NOT NULL,
            committed INTEGER NOT NULL, mtime INTEGER NOT NULL, mode INTEGER NOT NULL,
            size INTEGER NOT NULL, tombstone INTEGER NOT NULL, local INTEGER NOT NULL,
            path TEXT NOT NULL, chunks BLOB NOT NULL, durable INTEGER NOT NULL DEFAULT 0,
            kind INTEGER NOT NULL DEFAULT 1, target TEXT, xattrs BLOB, meta INTEGER NOT NULL DEFAULT 0,
            uploaded INTEGER NOT NULL DEFAULT 0, lineage TEXT, viewed INTEGER NOT NULL DEFAULT 1)
        """,
        "CREATE INDEX IF NOT EXISTS versions_file ON versions(file_id, committed)",
        "CREATE INDEX IF NOT EXISTS versions_pending ON versions(durable) WHERE durable = 0",
        "CREATE INDEX IF NOT EXISTS versions_upload ON versions(uploaded) WHERE uploaded = 0",
        // Format 21: this device's records a fold wrote that the synced view has not taken
        // in yet (`Index.viewOwnRecords`).
        "CREATE INDEX IF NOT EXISTS versions_unviewed ON versions(row) WHERE viewed = 0",
        // Where each history is shown under .versions/: the file's current path, or the
        // last path it had before it was deleted.
        """
        CREATE TABLE IF NOT EXISTS histories(
            file_id BLOB PRIMARY KEY, path TEXT NOT NULL, live INTEGER NOT NULL)
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
        // Sync: how far this device has read each other device's journal: the journal's
        // generation (format 6: devices rewrite their journals, docs/FORMAT.md) and bytes.
        """
        CREATE TABLE IF NOT EXISTS sync_peers(device TEXT PRIMARY KEY, offset INTEGER NOT NULL,
                                              generation INTEGER NOT NULL DEFAULT 0)
        """,
        // Format 6: other devices' records this device pruned, so that reading them again
        // (in a rewritten journal of their author) does not bring them back. `seen`: the
        // author's journal generation they were last known to be in (Store+Journal).
        """
        CREATE TABLE IF NOT EXISTS pruned_records(id BLOB PRIMARY KEY, device TEXT NOT NULL,
                                                  seen INTEGER NOT NULL) WITHOUT ROWID
        """,
        "CREATE INDEX IF NOT EXISTS pruned_records_seen ON pruned_records(device, seen)",
        // Format 6: the highest dot this device gave each node's records (Replica.lineage).
        "CREATE TABLE IF NOT EXISTS own_dots(node BLOB PRIMARY KEY, dot INTEGER NOT NULL) WITHOUT ROWID",
        // Format 4: the primary name's directory and the link count, so inodes load one at a time.
        "CREATE INDEX IF NOT EXISTS inodes_unlinked ON inodes(id) WHERE nlink = 0",
        "CREATE INDEX IF NOT EXISTS inodes_head ON inodes(head) WHERE head IS NOT NULL",
        PendingSet<Int>.schema,
        // Format 9: the ranges fallocate reserved in a file ("a-b,c-d"; Store+Reserve).
        "CREATE TABLE IF NOT EXISTS reserves(inode INTEGER PRIMARY KEY, ranges TEXT NOT NULL)",
        // Format 10 (backing format 5): where each chunk is in the backing store's packs,
        // learned from uploads and from other devices' records (Store+Places).
        "CREATE TABLE IF NOT EXISTS chunk_places(id BLOB PRIMARY KEY, pack TEXT NOT NULL, offset INTEGER NOT NULL) WITHOUT ROWID",
        // Format 11: the files whose content is not all here (background downloading).
        "CREATE INDEX IF NOT EXISTS inodes_absent ON inodes(id) WHERE absent > 0",
        // Format 12 (the cache limit): the files whose local copies may go, least recently
        // used first (`Store+Cache`); the query that walks it repeats this WHERE.
        "CREATE INDEX IF NOT EXISTS inodes_cached ON inodes(used, id) WHERE \(Store.evictableCondition)",
        // The pinned files, whose chunks an eviction of another file leaves.
        "CREATE INDEX IF NOT EXISTS inodes_pinned ON inodes(id) WHERE keep = 1",
        // Format 13: the devices that made versions, by number (`Store+Devices`).
        Store.devicesSchema,
    ] + Store.contentTotalsSchema
        + Replica.schema // format 4: the synced view (Replica)
    // Formats 8 to 19 had the key-value store's table `kv` here; format 20 moved it to a
    // database of its own (`KeyValueTable`).

    /// Columns added since format 1, added to an older store when it is opened.
    /// Format 2 (sync), on versions:
    /// `kind`/`target`: records of directories and symlinks share the versions table (their
    /// file_id is `dir:<path>` / `link:<path>`); `meta` = 1: a record that changed only
    /// path, mode, mtime or xattrs; `uploaded` = 1: in the backing directory.
    /// Format 3 (sparse files: holes in chunk lists, see `ChunkList.encoded`), on inodes:
    /// `allocated` = bytes of the current content not in holes (NULL: as `size`).
    /// Format 4 (nothing loaded at open), on inodes: `nlink`, and `parent`/`name`, the
    /// primary name (the entry its path goes through; NULL for the root and unlinked).
    /// Format 6 (journal generations), on sync_peers: `generation`; on versions: `lineage`,
    /// the record's dot and context (`Lineage.stored(device:)`; NULL for records made before).
    /// Format 11 (files on demand), on inodes: `absent`, bytes of the current content that
    /// are not on this device (0: everything is here, as in every store before); `keep`,
    /// the file's KeepPolicy (0 automatic, 1 pinned, 2 evicted).
    /// Format 12 (the cache limit), on inodes: `used`, when the file was last opened on
    /// this device (nanoseconds; 0: never), written in batches (`Store.noteUses`).
    /// Format 21 (own records enter the synced view in the sync step), on versions:
    /// `viewed` = 0 for a record of this device's a fold wrote and the view has not taken
    /// in yet; every older row is in the view.
    static let addedColumns = [
        ("versions", "kind", "INTEGER NOT NULL DEFAULT 1"), ("versions", "target", "TEXT"), ("versions", "xattrs", "BLOB"),
        ("versions", "meta", "INTEGER NOT NULL DEFAULT 0"), ("versions", "uploaded", "INTEGER NOT NULL DEFAULT 0"),
        ("inodes", "allocated", "INTEGER"),
        ("inodes", "nlink", "INTEGER NOT NULL DEFAULT 0"), ("inodes", "parent", "INTEGER"), ("inodes", "name", "TEXT"),
        ("sync_peers", "generation", "INTEGER NOT NULL DEFAULT 0"), ("versions", "lineage", "TEXT"),
        ("inodes", "absent", "INTEGER NOT NULL DEFAULT 0"), ("inodes", "keep", "INTEGER NOT NULL DEFAULT 0"),
        ("inodes", "used", "INTEGER NOT NULL DEFAULT 0"), ("versions", "viewed", "INTEGER NOT NULL DEFAULT 1"),
    ]
}

extension Schema {
    /// Brings a store of any earlier format to this one, in one transaction (a crash
    /// during an upgrade leaves the old store as it was).
    static func migrate(_ db: SQLiteDatabase) throws(StoreError) {
        try db.transaction { () throws(StoreError) in
            let exists = { (table: String) throws(StoreError) -> Bool in
                try db.rows("SELECT count(*) FROM sqlite_master WHERE name = ?", [.text(table)], { $0.int(0) }).first == 1
            }
            let format = try exists("settings")
                ? try db.rows("SELECT value FROM settings WHERE key = 'format'", []) { Int($0.text(0)) }.first ?? nil : nil
            let hadInodes = try exists("inodes"), hadVersions = try exists("versions")
            let hadHistories = try exists("histories"), hadDirectories = try exists("history_dirs")
            let hadView = try exists("view_current"), hadPending = try exists("pending")
            let hadPlaces = try exists("chunk_places"), hadTotals = try exists("content_totals")
            var hadLinks = false, versionsBefore13 = false
            // A table must have its new columns before an index on one of them is made.
            for table in ["versions", "inodes", "sync_peers"] where try exists(table) {
                let columns = Set(try db.rows("PRAGMA table_info(\(table))", []) { $0.text(1) })
                if table == "inodes" { hadLinks = columns.contains("nlink") }
                if table == "versions" { versionsBefore13 = columns.contains("device_id") }
                for (t, name, type) in addedColumns where t == table && !columns.contains(name) {
                    try db.execute("ALTER TABLE \(table) ADD COLUMN \(name) \(type)")
                }
            }
            // Format 13: the versions table is copied into its new layout (below); its old
            // indexes go with it.
            if versionsBefore13 {
                for index in ["versions_file", "versions_pending", "versions_upload"] { try db.execute("DROP INDEX IF EXISTS \(index)") }
                try db.execute("ALTER TABLE versions RENAME TO versions_12")
            }
            for statement in statements { try db.execute(statement) }
            // Format 13: ids as bytes and devices by number, before anything below reads a record.
            if versionsBefore13 || (format ?? 13) < 13 { try convertToFormat13(db, copyingVersions: versionsBefore13) }
            // Format 12: the totals start from one sum over the files (the triggers keep them).
            if !hadTotals { try Store.recountContentTotals(db) }
            if hadInodes && !hadLinks { try Store.computeLinks(db) }
            if hadHistories && !hadDirectories { try Store.buildHistoryDirectories(db) }
            if hadVersions && !hadView { try Replica.build(db) }
            // Before format 4 the change set was in memory only: one look at the whole tree.
            if hadInodes && !hadPending { try db.execute("REPLACE INTO settings(key, value) VALUES('full_scan', '1')") }
            // Before format 10 the positions were byte offsets into format-4 journals: a
            // format-5 reader starts each peer again from its checkpoint (the records held
            // here are skipped), and pruned records wait to be met there.
            if hadVersions && !hadPlaces {
                try db.execute("DELETE FROM sync_peers")
                try db.execute("UPDATE pruned_records SET seen = 0")
            }
        }
    }
}

extension Schema {
    /// Format 13: record ids, history ids and lists of parents as bytes (`IDs.swift`), and
    /// each version's device by number (`Store+Devices`), in the upgrade's transaction.
    /// `copyingVersions`: the old versions table (renamed `versions_12`) is copied into the
    /// new one in row order, converted, and dropped, which leaves its B-trees packed. The
    /// other tables' id columns are rewritten in place; a value already in bytes, or a
    /// directory's or symlink's node (`dir:`/`link:` text), stays as it is, so running it
    /// again changes nothing.
    static func convertToFormat13(_ db: SQLiteDatabase, copyingVersions: Bool) throws(StoreError) {
        try db.defineTextToBlob("ubq_id") { ID128(hex: $0)?.bytes }
        try db.defineTextToBlob("ubq_ids") { text in
            var bytes: [UInt8] = []
            for part in text.split(separator: ",") {
                guard let id = ID128(hex: part) else { return nil }
                bytes += id.bytes
            }
            return bytes
        }
        let start = ContinuousClock.now
        if copyingVersions {
            let count = try db.rows("SELECT count(*) FROM versions_12", []) { $0.int(0) }.first ?? 0
            log("ubiquity: upgrading the store to format 13 (ids as bytes, devices by number): \(count) versions")
            try db.execute("INSERT OR IGNORE INTO devices(device_id, device_name) SELECT DISTINCT device_id, device_name FROM versions_12")
            try db.execute("""
                INSERT INTO versions(row, id, file_id, parents, device, committed, mtime, mode, size, tombstone, local, path,
                                     chunks, durable, kind, target, xattrs, meta, uploaded, lineage)
                SELECT o.row, ubq_id(o.id), ubq_id(o.file_id), ubq_ids(o.parents), d.number, o.committed, o.mtime, o.mode,
                       o.size, o.tombstone, o.local, o.path, o.chunks, o.durable, o.kind, o.target, o.xattrs, o.meta,
                       o.uploaded, o.lineage
                FROM versions_12 o JOIN devices d ON d.device_id = o.device_id AND d.device_name = o.device_name
                ORDER BY o.row
                """)
            try db.execute("DROP TABLE versions_12")
        }
        for (table, columns) in [("inodes", ["file_id"]), ("histories", ["file_id"]), ("view_heads", ["node"]),
                                 ("view_awaited", ["id", "node"]), ("view_current", ["node"]), ("own_dots", ["node"]),
                                 ("pruned_records", ["id"])] {
            let assignments = columns.map { "\($0) = ubq_id(\($0))" }.joined(separator: ", ")
            try db.execute("UPDATE \(table) SET \(assignments)")
        }
        // The rows shrank: pages the indexes no longer use go back to the filesystem (a
        // store made at format 5 or later; older ones reuse them).
        try db.execute("PRAGMA incremental_vacuum")
        log("ubiquity: upgraded the store to format 13 in \(start.duration(to: .now).components.seconds) s")
    }
}
