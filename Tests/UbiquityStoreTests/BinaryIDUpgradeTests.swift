import Testing
import TestSupport
@testable import UbiquityStore
import UbiquitySystem

extension SQLRow {
    /// A column as tests print it: ids (bytes) as hex, NULL as "-".
    func shown(_ column: Int32) -> String {
        if isNull(column) { return "-" }
        if isBlob(column) { return "x" + Hex.encode(blob(column)) }
        return text(column)
    }
}

/// Store format 13 keeps record ids, history ids and parent lists as bytes. A format-12
/// store (every id as 32 hex digits, parents comma-separated) is rewritten at open, in the
/// upgrade's transaction, and shows exactly what it showed before.
@Suite struct BinaryIDUpgradeTests {
    /// Every column that holds an id, as rows of text.
    static func dump(_ store: Store) throws -> [String] {
        var lines: [String] = []
        for (table, columns) in [("versions", "row, id, file_id, parents, path, device_id, device_name"), ("inodes", "id, file_id, head"),
                                 ("histories", "file_id, path, live"), ("view_heads", "node, row"),
                                 ("view_awaited", "id, node"), ("view_current", "node, row, path"), ("own_dots", "node, dot"),
                                 ("pruned_records", "id, device, seen")] {
            let n = Int32(columns.split(separator: ",").count)
            let from = table == "versions" ? (try store.db.rows("SELECT 1 FROM pragma_table_info('versions') WHERE name = 'device_id'", []) { _ in true }.isEmpty ? Store.versionsWithDevices : "versions") : table
            lines += try store.db.rows("SELECT \(columns) FROM \(from) ORDER BY 1, 2", []) { r in
                "\(table): " + (0..<n).map { r.shown($0) }.joined(separator: " ")
            }
        }
        return lines
    }

    /// Back to how format 12 wrote versions: the table as it was declared, ids as 32
    /// lowercase hex digits, parents joined by commas, the device's id and name in each row.
    static func writeAsFormat12(_ store: Store) throws {
        try store.db.execute("""
            CREATE TABLE versions_12(
                row INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, file_id TEXT NOT NULL,
                parents TEXT NOT NULL, device_id TEXT NOT NULL, device_name TEXT NOT NULL,
                committed INTEGER NOT NULL, mtime INTEGER NOT NULL, mode INTEGER NOT NULL,
                size INTEGER NOT NULL, tombstone INTEGER NOT NULL, local INTEGER NOT NULL,
                path TEXT NOT NULL, chunks BLOB NOT NULL, durable INTEGER NOT NULL DEFAULT 0,
                kind INTEGER NOT NULL DEFAULT 1, target TEXT, xattrs BLOB, meta INTEGER NOT NULL DEFAULT 0,
                uploaded INTEGER NOT NULL DEFAULT 0, lineage TEXT)
            """)
        let rows = try store.db.rows("SELECT row, id, file_id, parents, device_id, device_name FROM \(Store.versionsWithDevices)", []) {
            (row: $0.int(0), id: $0.versionID(1), node: $0.nodeID(2), parents: $0.versionIDs(3), device: $0.text(4), name: $0.text(5))
        }
        for r in rows {
            try store.db.query("""
                INSERT INTO versions_12 SELECT row, ?, ?, ?, ?, ?, committed, mtime, mode, size, tombstone, local, path, chunks,
                                               durable, kind, target, xattrs, meta, uploaded, lineage
                FROM versions WHERE row = ?
                """, [.text(r.id.hex), .text(r.node.description), .text(r.parents.map(\.hex).joined(separator: ",")),
                      .text(r.device), .text(r.name), .int(r.row)])
        }
        try store.db.execute("DROP TABLE versions")
        try store.db.execute("DROP TABLE devices")
        try store.db.execute("ALTER TABLE versions_12 RENAME TO versions")
        try store.db.execute("CREATE INDEX versions_file ON versions(file_id, committed)")
        try store.db.execute("CREATE INDEX versions_pending ON versions(durable) WHERE durable = 0")
        try store.db.execute("CREATE INDEX versions_upload ON versions(uploaded) WHERE uploaded = 0")
        for (table, column) in [("inodes", "file_id"), ("histories", "file_id"), ("view_heads", "node"), ("view_awaited", "id"),
                                ("view_awaited", "node"), ("view_current", "node"), ("own_dots", "node"), ("pruned_records", "id")] {
            try store.db.execute("UPDATE \(table) SET \(column) = lower(hex(\(column))) WHERE typeof(\(column)) = 'blob'")
        }
        try store.db.execute("UPDATE settings SET value = '12' WHERE key = 'format'")
    }

    /// Regression (review of format 13): a directory or symlink whose path begins with a
    /// combining mark read back as a file node of the zero id (`"dir:" + "\u{301}a"` does
    /// not have the prefix "dir:" as Swift compares characters), so each record of it left
    /// its parent a head: a conflict on every change.
    @Test func aNodeWhosePathBeginsWithACombiningMarkReadsBackAsItself() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let store = try Store(directory: dir.path, deviceName: "one")
        let name = "\u{301}a"
        let d = try store.create(parent: Store.rootInode, name: name, kind: .directory, mode: 0o755, uid: 1, gid: 1)
        _ = try store.create(parent: Store.rootInode, name: "\u{200D}l", kind: .symlink, mode: 0o777, uid: 1, gid: 1, target: "x")
        try store.recordLocalChanges(busy: [])
        var inode = try #require(store.inode(d.id))
        inode.mode = 0o700
        try store.update(inode)
        try store.recordLocalChanges(busy: [])
        #expect(try store.replica.heads(.directory(name)).count == 1)
        #expect(try store.replica.current(.directory(name))?.mode == 0o700)
        #expect(try store.replica.current(.symlink("\u{200D}l"))?.target == "x")
        #expect(try store.totalConflicts() == 0)
        let nodes = try store.db.rows("SELECT file_id FROM versions", []) { $0.nodeID(0) }
        #expect(Set(nodes) == [.directory(name), .symlink("\u{200D}l")])
    }

    @Test func aFormat12StoreGetsItsIdsAsBytesAndShowsTheSame() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        var before: [String] = [], versions: [Version] = [], hexDump: [String] = []
        var fileID = FileID.zero, last = VersionID.zero
        let other = DeviceID(hex: "ffffffffffffffff")!
        do {
            let store = try Store(directory: dir.path, deviceName: "old")
            let d = try store.create(parent: Store.rootInode, name: "docs", kind: .directory, mode: 0o755, uid: 1, gid: 1)
            let f = try store.create(parent: d.id, name: "a.txt", kind: .file, mode: 0o644, uid: 1, gid: 1)
            _ = try store.create(parent: Store.rootInode, name: "l", kind: .symlink, mode: 0o777, uid: 1, gid: 1, target: "docs")
            fileID = try #require(f.fileID)
            let first = try store.commit(f.id, content: ChunkList(), path: "docs/a.txt", local: false)
            last = try store.commit(f.id, content: ChunkList(), path: "docs/a.txt", local: false).id
            try store.recordLocalChanges(busy: [])
            // Another device's conflicting edit of the first version, and a record whose
            // parent has not arrived (awaited).
            let remote = { (id: VersionID, node: FileID, parents: [VersionID], path: String) in
                SyncRecord(id: id, node: .file(node), kind: .file, parents: parents, deviceID: other, deviceName: "other",
                           committed: 1, mtime: 1, mode: 0o644, isTombstone: false, isMeta: false, path: path)
            }
            try store.addRemote([remote(.new(), fileID, [first.id], "docs/a.txt"), remote(.new(), .new(), [.new(), .new()], "notes/b.txt")])
            try store.notePruned(id: .new(), device: other, uploaded: true)
            #expect(try store.totalConflicts() == 1)
            before = try Self.dump(store)
            let rows = try store.db.rows("SELECT row FROM versions ORDER BY row", []) { $0.int(0) }
            versions = try rows.compactMap { (row) throws(StoreError) in try store.version(row: row) }
            try Self.writeAsFormat12(store)
            hexDump = try Self.dump(store)
        }
        // The format-12 spelling: no id in bytes anywhere.
        #expect(!hexDump.contains { $0.contains(" x") || $0.contains(": x") }, "\(hexDump)")
        #expect(hexDump.contains { $0.hasPrefix("versions: ") && $0.contains(",") }, "two parents, comma-separated")

        let store = try Store(directory: dir.path)
        #expect(try store.setting("format") == String(Schema.formatVersion))
        // The versions table in its new layout: the device by number, no copy left behind.
        let columns = try store.db.rows("SELECT name FROM pragma_table_info('versions')", []) { $0.text(0) }
        #expect(columns.contains("device") && !columns.contains("device_id") && !columns.contains("device_name"))
        #expect(try store.db.rows("SELECT count(*) FROM sqlite_master WHERE name = 'versions_12'", []) { $0.int(0) }.first == 0)
        #expect(try store.db.rows("SELECT count(*) FROM devices", []) { $0.int(0) }.first == 2)
        #expect(try Self.dump(store) == before)
        let rows = try store.db.rows("SELECT row FROM versions ORDER BY row", []) { $0.int(0) }
        #expect(try rows.compactMap { (row) throws(StoreError) in try store.version(row: row) } == versions)
        #expect(try store.db.rows("SELECT count(*) FROM versions WHERE typeof(id) != 'blob' OR typeof(parents) != 'blob'", []) { $0.int(0) }.first == 0)
        #expect(try store.db.rows("SELECT count(*) FROM versions WHERE typeof(file_id) = 'text' AND file_id NOT LIKE 'dir:%' AND file_id NOT LIKE 'link:%'", []) { $0.int(0) }.first == 0)
        // The history goes on from where it was.
        let docs = try #require(store.child(Store.rootInode, "docs"))
        let file = try #require(store.child(docs, "a.txt"))
        let next = try store.commit(file, content: ChunkList(), path: "docs/a.txt", local: false)
        #expect(next.parents == [last])
        #expect(try store.versions(of: fileID).count == 4) // two saves, the other device's, this one
        #expect(try store.replica.current(.file(fileID))?.id == next.id)
        #expect(try store.conflictedPaths() == ["docs/a.txt"])
        #expect(try Fsck.run(store: store).problems.isEmpty)
    }
}
