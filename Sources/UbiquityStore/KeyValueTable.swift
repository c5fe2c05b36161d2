import Glibc
import UbiquitySystem

/// The key-value store's state: `kv.sqlite` in the store's directory (format 20; before,
/// the table was in `meta.sqlite`), under a lock of its own, so `.kv/` and the key-value
/// sync never wait for the namespace, the index or a fold, and no fold waits for them.
///
/// One row per key ever written, the winning write (a tombstone for a deleted key). The
/// rows this device wrote are what it publishes (`unpublishedEntries`); others' arrive
/// through `merge`. Every operation reads at most the rows of the store, whose live part
/// the limits bound (1,024 keys by default). Each change is a transaction of its own,
/// committed before the call returns: durable against a crash of the daemon then, and
/// against power loss after `makeDurable`, which the sync engine calls before it
/// publishes (another device must never take a value this one could lose).
public final class KeyValueTable: @unchecked Sendable {
    static let schema = [
        """
        CREATE TABLE IF NOT EXISTS kv(key TEXT PRIMARY KEY, type INTEGER NOT NULL, value BLOB NOT NULL,
                                      stamp INTEGER NOT NULL, device TEXT NOT NULL, device_name TEXT NOT NULL,
                                      tombstone INTEGER NOT NULL)
            WITHOUT ROWID
        """,
        // `clock`: the latest stamp seen (the hybrid clock); `dirty`: the mark of this
        // device's unpublished changes.
        "CREATE TABLE IF NOT EXISTS kv_state(key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    ]

    /// Tombstones kept (newest first): a deleted key's tombstone must outlive the copies
    /// of its value on other devices, and a store that saw many short-lived keys must not
    /// grow without end. A device that was away while more keys than this were deleted
    /// may bring some of them back (README, "Key-value store and live queries").
    public static let tombstoneLimit = 4096

    /// How far ahead of this device's clock another device's stamp may be (30 days).
    static let maxClockLead: Int64 = 30 * 86_400 * 1_000_000_000

    /// The longest key another device's entry may have (a name in `.kv/`); this device's
    /// own writes keep to `KVLimits.maxKeyBytes`.
    static let remoteKeyLimit = 255

    private static let columns = "key, type, value, stamp, device, tombstone, device_name"

    private struct State {
        /// nil: a read-only open of a store that has no `kv.sqlite` yet (never mounted at
        /// format 20); every use says so.
        var db: SQLiteDatabase?
        var clock: @Sendable () -> Nanos
    }

    private let state: Locked<State>
    /// Checkpoints of the WAL from a connection of its own, after a flush (`makeDurable`):
    /// never in a write, which a `.kv/` request makes under the filesystem's lock.
    private let checkpointer: WALCheckpointer
    public let path: String
    let deviceID: DeviceID
    let deviceName: String

    /// Opens `kv.sqlite` in `directory`, first making it from `meta.sqlite`'s old table
    /// when it does not exist (`upgrade`). Read-only: opened only if it exists.
    init(directory: String, deviceID: DeviceID, deviceName: String, clock: @escaping @Sendable () -> Nanos,
         readOnly: Bool) throws(StoreError) {
        path = directory + "/kv.sqlite"
        checkpointer = WALCheckpointer(path: path)
        self.deviceID = deviceID
        self.deviceName = deviceName
        var db: SQLiteDatabase?
        if readOnly {
            if access(path, F_OK) == 0 { db = try SQLiteDatabase(path: path, readOnly: true) }
        } else {
            try Self.upgrade(path: path, metaPath: directory + "/meta.sqlite")
            let opened = try SQLiteDatabase(path: path)
            try opened.execute("PRAGMA journal_mode=WAL")
            try opened.execute("PRAGMA synchronous=NORMAL")
            try opened.execute("PRAGMA wal_autocheckpoint=0")
            try opened.execute("PRAGMA journal_size_limit=\(SQLiteDatabase.walSizeLimit)")
            for statement in Self.schema { try opened.execute(statement) }
            db = opened
        }
        state = Locked(State(db: db, clock: clock), rank: .keyValues)
    }

    /// The clock new stamps read (tests set one).
    func setClock(_ clock: @escaping @Sendable () -> Nanos) { state.withLock { $0.clock = clock } }

    /// Runs `body` with the connection, under the lock.
    private func withDatabase<T>(_ body: (SQLiteDatabase, @Sendable () -> Nanos) throws(StoreError) -> T) throws(StoreError) -> T {
        try state.withLock { (s) throws(StoreError) -> T in
            guard let db = s.db else {
                throw .unsupportedFormat("\(path) does not exist yet: mount the store once so that ubiquity makes it")
            }
            return try body(db, s.clock)
        }
    }

    private static func entry(_ r: SQLRow) -> KVEntry? {
        guard let type = KVType(rawValue: Int(r.int(1))) else { return nil }
        return KVEntry(key: r.text(0), type: type, value: r.blob(2), stamp: KVStamp(time: r.int(3), device: r.deviceID(4), deviceName: r.text(6)),
                       isTombstone: r.int(5) != 0)
    }

    /// The key's entry, a tombstone included.
    public func entry(_ key: String) throws(StoreError) -> KVEntry? {
        try withDatabase { (db, _) throws(StoreError) in try Self.entry(key, db) }
    }

    private static func entry(_ key: String, _ db: SQLiteDatabase) throws(StoreError) -> KVEntry? {
        try db.rows("SELECT \(columns) FROM kv WHERE key = ?", [.text(key)], Self.entry).first ?? nil
    }

    /// The live entries, by key.
    public func entries() throws(StoreError) -> [KVEntry] {
        try withDatabase { (db, _) throws(StoreError) in
            try db.rows("SELECT \(Self.columns) FROM kv WHERE tombstone = 0 ORDER BY key", [], Self.entry).compactMap { $0 }
        }
    }

    /// Live keys and their bytes (keys' and values' together), as the limits count them.
    public func usage() throws(StoreError) -> (keys: Int, bytes: Int) {
        try withDatabase { (db, _) throws(StoreError) in try Self.usage(db) }
    }

    private static func usage(_ db: SQLiteDatabase) throws(StoreError) -> (keys: Int, bytes: Int) {
        try db.rows("SELECT count(*), coalesce(sum(length(CAST(key AS BLOB)) + length(value)), 0) FROM kv WHERE tombstone = 0", []) {
            (Int($0.int(0)), Int($0.int(1)))
        }.first ?? (0, 0)
    }

    /// Sets `key` to `content` read as `type` (canonical form, see `KeyValues`), within
    /// `limits`; a value that fails leaves the old one. Returns the new entry.
    @discardableResult
    public func set(_ key: String, type: KVType, content: [UInt8], limits: KVLimits) throws(StoreError) -> KVEntry {
        let value = try Self.value(of: key, type: type, content: content, limits: limits)
        return try withDatabase { (db, clock) throws(StoreError) -> KVEntry in
            try db.transaction { () throws(StoreError) -> KVEntry in try set(key, type: type, value: value, limits: limits, db, clock) }
        }
    }

    /// A change worked out from the key's live entry (nil: none), applied in the same
    /// hold, so that no merge of another device's value comes between the read and the
    /// write (a truncation, a change of type). `change` returns the type and content to
    /// set, or nil to leave the key as it is. Returns the new entry (nil: left).
    @discardableResult
    public func update(_ key: String, limits: KVLimits,
                       _ change: (KVEntry?) throws(StoreError) -> (type: KVType, content: [UInt8])?) throws(StoreError) -> KVEntry? {
        try withDatabase { (db, clock) throws(StoreError) -> KVEntry? in
            try db.transaction { () throws(StoreError) -> KVEntry? in
                guard let (type, content) = try change(try Self.entry(key, db).flatMap { $0.isTombstone ? nil : $0 }) else { return nil }
                let value = try Self.value(of: key, type: type, content: content, limits: limits)
                return try set(key, type: type, value: value, limits: limits, db, clock)
            }
        }
    }

    /// What `key` holds when set to `content` read as `type`: the key and the content's
    /// size checked against `limits`, then its canonical form (`KeyValues`), within the
    /// value limit too.
    private static func value(of key: String, type: KVType, content: [UInt8], limits: KVLimits) throws(StoreError) -> [UInt8] {
        do throws(KVError) {
            try KeyValues.check(key: key, limits: limits)
            if content.count > limits.maxValueBytes { throw .valueTooLarge(limit: limits.maxValueBytes, size: content.count) }
            let value = try KeyValues.canonical(content, as: type)
            if value.count > limits.maxValueBytes { throw .valueTooLarge(limit: limits.maxValueBytes, size: value.count) }
            return value
        } catch { throw .keyValue(error) }
    }

    /// Inside a transaction, under the lock: `value` (from `value(of:)`) set if the key
    /// count and byte limits allow.
    private func set(_ key: String, type: KVType, value: [UInt8], limits: KVLimits, _ db: SQLiteDatabase,
                     _ clock: @Sendable () -> Nanos) throws(StoreError) -> KVEntry {
        let old = try Self.entry(key, db).flatMap { $0.isTombstone ? nil : $0 }
        let usage = try Self.usage(db)
        if old == nil && usage.keys >= limits.maxKeys { throw .keyValue(.tooManyKeys(limit: limits.maxKeys)) }
        let needed = usage.bytes - (old.map { key.utf8.count + $0.value.count } ?? 0) + key.utf8.count + value.count
        if needed > limits.maxTotalBytes {
            throw .keyValue(.totalTooLarge(limit: limits.maxTotalBytes, used: usage.bytes, needed: needed))
        }
        let entry = KVEntry(key: key, type: type, value: value, stamp: try nextStamp(db, clock), isTombstone: false)
        try write(entry, db)
        return entry
    }

    /// Deletes `key` (a tombstone); false when it has no value.
    @discardableResult
    public func remove(_ key: String) throws(StoreError) -> Bool {
        try withDatabase { (db, clock) throws(StoreError) -> Bool in
            try db.transaction { () throws(StoreError) -> Bool in
                guard let old = try Self.entry(key, db), !old.isTombstone else { return false }
                try write(KVEntry(key: key, type: old.type, value: [], stamp: try nextStamp(db, clock), isTombstone: true), db)
                try Self.trimTombstones(db)
                return true
            }
        }
    }

    /// Takes in entries another device published; returns the keys whose winner changed,
    /// with their old and new entries. An entry that does not hold (a bad key or type, a
    /// value that is not canonical) is skipped and named in `rejected`.
    public func merge(_ entries: [KVEntry]) throws(StoreError) -> (changes: [KVChange], rejected: [String]) {
        var changes: [KVChange] = [], rejected: [String] = []
        var limits = KVLimits()
        limits.maxKeyBytes = Self.remoteKeyLimit
        try withDatabase { (db, clock) throws(StoreError) in
            try db.transaction { () throws(StoreError) in
                var latest = try Self.clockValue(db)
                for entry in entries {
                    do throws(KVError) {
                        try KeyValues.check(key: entry.key, limits: limits)
                        if !entry.isTombstone {
                            let canonical = try KeyValues.canonical(entry.value, as: entry.type)
                            if canonical != entry.value { throw .badValue(entry.type, "not in canonical form") }
                        }
                    } catch {
                        rejected.append("\(String(reflecting: entry.key)): \(error)")
                        continue
                    }
                    if entry.isTombstone && !entry.value.isEmpty { rejected.append("\(String(reflecting: entry.key)): a tombstone with a value"); continue }
                    // A stamp from a clock far ahead would win over every write for as long,
                    // and could run the hybrid clock to its end: refused (logged).
                    if entry.stamp.time > clock().addingClamped(Self.maxClockLead) {
                        rejected.append("\(String(reflecting: entry.key)): its stamp is more than 30 days ahead of this device's clock")
                        continue
                    }
                    latest = max(latest, entry.stamp.time)
                    let old = try Self.entry(entry.key, db)
                    if let old, old.stamp >= entry.stamp { continue }
                    try write(entry, db)
                    // A tombstone over a key this device never showed is no change to watch.
                    if !(entry.isTombstone && (old?.isTombstone ?? true)) {
                        changes.append(KVChange(key: entry.key, old: old?.isTombstone == false ? old : nil, new: entry))
                    }
                }
                try Self.setState("clock", String(latest), db)
                try Self.trimTombstones(db)
            }
        }
        return (changes, rejected)
    }

    /// The entries this device wrote that still win (tombstones included): what it
    /// publishes in the backing directory.
    public func ownEntries() throws(StoreError) -> [KVEntry] {
        try withDatabase { (db, _) throws(StoreError) in try ownEntries(db) }
    }

    private func ownEntries(_ db: SQLiteDatabase) throws(StoreError) -> [KVEntry] {
        try db.rows("SELECT \(Self.columns) FROM kv WHERE device = ? ORDER BY key", [.device(deviceID)], Self.entry).compactMap { $0 }
    }

    /// The mark of this device's unpublished changes (a counter each own write moves on),
    /// nil when its published file is current.
    public func unpublished() throws(StoreError) -> String? {
        try withDatabase { (db, _) throws(StoreError) in try Self.stateValue("dirty", db) }
    }

    /// What to publish, read in one hold: the mark of the unpublished changes and this
    /// device's entries (nil when its published file is current).
    public func unpublishedEntries() throws(StoreError) -> (mark: String, entries: [KVEntry])? {
        try withDatabase { (db, _) throws(StoreError) -> (mark: String, entries: [KVEntry])? in
            guard let mark = try Self.stateValue("dirty", db) else { return nil }
            return (mark, try ownEntries(db))
        }
    }

    /// The entries read when the mark was `mark` are published: the mark goes, unless a
    /// write moved it on meanwhile.
    public func published(_ mark: String) throws(StoreError) {
        try withDatabase { (db, _) throws(StoreError) in
            try db.query("DELETE FROM kv_state WHERE key = 'dirty' AND value = ?", [.text(mark)])
        }
    }

    /// Makes every change committed so far durable against power loss: an fsync of the
    /// database's files, without the lock (nothing waits for the disk behind it); then a
    /// checkpoint of the WAL from a connection of its own (writes never checkpoint).
    public func makeDurable() throws(StoreError) {
        guard state.withLock({ $0.db != nil }) else { return }
        try SQLiteDatabase.syncCommitted(path: path)
        try checkpointer.run()
    }

    private func write(_ e: KVEntry, _ db: SQLiteDatabase) throws(StoreError) {
        try db.query("REPLACE INTO kv(\(Self.columns)) VALUES(?,?,?,?,?,?,?)",
                     [.text(e.key), .int(Int64(e.type.rawValue)), .blob(e.value), .int(e.stamp.time), .device(e.stamp.device),
                      .int(e.isTombstone ? 1 : 0), .text(e.stamp.deviceName)])
        if e.stamp.device == deviceID {
            try Self.setState("dirty", String((Int64(try Self.stateValue("dirty", db) ?? "") ?? 0) &+ 1), db)
        }
    }

    private static func trimTombstones(_ db: SQLiteDatabase) throws(StoreError) {
        try db.query("""
            DELETE FROM kv WHERE tombstone = 1 AND key NOT IN
                (SELECT key FROM kv WHERE tombstone = 1 ORDER BY stamp DESC LIMIT \(tombstoneLimit))
            """)
    }

    private static func stateValue(_ key: String, _ db: SQLiteDatabase) throws(StoreError) -> String? {
        try db.rows("SELECT value FROM kv_state WHERE key = ?", [.text(key)]) { $0.text(0) }.first
    }

    private static func setState(_ key: String, _ value: String, _ db: SQLiteDatabase) throws(StoreError) {
        try db.query("REPLACE INTO kv_state(key, value) VALUES(?, ?)", [.text(key), .text(value)])
    }

    private static func clockValue(_ db: SQLiteDatabase) throws(StoreError) -> Int64 { Int64(try stateValue("clock", db) ?? "") ?? 0 }

    /// The stamp of a new write: now, or just after the latest stamp seen (hybrid clock).
    private func nextStamp(_ db: SQLiteDatabase, _ clock: @Sendable () -> Nanos) throws(StoreError) -> KVStamp {
        let last = try Self.clockValue(db)
        guard last < .max else { throw .keyValue(.badValue(.string, "the key-value clock is at its end")) }
        let time = max(clock(), last + 1)
        try Self.setState("clock", String(time), db)
        return KVStamp(time: time, device: deviceID, deviceName: deviceName)
    }
}

extension KeyValueTable {
    /// Format 20 moved the table out of `meta.sqlite`. Each step survives a crash:
    /// 1. While `kv.sqlite` does not exist, the old table's rows and its two settings are
    ///    copied into `kv.sqlite.new` (one transaction with a rollback journal and
    ///    synchronous=FULL, durable at its commit), which is renamed `kv.sqlite`, and the
    ///    directory is flushed. A crash before the rename leaves a `kv.sqlite.new` that
    ///    the next open makes again from the start; a new store copies nothing.
    /// 2. Only then does the store drop the old table (`Store.dropMovedKeyValues`): a
    ///    crash between the rename and the drop leaves both, and the next open drops it.
    static func upgrade(path: String, metaPath: String) throws(StoreError) {
        guard access(path, F_OK) != 0 else { return }
        let fresh = path + ".new"
        for suffix in ["", "-journal", "-wal", "-shm"] { unlink(fresh + suffix) }
        do {
            let db = try SQLiteDatabase(path: fresh)
            try db.execute("PRAGMA synchronous=FULL")
            for statement in schema { try db.execute(statement) }
            try db.query("ATTACH DATABASE ? AS old", [.text(metaPath)])
            let hasOld = try db.rows("SELECT count(*) FROM old.sqlite_master WHERE type = 'table' AND name = 'kv'", []) { $0.int(0) }.first == 1
            if hasOld {
                try db.transaction { () throws(StoreError) in
                    try db.execute("""
                        INSERT INTO kv(\(columns)) SELECT \(columns) FROM old.kv
                        """)
                    try db.execute("""
                        INSERT INTO kv_state(key, value) SELECT substr(key, 4), value FROM old.settings
                            WHERE key IN ('kv_clock', 'kv_dirty')
                        """)
                }
                let count = try db.rows("SELECT count(*) FROM kv", []) { $0.int(0) }.first ?? 0
                log("ubiquity: upgrading the store to format 20: the key-value store (\(count) rows) moves to \(path)")
            }
            try db.execute("DETACH DATABASE old")
        } // closed here: its journal gone, its commit on disk
        // A WAL of a `kv.sqlite` that is gone is no WAL of this one: SQLite would replay it.
        for suffix in ["-wal", "-shm"] { unlink(path + suffix) }
        let directory = String(path[..<(path.lastIndex(of: "/") ?? path.startIndex)])
        guard rename(fresh, path) == 0 else { throw .io(errno: errno, "rename \(fresh) to \(path)") }
        try StoreError.wrap { () throws(SystemError) in try fsyncPath(directory, directory: true) }
    }
}

extension Store {
    /// Step 2 of `KeyValueTable.upgrade`: once `kv.sqlite` exists, the old table and its
    /// settings go from `meta.sqlite` (a no-op after the first time).
    static func dropMovedKeyValues(_ db: SQLiteDatabase) throws(StoreError) {
        guard try db.rows("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'kv'", [], { $0.int(0) }).first == 1 else {
            return
        }
        try db.transaction { () throws(StoreError) in
            try db.execute("DROP TABLE kv")
            try db.execute("DELETE FROM settings WHERE key IN ('kv_clock', 'kv_dirty')")
        }
    }
}
