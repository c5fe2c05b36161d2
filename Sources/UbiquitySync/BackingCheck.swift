import UbiquityBacking
import UbiquityStore
import UbiquitySystem

/// `ubiquity fsck --backing DIR|s3://...`: checks a backing store against backing format 5
/// (docs/FORMAT.md) without changing it. Every pack's index (one stat and two ranged GETs
/// each; `full` also reads every chunk and checks its hash), every segment and every
/// device's newest checkpoint (each line parses and checks; each device's segments
/// contiguous, or covered by its checkpoint; each chunk place names a pack whose index
/// holds that chunk at that offset).
public enum BackingCheck {
    public struct Report: Sendable {
        public var packs = 0
        public var chunks = 0
        public var segments = 0
        public var checkpoints = 0
        public var records = 0
        public var places = 0
        public var problems: [String] = []

        public var summary: String {
            "\(packs) packs (\(chunks) chunks), \(segments) segments, \(checkpoints) checkpoints, \(records) records, \(places) chunk places checked"
        }
    }

    public static func run(store: any BackingStore, full: Bool = false,
                           progress: ((String, Int, Int) -> Void)? = nil) throws(StoreError) -> Report {
        var report = Report()
        // A check writes nothing, and only writing uses the backing's own device id: a new
        // one, which names no device there.
        let backing = Backing(store: store, deviceID: .new())
        guard let bytes = try backing.object(Backing.formatKey) else {
            report.problems.append("FORMAT is missing: not a backing store (or an empty one)")
            return report
        }
        let format = String(decoding: bytes.prefix(64), as: UTF8.self)
        if format == Backing.encryptedFormatLine && !backing.encrypted {
            report.problems.append("FORMAT says the container is encrypted: give its passphrase to check it")
            return report
        }
        guard format == (backing.encrypted ? Backing.encryptedFormatLine : Backing.formatLine) else {
            report.problems.append("FORMAT says \(RecordCodec.printable(String(format.prefix(40)))): this check knows formats \(Backing.formatVersion) and \(Backing.encryptedFormatVersion) (encrypted)")
            return report
        }
        if backing.encrypted { checkKeys(store, &report) }
        /// An object that cannot be read (damaged, failing authentication) is a problem
        /// of its own; the check goes on.
        func read(_ what: String, _ body: () throws(StoreError) -> [UInt8]?) -> [UInt8]? {
            do { return try body() } catch {
                report.problems.append("\(what): \(error)")
                return nil
            }
        }
        // Packs: their indexes, so places can be checked without reading chunks.
        let packList = try backing.call("list packs/") { () throws(BackingError) in try store.listAll(prefix: "packs/") }
        var index: [String: [Int64: (ChunkID, Int)]] = [:]
        for (i, info) in packList.enumerated() {
            let name = String(info.key.path.split(separator: "/").last ?? "")
            guard Pack.isName(name), info.key == Pack.key(name) else {
                report.problems.append("\(info.key): not a pack name")
                continue
            }
            report.packs += 1
            do {
                let locations = try Pack.index(name, in: store)
                var byOffset: [Int64: (ChunkID, Int)] = [:]
                for l in locations { byOffset[l.offset] = (l.id, l.length) }
                index[name] = byOffset
                report.chunks += locations.count
                if full {
                    for l in locations {
                        do { _ = try Pack.fetch(l, from: store) } catch { report.problems.append("pack \(name): \(error)") }
                    }
                }
            } catch {
                report.problems.append("pack \(name): \(error)")
            }
            progress?("packs", i + 1, packList.count)
        }
        func checkLines(_ bytes: [UInt8], device: DeviceID, source: String) {
            var lines = bytes.split(separator: UInt8(ascii: "\n"), omittingEmptySubsequences: false)
            if lines.last?.isEmpty == true { lines.removeLast() } else if !lines.isEmpty {
                report.problems.append("\(source): does not end with a newline")
                lines.removeLast()
            }
            for (n, line) in lines.enumerated() {
                switch RecordCodec.decode(line, journalDevice: device) {
                case .failure(let why): report.problems.append("\(source) line \(n + 1): \(why)")
                case .success(let record):
                    report.records += 1
                    for (id, place) in record.places {
                        report.places += 1
                        guard let entry = index[place.pack]?[place.offset] else {
                            report.problems.append("\(source) line \(n + 1): chunk \(id.hex) at \(place.pack):\(place.offset): no such chunk in the packs")
                            continue
                        }
                        let size = record.chunks.chunks.first { $0.0 == id }.map { Int($0.1) }
                        if entry.0 != id || (size != nil && size != entry.1) {
                            report.problems.append("\(source) line \(n + 1): chunk \(id.hex) at \(place.pack):\(place.offset): the pack holds another chunk there")
                        }
                    }
                }
            }
        }
        // Checkpoints: each device's newest.
        let devices = try backing.devices()
        for name in devices.ignored { report.problems.append("devices/\(RecordCodec.printable(name)): not a device's") }
        for device in devices.checkpoints.keys.sorted() {
            guard let newest = devices.newestCheckpoint(of: device) else { continue }
            // An end that cannot be read is a problem; its parts (as listed) are still read.
            do {
                guard let end = try backing.checkpointEnd(device, seq: newest.seq), end.parts == newest.parts else {
                    report.problems.append("devices/\(device)/checkpoint-\(newest.seq): its end does not match its parts")
                    continue
                }
            } catch {
                report.problems.append("devices/\(device)/checkpoint-\(newest.seq) end: \(error)")
            }
            for part in 0..<newest.parts {
                var missing = false
                let partBytes = read("devices/\(device)/checkpoint-\(newest.seq) part \(part)") { () throws(StoreError) -> [UInt8]? in
                    let bytes = try backing.checkpointPart(device, seq: newest.seq, part: part)
                    missing = bytes == nil
                    return bytes
                }
                if missing { report.problems.append("devices/\(device)/checkpoint-\(newest.seq): part \(part) is missing") }
                guard let bytes = partBytes else { continue }
                checkLines(bytes, device: device, source: "devices/\(device)/checkpoint-\(newest.seq) part \(part)")
            }
            report.checkpoints += 1
        }
        // Segments: names, contiguity per device (from its checkpoint on), lines.
        let log = try backing.call("list log/") { () throws(BackingError) in try store.listAll(prefix: "log/") }
        var seqs: [DeviceID: [UInt64]] = [:]
        for (i, info) in log.enumerated() {
            guard let name = SegmentLog.SegmentName(key: info.key) else {
                report.problems.append("\(info.key): not a segment name")
                continue
            }
            seqs[name.device, default: []].append(name.seq)
            report.segments += 1
            if info.size > Backing.maxObjectRead {
                report.problems.append("\(info.key): \(info.size) bytes, more than a segment can be")
                continue
            }
            // nil: collected meanwhile, or unreadable (a problem then).
            guard let bytes = read(info.key.path, { () throws(StoreError) -> [UInt8]? in try backing.segment(name) }) else { continue }
            checkLines(bytes, device: name.device, source: info.key.path)
            progress?("segments", i + 1, log.count)
        }
        // Fossil markers: each holds a time the collector reads.
        for (pack, _) in try backing.fossils().sorted(by: { $0.key < $1.key }) {
            let key = Backing.fossilKey(pack)
            if let bytes = read(key.path, { () throws(StoreError) -> [UInt8]? in try backing.object(key) }),
               Int64(String(decoding: bytes.prefix(20), as: UTF8.self).trimmingWhitespace) == nil {
                report.problems.append("\(key): not a time")
            }
        }
        // Each device's newest key-value file.
        for (device, generations) in devices.keyValues.sorted(by: { $0.key < $1.key }) {
            guard let newest = generations.max() else { continue }
            let key = Backing.keyValueKey(device, generation: newest)
            _ = read(key.path) { () throws(StoreError) -> [UInt8]? in try backing.object(key) }
        }
        for (device, list) in seqs.sorted(by: { $0.key < $1.key }) {
            let sorted = list.sorted()
            let covered = devices.newestCheckpoint(of: device)?.seq ?? 0
            if let first = sorted.first, first > covered + 1 {
                report.problems.append("device \(device): segments \(covered + 1)...\(first - 1) are missing and no checkpoint covers them")
            }
            var expected = sorted.first ?? 1
            for seq in sorted {
                if seq < expected {
                    report.problems.append("device \(device): two segments of seq \(seq)")
                } else if seq > expected {
                    report.problems.append("device \(device): segments \(expected)...\(seq - 1) are missing")
                }
                expected = seq + 1
            }
        }
        return report
    }

    /// An encrypted container's key files: each must parse (a passphrase cannot be
    /// checked without it; `ubiquity key list` shows which one opens).
    static func checkKeys(_ store: any BackingStore, _ report: inout Report) {
        guard let clear = store.find(EncryptedStore.self)?.base else { return }
        do {
            let (entries, malformed) = try KeyRing(clear).list()
            for line in malformed { report.problems.append("keys/\(line)") }
            if entries.isEmpty { report.problems.append("keys/: no key file: nobody can open this container") }
        } catch {
            report.problems.append("keys/: \(error)")
        }
    }
}
