import UbiquitySystem

/// The key-value store's state (format 8): one row per key ever written, the winning
/// write (a tombstone for a deleted key). The rows this device wrote are what it
/// publishes (`kvOwnEntries`); others' arrive through `kvMerge`. Every operation reads at
/// most the rows of the store, whose live part the limits bound (1,024 keys by default).
extension Store {
    static let kvSchema = [
        """
        CREATE TABLE IF NOT EXISTS kv(key TEXT PRIMARY KEY, type INTEGER NOT NULL, value BLOB NOT NULL,
                                      stamp INTEGER NOT NULL, device TEXT NOT NULL, device_name TEXT NOT NULL,
                                      tombstone INTEGER NOT NULL)
            WITHOUT ROWID
        """,
    ]

    /// Tombstones kept (newest first): a deleted key's tombstone must outlive the copies
    /// of its value on other devices, and a store that saw many short-lived keys must not
    /// grow without end. A device that was away while more keys than this were deleted
    /// may bring some of them back (README, "Key-value store and live queries").
    public static let kvTombstoneLimit = 4096

    /// How far ahead of this device's clock another device's stamp may be (30 days).
    static let kvMaxClockLead: Int64 = 30 * 86_400 * 1_000_000_000

    /// The longest key another device's entry may have (a name in `.kv/`); this device's
    /// own writes keep to `KVLimits.maxKeyBytes`.
    static let kvRemoteKeyLimit = 255

    private static let kvColumns = "key, type, value, stamp, device, tombstone, device_name"

    private static func kvEntry(_ r: SQLRow) -> KVEntry? {
        guard let type = KVType(rawValue: Int(r.int(1))) else { return nil }
        return KVEntry(key: r.text(0), type: type, value: r.blob(2), stamp: KVStamp(time: r.int(3), device: r.deviceID(4), deviceName: r.text(6)),
                       isTombstone: r.int(5) != 0)
    }

    /// The key's entry, a tombstone included.
    public func kvEntry(_ key: String) throws(StoreError) -> KVEntry? {
        try db.rows("SELECT \(Self.kvColumns) FROM kv WHERE key = ?", [.text(key)], Self.kvEntry).first ?? nil
    }

    /// The live entries, by key.
    public func kvEntries() throws(StoreError) -> [KVEntry] {
        try db.rows("SELECT \(Self.kvColumns) FROM kv WHERE tombstone = 0 ORDER BY key", [], Self.kvEntry).compactMap { $0 }
    }

    /// Live keys and their bytes (keys' and values' together), as the limits count them.
    public func kvUsage() throws(StoreError) -> (keys: Int, bytes: Int) {
        try db.rows("SELECT count(*), coalesce(sum(length(CAST(key AS BLOB)) + length(value)), 0) FROM kv WHERE tombstone = 0", []) {
            (Int($0.int(0)), Int($0.int(1)))
        }.first ?? (0, 0)
    }

    /// Sets `key` to `content` read as `type` (canonical form, see `KeyValues`), within
    /// `limits`; a value that fails leaves the old one. Returns the new entry.
    @discardableResult
    public func kvSet(_ key: String, type: KVType, content: [UInt8], limits: KVLimits) throws(StoreError) -> KVEntry {
        do throws(KVError) {
            try KeyValues.check(key: key, limits: limits)
            if content.count > limits.maxValueBytes { throw .valueTooLarge(limit: limits.maxValueBytes, size: content.count) }
        } catch { throw .keyValue(error) }
        let value: [UInt8]
        do { value = try KeyValues.canonical(content, as: type) } catch { throw .keyValue(error) }
        if value.count > limits.maxValueBytes { throw .keyValue(.valueTooLarge(limit: limits.maxValueBytes, size: value.count)) }
        return try db.transaction { () throws(StoreError) -> KVEntry in
            let old = try kvEntry(key).flatMap { $0.isTombstone ? nil : $0 }
            let usage = try kvUsage()
            if old == nil && usage.keys >= limits.maxKeys { throw .keyValue(.tooManyKeys(limit: limits.maxKeys)) }
            let needed = usage.bytes - (old.map { key.utf8.count + $0.value.count } ?? 0) + key.utf8.count + value.count
            if needed > limits.maxTotalBytes {
                throw .keyValue(.totalTooLarge(limit: limits.maxTotalBytes, used: usage.bytes, needed: needed))
            }
            let entry = KVEntry(key: key, type: type, value: value, stamp: try nextKVStamp(), isTombstone: false)
            try kvWrite(entry)
            return entry
        }
    }

    /// Deletes `key` (a tombstone); false when it has no value.
    @discardableResult
    public func kvRemove(_ key: String) throws(StoreError) -> Bool {
        try db.transaction { () throws(StoreError) -> Bool in
            guard let old = try kvEntry(key), !old.isTombstone else { return false }
            try kvWrite(KVEntry(key: key, type: old.type, value: [], stamp: try nextKVStamp(), isTombstone: true))
            try kvTrimTombstones()
            return true
        }
    }

    /// Takes in entries another device published; returns the keys whose winner changed,
    /// with their old and new entries. An entry that does not hold (a bad key or type, a
    /// value that is not canonical) is skipped and named in `rejected`.
    public func kvMerge(_ entries: [KVEntry]) throws(StoreError) -> (changes: [KVChange], rejected: [String]) {
        var changes: [KVChange] = [], rejected: [String] = []
        var limits = KVLimits()
        limits.maxKeyBytes = Self.kvRemoteKeyLimit
        try db.transaction { () throws(StoreError) in
            var latest = try kvClock()
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
                if entry.stamp.time > clock().addingClamped(Self.kvMaxClockLead) {
                    rejected.append("\(String(reflecting: entry.key)): its stamp is more than 30 days ahead of this device's clock")
                    continue
                }
                latest = max(latest, entry.stamp.time)
                let old = try kvEntry(entry.key)
                if let old, old.stamp >= entry.stamp { continue }
                try kvWrite(entry)
                // A tombstone over a key this device never showed is no change to watch.
                if !(entry.isTombstone && (old?.isTombstone ?? true)) {
                    changes.append(KVChange(key: entry.key, old: old?.isTombstone == false ? old : nil, new: entry))
                }
            }
            try setKVClock(latest)
            try kvTrimTombstones()
        }
        return (changes, rejected)
    }

    /// The entries this device wrote that still win (tombstones included): what it
    /// publishes in the backing directory.
    public func kvOwnEntries() throws(StoreError) -> [KVEntry] {
        try db.rows("SELECT \(Self.kvColumns) FROM kv WHERE device = ? ORDER BY key", [.device(deviceID)], Self.kvEntry).compactMap { $0 }
    }

    /// Whether this device's entries changed since they were last published.
    public var kvNeedsPublishing: Bool {
        get throws(StoreError) { try kvUnpublished() != nil }
    }

    /// The mark of this device's unpublished changes (a counter each own write moves on),
    /// nil when its published file is current.
    public func kvUnpublished() throws(StoreError) -> String? { try setting("kv_dirty") }

    /// The entries read when the mark was `generation` are published: the mark goes,
    /// unless a write moved it on meanwhile.
    public func kvPublished(_ generation: String) throws(StoreError) {
        try db.query("DELETE FROM settings WHERE key = 'kv_dirty' AND value = ?", [.text(generation)])
    }

    /// Runs a key-value change as its own commit: the batch is committed first, and if the
    /// change's commit fails it is rolled back, so a write close() reports as failed is
    /// never applied later by the group commit.
    public func kvCommitted<T>(_ body: () throws(StoreError) -> T) throws(StoreError) -> T {
        try commitBatch() // other changes: never rolled back below
        do {
            let result = try body()
            try commitBatch()
            return result
        } catch {
            abandonBatch()
            throw error
        }
    }

    private func kvWrite(_ e: KVEntry) throws(StoreError) {
        try db.query("REPLACE INTO kv(\(Self.kvColumns)) VALUES(?,?,?,?,?,?,?)",
                     [.text(e.key), .int(Int64(e.type.rawValue)), .blob(e.value), .int(e.stamp.time), .device(e.stamp.device),
                      .int(e.isTombstone ? 1 : 0), .text(e.stamp.deviceName)])
        if e.stamp.device == deviceID { try setSetting("kv_dirty", String((Int64(try kvUnpublished() ?? "") ?? 0) &+ 1)) }
    }

    private func kvTrimTombstones() throws(StoreError) {
        try db.query("""
            DELETE FROM kv WHERE tombstone = 1 AND key NOT IN
                (SELECT key FROM kv WHERE tombstone = 1 ORDER BY stamp DESC LIMIT \(Self.kvTombstoneLimit))
            """)
    }

    private func kvClock() throws(StoreError) -> Int64 { Int64(try setting("kv_clock") ?? "") ?? 0 }

    private func setKVClock(_ time: Int64) throws(StoreError) { try setSetting("kv_clock", String(time)) }

    /// The stamp of a new write: now, or just after the latest stamp seen (hybrid clock).
    private func nextKVStamp() throws(StoreError) -> KVStamp {
        let last = try kvClock()
        guard last < .max else { throw .keyValue(.badValue(.string, "the key-value clock is at its end")) }
        let time = max(clock(), last + 1)
        try setKVClock(time)
        return KVStamp(time: time, device: deviceID, deviceName: deviceName)
    }
}
