import Glibc
import UbiquityBacking
import UbiquityStore
import UbiquitySystem

/// The key-value store in the backing store (docs/FORMAT.md, "Key-value store"): each
/// device keeps one file, `devices/<id>/keyvalue-<generation>`, with the entries it wrote
/// that still win (tombstones too), written whole as a new generation when they change. A
/// reader merges every other device's file into its store by the entries' stamps, so all
/// devices that read the same files agree, in any order, however often they read them.
/// The file is bounded by the store's limits (a value of 1 MiB at most, 1 MiB in all),
/// so a whole-file exchange costs what the store holds, never what the tree holds.
enum KeyValueCodec {
    static let header = "ubiquity-keyvalue 1\n"
    /// The largest file read: 1 MiB of values doubled by hex, 4,096 tombstones and the
    /// lines' keys, with room for a device whose limits are larger.
    static let maxFileSize = 16 << 20

    static func encode(_ entries: [KVEntry]) -> [UInt8] {
        var out = header
        for e in entries {
            var body = "key=\(RecordCodec.percent(e.key)) type=\(e.type.name) stamp=\(e.stamp.time) name=\(RecordCodec.percent(e.stamp.deviceName))"
            if e.isTombstone { body += " tomb=1" } else { body += " value=\(Hex.encode(e.value))" }
            out += "K1 \(RecordCodec.checksum(Array(body.utf8), hexDigits: 32)) \(body)\n"
        }
        return Array(out.utf8)
    }

    /// The entries of `device`'s file, and why each rejected line was rejected.
    static func decode(_ bytes: [UInt8], device: DeviceID) -> (entries: [KVEntry], rejected: [String]) {
        var entries: [KVEntry] = [], rejected: [String] = []
        var lines = bytes.split(separator: UInt8(ascii: "\n"), omittingEmptySubsequences: false)
        // A file is written whole and renamed into place: it ends with a newline.
        if lines.last?.isEmpty == true { lines.removeLast() } else { rejected.append("the file does not end with a newline") }
        guard let first = lines.first, Array(first) + [UInt8(ascii: "\n")] == Array(header.utf8) else {
            return ([], ["not a key-value file of format 1"])
        }
        for (n, line) in lines.dropFirst().enumerated() {
            switch entry(Array(line), device: device) {
            case .success(let e): entries.append(e)
            case .failure(let why): rejected.append("line \(n + 2): \(why.description)")
            }
        }
        return (entries, rejected)
    }

    private static func entry(_ line: [UInt8], device: DeviceID) -> Result<KVEntry, RecordCodec.Rejection> {
        guard line.count > 36, line.starts(with: Array("K1 ".utf8)), line[35] == 0x20 else {
            return .failure(RecordCodec.Rejection("not a K1 line"))
        }
        let body = Array(line[36...])
        guard RecordCodec.checksum(body, hexDigits: 32).utf8.elementsEqual(line[3..<35]) else {
            return .failure(RecordCodec.Rejection("checksum mismatch"))
        }
        var fields: [String: String] = [:]
        for part in body.split(separator: 0x20) {
            guard let eq = part.firstIndex(of: UInt8(ascii: "=")) else { return .failure(RecordCodec.Rejection("field without '='")) }
            let key = String(decoding: part[part.startIndex..<eq], as: UTF8.self)
            guard fields[key] == nil else { return .failure(RecordCodec.Rejection("repeated key \(key)")) }
            fields[key] = String(decoding: part[(eq + 1)...], as: UTF8.self)
        }
        guard let keyText = fields["key"], let key = RecordCodec.unpercent(keyText) else { return .failure(RecordCodec.Rejection("bad key")) }
        guard let typeName = fields["type"], let type = KVType(name: typeName) else { return .failure(RecordCodec.Rejection("bad type")) }
        guard let stampText = fields["stamp"], let time = Int64(stampText), time > 0 else { return .failure(RecordCodec.Rejection("bad stamp")) }
        let tomb = fields["tomb"] == "1"
        if fields["tomb"] != nil && !tomb { return .failure(RecordCodec.Rejection("bad tomb")) }
        var value: [UInt8] = []
        if !tomb {
            guard let hex = fields["value"], let bytes = Hex.decode(hex) else { return .failure(RecordCodec.Rejection("bad value")) }
            value = bytes
        } else if fields["value"] != nil {
            return .failure(RecordCodec.Rejection("a tombstone with a value"))
        }
        let name = fields["name"].flatMap(RecordCodec.unpercent) ?? ""
        return .success(KVEntry(key: key, type: type, value: value, stamp: KVStamp(time: time, device: device, deviceName: name),
                                isTombstone: tomb))
    }
}

extension SyncEngine {
    static let keyValueGenerationKey = "kv_generation"

    /// The key-value store, under its own lock (never the store's).
    private var keyValues: KeyValueTable { shared.keyValues }

    /// Takes in the key-value files of other devices that changed since last read (the
    /// listing of `devices/` names each device's newest generation). A device's file that
    /// cannot be read is logged and skipped (the others, and this device's own
    /// publishing, go on).
    func pullKeyValues(_ listing: Backing.Devices) throws(StoreError) {
        for (device, generations) in listing.keyValues.sorted(by: { $0.key < $1.key }) where device != backing.deviceID {
            guard let newest = generations.max(), memory.keyValueSeen[device] != newest else { continue }
            do { try pullKeyValues(of: device, generation: newest) } catch {
                logOnce("ubiquity: sync: the key-value file of device \(device): \(error)")
            }
        }
    }

    private func pullKeyValues(of device: DeviceID, generation: UInt64) throws(StoreError) {
        let key = Backing.keyValueKey(device, generation: generation)
        guard let bytes = try backing.object(key) else { return } // replaced meanwhile
        guard bytes.count <= KeyValueCodec.maxFileSize else {
            logOnce("ubiquity: sync: \(key) is \(bytes.count) bytes, more than a key-value file can be: not read")
            memory.keyValueSeen[device] = generation
            return
        }
        let (entries, rejected) = KeyValueCodec.decode(bytes, device: device)
        for why in rejected.prefix(5) { logOnce("ubiquity: sync: \(key): \(why)") }
        let merged = try keyValues.merge(entries)
        var changes = TreeChanges()
        changes.keyValues = merged.changes
        shared.announce(changes)
        for why in merged.rejected.prefix(5) { logOnce("ubiquity: sync: \(key): \(why)") }
        memory.keyValueSeen[device] = generation
    }

    /// Publishes this device's entries when they changed, as a new generation of its
    /// file (then the older one is deleted), once the values are durable (a power loss
    /// must not take back a value other devices have taken). Returns whether it did.
    func pushKeyValues() throws(StoreError) -> Bool {
        guard try keyValues.unpublished() != nil else { return false }
        // The generation taken before a crash (or a power loss) may be gone from the store
        // while its PUT landed: this session's first publish looks at what is there.
        if memory.ownKeyValueListed == nil {
            memory.ownKeyValueListed = try backing.keyValueGenerations(of: backing.deviceID).max() ?? 0
        }
        guard let (marker, entries) = try keyValues.unpublishedEntries() else { return false }
        // Each attempt takes a generation of its own before its PUT, as a segment's name
        // is reserved: a PUT that seemed to fail may have landed and been read, and a
        // reader does not read a generation it has read again, so other entries under
        // that name would never reach it.
        let generation = try shared.withLedger { (store) throws(StoreError) -> UInt64 in
            let stored = try store.setting(Self.keyValueGenerationKey).flatMap { UInt64($0) } ?? 0
            let newest = max(stored, memory.ownKeyValueListed ?? 0)
            // The listing is the backing store's word: a name at the last number there is
            // has no successor (refused, not a trap).
            guard newest < UInt64.max else {
                throw .invalidContent("devices/\(backing.deviceID.hex)/ holds key-value generation \(String(newest, radix: 16)), the last there is: nothing can follow it")
            }
            // Committed before the PUT (as a segment's number): a batch that failed after it
            // would give the generation back, and this session's next publish would reuse
            // it. A power loss may still take it back; the listing at the next mount covers
            // that.
            try store.setSetting(Self.keyValueGenerationKey, String(newest + 1))
            try store.commitSettings()
            return newest + 1
        }
        memory.ownKeyValueListed = max(memory.ownKeyValueListed ?? 0, generation)
        try keyValues.makeDurable()
        let key = Backing.keyValueKey(backing.deviceID, generation: generation)
        let bytes = KeyValueCodec.encode(entries)
        try backing.call("put \(key)") { () throws(BackingError) in try backing.store.put(key, bytes) }
        // Published: unless a write came meanwhile (the next cycle publishes it). A
        // failure above leaves the mark, so the next cycle that reaches the store (or the
        // next mount, after a crash) publishes again.
        // The announcement owed first, committed: a crash between the two then publishes
        // again, where the other order could leave the new file unannounced.
        try shared.withLedger { (store) throws(StoreError) in
            try store.setSetting(Self.announceKey, "1")
            try store.commitSettings()
        }
        try keyValues.published(marker)
        // The previous attempt's file, if it landed. One older than that (the previous
        // attempt failed) is the gc's, as are files this device could not delete.
        if generation > 1 {
            do { try backing.delete(Backing.keyValueKey(backing.deviceID, generation: generation - 1)) } catch {
                logOnce("ubiquity: sync: could not delete the previous key-value file: \(error) (the next gc deletes it)")
            }
        }
        return true
    }
}
