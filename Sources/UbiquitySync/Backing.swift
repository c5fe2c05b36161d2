import Glibc
import UbiquityBacking
import UbiquityStore
import UbiquitySystem

/// The backing store's layout, backing format 5 (docs/FORMAT.md): FORMAT, packs of chunks,
/// the log of journal segments, each device's checkpoints and key-value files, and the
/// collector's fossil markers. Every byte goes through `BackingStore` (a directory or an
/// S3 bucket hold the same keys); every failure becomes `StoreError.io` naming the key,
/// which the engine treats as "offline" and retries.
struct Backing {
    /// Format 2 adds holes to file records; 3 carries small chunks inside their records;
    /// 4 collects the directory (journal generations, fossils by rename); 5 stores
    /// everything as objects written once, whole (packs, log segments, checkpoints,
    /// fossil markers), so that an S3 bucket can hold it. A device upgrades an older
    /// store when it first opens it (after writing a checkpoint of its records), so
    /// devices still on an older format stop with "upgrade ubiquity".
    static let formatVersion = 5
    static var formatLine: String { "ubiquity-backing \(formatVersion)\n" }
    /// Format 6 is format 5 with every object but FORMAT and `keys/` sealed
    /// (`EncryptedStore`); a container is made encrypted when it is first used, never
    /// after, so plain containers stay at 5 and older programs refuse encrypted ones.
    static let encryptedFormatVersion = 6
    public static var encryptedFormatLine: String { "ubiquity-backing \(encryptedFormatVersion)\n" }
    static let formatKey = BackingKey(checked: "FORMAT")

    let store: any BackingStore
    let deviceID: DeviceID

    var location: String { store.location }
    /// Whether objects go through an `EncryptedStore` (the daemon unlocked the container).
    var encrypted: Bool { store.find(EncryptedStore.self) != nil }

    /// The format number FORMAT's bytes name; nil if they name none.
    static func formatNumber(_ bytes: [UInt8]) -> Int? {
        let line = String(decoding: bytes, as: UTF8.self)
        guard line.hasPrefix("ubiquity-backing ") else { return nil }
        return Int(line.dropFirst("ubiquity-backing ".count).prefix { $0.isNumber })
    }

    public static func isEncryptedFormat(_ bytes: [UInt8]) -> Bool { formatNumber(bytes) == encryptedFormatVersion }

    /// Reads FORMAT: nil for an empty store (FORMAT is then written), else its version,
    /// which must not be newer than this program's. An encrypted store must be opened
    /// encrypted, and a store opened encrypted must say so: a FORMAT replaced by a plain
    /// one would otherwise have this device write plaintext into it.
    func open() throws(StoreError) -> Int? {
        var found = try object(Self.formatKey)
        if found == nil {
            let line = encrypted ? Self.encryptedFormatLine : Self.formatLine
            let wrote = try call("put FORMAT") { () throws(BackingError) -> Bool in
                do throws(BackingError) { try store.put(Self.formatKey, Array(line.utf8), ifAbsent: true) } catch {
                    if case .exists = error { return false }
                    throw error
                }
                return true
            }
            if wrote { return nil }
            // Another device wrote it first (perhaps making the container encrypted):
            // its FORMAT is checked as any other.
            found = try object(Self.formatKey)
        }
        guard let text = found else {
            throw .io(errno: EIO, "\(location)/FORMAT: the store says it exists, yet it cannot be read")
        }
        guard let version = Self.formatNumber(text) else {
            throw .unsupportedFormat("\(location)/FORMAT does not name a ubiquity backing format")
        }
        if version > Self.encryptedFormatVersion {
            throw .unsupportedFormat("the backing store \(location) has format \(version); this ubiquity understands up to \(Self.encryptedFormatVersion): upgrade ubiquity")
        }
        if version == Self.encryptedFormatVersion && !encrypted {
            throw .unsupportedFormat("the backing store \(location) is encrypted: mount it with its passphrase")
        }
        if version != Self.encryptedFormatVersion && encrypted {
            throw .unsupportedFormat("the backing store \(location) says it is not encrypted (format \(version)), but this device opened it encrypted: nothing is written to it (was its FORMAT replaced?)")
        }
        if version < 4 {
            throw .unsupportedFormat("the backing store \(location) has format \(version): open it with ubiquity of backing format 4 first, which upgrades it")
        }
        return version
    }

    /// Marks the store as format 5 (after this device's records are in a checkpoint).
    func writeFormat() throws(StoreError) {
        try call("put FORMAT") { () throws(BackingError) in try store.put(Self.formatKey, Array(Self.formatLine.utf8)) }
    }

    // MARK: the log

    /// The largest segment or checkpoint part read: a writer keeps them under
    /// `partSize`, and one record (a file of about 200 GiB names 50,000 chunks) fits.
    static let maxObjectRead: Int64 = 256 << 20
    /// Where a writer ends a segment or a checkpoint part.
    static let partSize = 4 << 20

    func putSegment(_ name: SegmentLog.SegmentName, _ bytes: [UInt8]) throws(StoreError) {
        try call("put \(name.key)") { () throws(BackingError) in try store.put(name.key, bytes, ifAbsent: true) }
    }

    /// A segment's bytes; nil when it is gone (collected since it was listed).
    func segment(_ name: SegmentLog.SegmentName) throws(StoreError) -> [UInt8]? {
        try object(name.key)
    }

    func object(_ key: BackingKey) throws(StoreError) -> [UInt8]? {
        let bytes: [UInt8]
        do { bytes = try store.get(key, range: 0..<Self.maxObjectRead + 1) } catch {
            if case .notFound = error { return nil }
            throw Self.storeError(error, "get \(key)")
        }
        guard Int64(bytes.count) <= Self.maxObjectRead else {
            throw .io(errno: EFBIG, "\(location)/\(key): more than \(Self.maxObjectRead) bytes: not read")
        }
        return bytes
    }

    // MARK: devices/: checkpoints and key-value files

    /// `devices/<device>/checkpoint-<seq>/<part>` (8 digits) and `.../end`, written last.
    static func checkpointKey(_ device: DeviceID, seq: UInt64, part: String) -> BackingKey {
        BackingKey(checked: "devices/\(device.hex)/checkpoint-\(SegmentLog.SegmentName.seqText(seq))/\(part)")
    }

    static func partName(_ n: Int) -> String {
        let digits = String(n)
        return String(repeating: "0", count: max(0, 8 - digits.count)) + digits
    }

    static func keyValueKey(_ device: DeviceID, generation: UInt64) -> BackingKey {
        BackingKey(checked: keyValuePrefix(device) + SegmentLog.SegmentName.seqText(generation))
    }

    private static func keyValuePrefix(_ device: DeviceID) -> String { "devices/\(device.hex)/keyvalue-" }

    /// The key-value generations of `device` in the store (one listing of their prefix).
    func keyValueGenerations(of device: DeviceID) throws(StoreError) -> [UInt64] {
        let prefix = Self.keyValuePrefix(device)
        let found = try call("list \(prefix)") { () throws(BackingError) in try store.listAll(prefix: prefix) }
        return found.compactMap { UInt64($0.key.path.dropFirst(prefix.utf8.count), radix: 16) }
    }

    /// What `devices/` holds: per device its complete checkpoints (seq → parts) and its
    /// key-value generations, and the keys left by format 4 (journals) there.
    struct Devices {
        var checkpoints: [DeviceID: [UInt64: Int]] = [:]
        var keyValues: [DeviceID: [UInt64]] = [:]
        var legacyJournals: [BackingKey] = []
        var ignored: [String] = []
        /// Keys of checkpoints without their `end` (being written, or left by a crash).
        var partial: [DeviceID: [UInt64: [BackingKey]]] = [:]

        var devices: Set<DeviceID> { Set(checkpoints.keys).union(keyValues.keys) }

        func newestCheckpoint(of device: DeviceID) -> (seq: UInt64, parts: Int)? {
            checkpoints[device]?.max { $0.key < $1.key }.map { ($0.key, $0.value) }
        }
    }

    /// One listing of `devices/` (a page per 1,000 keys: a few per device).
    func devices() throws(StoreError) -> Devices {
        let all = try call("list devices/") { () throws(BackingError) in try store.listAll(prefix: "devices/") }
        var result = Devices()
        var parts: [DeviceID: [UInt64: (count: Int, end: Int?, keys: [BackingKey], tooBig: Bool)]] = [:]
        for info in all {
            let components = info.key.path.split(separator: "/")
            guard components.count >= 3, let device = DeviceID(hex: components[1]) else {
                if components.count >= 2 { result.ignored.append(String(components[1])) }
                continue
            }
            let name = components[2]
            if components.count == 3 {
                if name.hasPrefix("keyvalue-"), let gen = UInt64(name.dropFirst("keyvalue-".count), radix: 16) {
                    result.keyValues[device, default: []].append(gen)
                } else if name == "journal" || name.hasPrefix("journal.") {
                    result.legacyJournals.append(info.key)
                }
            } else if components.count == 4, name.hasPrefix("checkpoint-"),
                      name.utf8.count == "checkpoint-".utf8.count + 16,
                      let seq = UInt64(name.dropFirst("checkpoint-".count), radix: 16) {
                var entry = parts[device, default: [:]][seq] ?? (0, nil, [], false)
                entry.keys.append(info.key)
                // No writer makes a part that large: the checkpoint is damage, never read.
                if info.size > Self.maxObjectRead { entry.tooBig = true }
                if components[3] == "end" {
                    entry.end = Int(info.size)
                } else if components[3].utf8.count == 8, components[3].allSatisfy({ $0.isASCII && $0.isNumber }) {
                    entry.count += 1
                }
                parts[device, default: [:]][seq] = entry
            }
        }
        for (device, seqs) in parts {
            for (seq, entry) in seqs {
                if entry.tooBig {
                    result.ignored.append("\(device)/checkpoint-\(SegmentLog.SegmentName.seqText(seq)) (a part of more than \(Self.maxObjectRead) bytes)")
                } else if entry.end != nil {
                    result.checkpoints[device, default: [:]][seq] = entry.count
                } else {
                    result.partial[device, default: [:]][seq] = entry.keys
                }
            }
        }
        result.ignored = Array(Set(result.ignored)).sorted()
        return result
    }

    /// Lines of a checkpoint part (nil: gone, rewritten meanwhile).
    func checkpointPart(_ device: DeviceID, seq: UInt64, part: Int) throws(StoreError) -> [UInt8]? {
        try object(Self.checkpointKey(device, seq: seq, part: Self.partName(part)))
    }

    /// The checkpoint's `end`: its part count, which must match the listing.
    func checkpointEnd(_ device: DeviceID, seq: UInt64) throws(StoreError) -> (parts: Int, records: Int64)? {
        guard let bytes = try object(Self.checkpointKey(device, seq: seq, part: "end")) else { return nil }
        let text = String(decoding: bytes.prefix(200), as: UTF8.self)
        var fields: [String: Int64] = [:]
        for item in text.split(whereSeparator: { $0 == " " || $0 == "\n" }) {
            let pair = item.split(separator: "=")
            if pair.count == 2, let v = Int64(pair[1]), v >= 0 { fields[String(pair[0])] = v }
        }
        guard let parts = fields["parts"], parts <= 1 << 20, let records = fields["records"] else { return nil }
        return (Int(parts), records)
    }

    /// Writes a checkpoint part by part (`write` calls `add` with lines); `end` last.
    /// Returns (records, bytes). A part is at most about `partSize`.
    func writeCheckpoint(seq: UInt64, _ write: (_ add: ([String]) throws(StoreError) -> Void) throws(StoreError) -> Void) throws(StoreError) -> (Int64, Int64) {
        var buffer: [UInt8] = []
        var part = 0, records: Int64 = 0, bytes: Int64 = 0
        func flush() throws(StoreError) {
            let key = Self.checkpointKey(deviceID, seq: seq, part: Self.partName(part))
            let data = buffer
            try call("put \(key)") { () throws(BackingError) in try store.put(key, data) }
            bytes += Int64(buffer.count)
            part += 1
            buffer = []
        }
        try write { (lines) throws(StoreError) in
            for line in lines {
                buffer += Array(line.utf8)
                records += 1
                if buffer.count >= Self.partSize { try flush() }
            }
        }
        if !buffer.isEmpty || part == 0 { try flush() }
        let end = Array("parts=\(part) records=\(records)\n".utf8)
        let key = Self.checkpointKey(deviceID, seq: seq, part: "end")
        try call("put \(key)") { () throws(BackingError) in try store.put(key, end) }
        return (records, bytes)
    }

    /// Deletes a checkpoint: its `end` first (readers then see it as incomplete), then the parts.
    func deleteCheckpoint(_ device: DeviceID, seq: UInt64, parts: Int) throws(StoreError) {
        try delete(Self.checkpointKey(device, seq: seq, part: "end"))
        for part in 0..<parts { try delete(Self.checkpointKey(device, seq: seq, part: Self.partName(part))) }
    }

    func delete(_ key: BackingKey) throws(StoreError) {
        try call("delete \(key)") { () throws(BackingError) in try store.delete(key) }
    }

    // MARK: fossils

    /// `fossils/<pack>`: a collector found the pack named by no record at the time in its
    /// content (seconds since the epoch).
    static func fossilKey(_ pack: String) -> BackingKey { BackingKey(checked: "fossils/\(pack)") }

    /// The fossil markers present (pack → the stamp, read only by the collector: nil here).
    func fossils() throws(StoreError) -> [String: ObjectInfo] {
        let all = try call("list fossils/") { () throws(BackingError) in try store.listAll(prefix: "fossils/") }
        var result: [String: ObjectInfo] = [:]
        for info in all {
            let name = String(info.key.path.dropFirst("fossils/".count))
            if Pack.isName(name) { result[name] = info }
        }
        return result
    }

    // MARK: errors

    /// Runs a store call, its error as the StoreError the engine reports.
    func call<T>(_ what: String, _ body: () throws(BackingError) -> T) throws(StoreError) -> T {
        do { return try body() } catch { throw Self.storeError(error, what) }
    }

    /// The one place a backing store's error becomes the engine's: its kind is kept.
    static func storeError(_ error: BackingError, _ what: String) -> StoreError {
        let kind: BackingFailure.Kind
        switch error {
        case .notFound: kind = .notFound
        case .exists: kind = .exists
        case .permanent: kind = .permanent
        case .transient, .garbage: kind = .retryable
        }
        return .backing(BackingFailure(kind, request: what, answer: error.description))
    }
}
