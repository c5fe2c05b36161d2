import Glibc
import Testing
import TestSupport
import UbiquitySystem
@testable import UbiquityStore

/// Format 20 moved the key-value store out of `meta.sqlite` into `kv.sqlite`
/// (`KeyValueTable.upgrade`). A store of format 19 is made here by moving the rows back,
/// and every state a crash can leave the upgrade in is opened.
@Suite struct KeyValueUpgradeTests {
    /// A store with three keys (one deleted) and an unpublished mark, turned back into
    /// format 19: the table and its settings in `meta.sqlite`, no `kv.sqlite`. Returns
    /// the entries (tombstone included) and the mark.
    static func formatNineteen(_ dir: String) throws -> (entries: [KVEntry], mark: String) {
        let entries: [KVEntry], mark: String
        do {
            let store = try Store(directory: dir, deviceName: "old")
            let kv = store.keyValues
            try kv.set("color", type: .integer, content: Array("2".utf8), limits: KVLimits())
            try kv.set("name", type: .string, content: Array("Ada".utf8), limits: KVLimits())
            try kv.set("gone", type: .string, content: [], limits: KVLimits())
            try kv.remove("gone")
            entries = try ["color", "gone", "name"].map { try #require(try kv.entry($0)) }
            mark = try #require(try kv.unpublished())
        }
        let meta = try SQLiteDatabase(path: dir + "/meta.sqlite")
        try meta.execute("""
            CREATE TABLE kv(key TEXT PRIMARY KEY, type INTEGER NOT NULL, value BLOB NOT NULL,
                            stamp INTEGER NOT NULL, device TEXT NOT NULL, device_name TEXT NOT NULL,
                            tombstone INTEGER NOT NULL) WITHOUT ROWID
            """)
        try meta.query("ATTACH DATABASE ? AS new", [.text(dir + "/kv.sqlite")])
        try meta.execute("INSERT INTO kv SELECT key, type, value, stamp, device, device_name, tombstone FROM new.kv")
        try meta.execute("INSERT INTO settings(key, value) SELECT 'kv_' || key, value FROM new.kv_state")
        try meta.execute("DETACH DATABASE new")
        try meta.execute("UPDATE settings SET value = '19' WHERE key = 'format'")
        for suffix in ["", "-wal", "-shm"] { unlink(dir + "/kv.sqlite" + suffix) }
        return (entries, mark)
    }

    static func metaHasTable(_ dir: String) throws -> Bool {
        let meta = try SQLiteDatabase(path: dir + "/meta.sqlite", readOnly: true)
        let tables = try meta.rows("SELECT count(*) FROM sqlite_master WHERE name = 'kv'", []) { $0.int(0) }.first ?? -1
        let settings = try meta.rows("SELECT count(*) FROM settings WHERE key LIKE 'kv_%'", []) { $0.int(0) }.first ?? -1
        return tables + settings > 0
    }

    static func check(_ store: Store, _ old: (entries: [KVEntry], mark: String)) throws {
        let kv = store.keyValues
        #expect(try ["color", "gone", "name"].map { try kv.entry($0) } == old.entries.map { $0 })
        #expect(try kv.entries().map(\.key) == ["color", "name"])
        #expect(try kv.unpublished() == old.mark, "this device's changes are still to publish")
        // The hybrid clock went with the rows: a new write stamps after every old one.
        let next = try kv.set("later", type: .string, content: [], limits: KVLimits())
        #expect(old.entries.allSatisfy { $0.stamp.time < next.stamp.time })
    }

    @Test func aFormat19StoreMovesItsKeysOnOpen() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let old = try Self.formatNineteen(dir.path)
        #expect(try Self.metaHasTable(dir.path))
        let store = try Store(directory: dir.path)
        try Self.check(store, old)
        #expect(try !Self.metaHasTable(dir.path), "the old table and its settings are gone from meta.sqlite")
        #expect(access(dir.path + "/kv.sqlite.new", F_OK) != 0)
        #expect(try store.setting("format") == String(Schema.formatVersion))
    }

    /// A crash while `kv.sqlite.new` was written (before its rename): the next open makes
    /// it again from the old table.
    @Test func aCrashBeforeTheRenameCopiesAgain() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let old = try Self.formatNineteen(dir.path)
        let partial = dir.path + "/kv.sqlite.new"
        let fd = open(partial, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        #expect(fd >= 0)
        _ = Array("SQLite format 3\0 and then nothing".utf8).withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        close(fd)
        let store = try Store(directory: dir.path)
        try Self.check(store, old)
        #expect(try !Self.metaHasTable(dir.path))
        #expect(access(partial, F_OK) != 0)
    }

    /// A crash after the rename, before the old table was dropped: `kv.sqlite` is the
    /// truth (the old table is never copied over it, whatever it holds), and it goes.
    @Test func aCrashAfterTheRenameDropsTheOldTable() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let old = try Self.formatNineteen(dir.path)
        try KeyValueTable.upgrade(path: dir.path + "/kv.sqlite", metaPath: dir.path + "/meta.sqlite")
        let meta = try SQLiteDatabase(path: dir.path + "/meta.sqlite")
        try meta.execute("UPDATE kv SET value = X'58' WHERE key = 'color'") // not what kv.sqlite holds
        let store = try Store(directory: dir.path)
        try Self.check(store, old)
        #expect(try !Self.metaHasTable(dir.path))
    }

    /// A `kv.sqlite-wal` left without its `kv.sqlite` (the database deleted by hand) is
    /// no WAL of the database the upgrade makes: SQLite would replay its frames into it.
    @Test func aStaleWALIsNotReplayedIntoTheNewDatabase() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        // A WAL that holds a key "ghost", kept while its connection had it open.
        var wal: [UInt8] = []
        do {
            let store = try Store(directory: dir.path, deviceName: "old")
            let kv = try SQLiteDatabase(path: dir.path + "/kv.sqlite")
            try kv.execute("PRAGMA wal_autocheckpoint=0")
            try kv.execute("INSERT INTO kv(key, type, value, stamp, device, device_name, tombstone) VALUES('ghost', 1, X'31', 1, '\(store.deviceID.hex)', 'old', 0)")
            wal = try #require(try readFile(dir.path + "/kv.sqlite-wal", limit: 1 << 24))
            try kv.execute("DELETE FROM kv WHERE key = 'ghost'")
        }
        let old = try Self.formatNineteen(dir.path)
        let fd = open(dir.path + "/kv.sqlite-wal", O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        #expect(fd >= 0)
        _ = wal.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        close(fd)
        let store = try Store(directory: dir.path)
        #expect(try store.keyValues.entry("ghost") == nil)
        try Self.check(store, old)
    }

    /// A read-only open (status, fsck) of a store not yet opened at format 20 changes
    /// nothing, and says what to do if asked for a key.
    @Test func aReadOnlyOpenLeavesTheOldTable() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        _ = try Self.formatNineteen(dir.path)
        let store = try Store(directory: dir.path, readOnly: true)
        #expect(throws: StoreError.self) { try store.keyValues.entries() }
        #expect(try Self.metaHasTable(dir.path))
        #expect(access(dir.path + "/kv.sqlite", F_OK) != 0)
    }
}
