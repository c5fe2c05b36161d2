import Glibc
import UbiquityBacking
import UbiquityStore
import UbiquitySystem

/// Collects the backing store (backing format 5, docs/FORMAT.md "Collecting"), with no
/// server and no lock any device must wait for. After Duplicacy's two-step "fossil
/// collection": a pack no record names gets a marker `fossils/<pack>`, and is deleted
/// only when the marker is `fossilAge` old and still no record names it; a pack named
/// again meanwhile loses its marker. Writers never name a pack with a marker (they upload
/// the chunks again: `SyncEngine.placeChunks`), and check at most `objectCheckValidity`
/// before they write the segment, so a pack is never deleted under a new record.
///
/// Each device deletes only what it wrote (its segments that its newest checkpoint
/// covers, its older checkpoints, its format-4 journal), except packs and markers, which
/// any collector may delete once their week has passed.
///
/// Repacking: a pack whose named chunks add up to less than half its bytes is *sparse*.
/// The collector only finds them; each device whose records name one writes a checkpoint
/// that puts those chunks into new packs (`SyncEngine.collectBacking`), from its own
/// copies, so nothing is downloaded and no record is ever rewritten by another device.
/// Once no device names the sparse pack, it is an ordinary unnamed pack: a fossil, deleted
/// a week later. Nothing here deletes a named pack, so repacking needs no new rule.
struct BackingCollector {
    let backing: Backing
    /// Seconds a segment stays after a checkpoint covers it: peers that were behind read
    /// it rather than the whole checkpoint.
    var objectGrace: Int64 = 86_400
    /// Seconds a fossil waits before its pack is deleted.
    var fossilAge: Int64 = 7 * 86_400

    struct Report: Sendable {
        var checkpointsRead = 0
        var segmentsRead = 0
        var records = 0
        var packs = 0
        var referenced = 0
        var fossilized = 0
        var restored = 0
        var deleted = 0
        var bytesDeleted: Int64 = 0
        var fossils = 0
        var segmentsDeleted = 0
        var checkpointsDeleted = 0
        var legacyDeleted = 0
        /// Named packs whose named chunks are less than half their bytes, and of those,
        /// the ones this device's records name (its next checkpoint moves their chunks).
        var sparse: Set<String> = []
        var sparseHere: Set<String> = []

        var summary: String {
            if packs == 0 && segmentsDeleted == 0 && legacyDeleted == 0 {
                return "no packs to collect (small files travel in their records)"
            }
            var text = "read \(records) records in \(checkpointsRead) checkpoints and \(segmentsRead) segments (\(referenced) packs named); "
                + "checked \(packs) packs: \(fossilized) became fossils, \(restored) fossils named again were restored, "
                + "\(deleted) fossils deleted (\(byteText(bytesDeleted)) freed), \(fossils) fossils wait"
            if segmentsDeleted > 0 || checkpointsDeleted > 0 {
                text += "; deleted \(segmentsDeleted) segments and \(checkpointsDeleted) checkpoints this device's checkpoint covers"
            }
            if legacyDeleted > 0 { text += "; deleted \(legacyDeleted) format-4 files" }
            if !sparse.isEmpty {
                text += "; \(sparse.count) packs are less than half named (\(sparseHere.count) of them by this device's records, whose checkpoint repacks them)"
            }
            return text
        }
    }

    /// One run. `now` in seconds since the epoch. Throws without deleting anything if a
    /// checkpoint or segment cannot be read (its references would be missing).
    func run(now: Int64, progress: ((String, Int, Int) -> Void)? = nil) throws(StoreError) -> Report {
        var report = Report()
        let devices = try backing.devices()
        let log = try backing.call("list log/") { () throws(BackingError) in try backing.store.listAll(prefix: "log/") }
            .compactMap { SegmentLog.SegmentName(key: $0.key) }
        let packs = try backing.call("list packs/") { () throws(BackingError) in try backing.store.listAll(prefix: "packs/") }
            .compactMap { info -> (String, Int64)? in
                let name = String(info.key.path.split(separator: "/").last ?? "")
                return Pack.isName(name) && info.key == Pack.key(name) ? (name, info.size) : nil
            }
        report.packs = packs.count
        let byDevice = Dictionary(grouping: log) { $0.device }
        var named = Named()
        if !packs.isEmpty {
            let all = devices.devices.union(byDevice.keys).sorted()
            for (i, device) in all.enumerated() {
                try references(of: device, devices: devices, segments: byDevice[device] ?? [], into: &named, report: &report)
                progress?("reading checkpoints and segments", i + 1, all.count)
            }
        }
        let referenced = Set(named.chunks.keys)
        report.referenced = referenced.count
        for (pack, size) in packs {
            guard let chunks = named.chunks[pack] else { continue }
            let live = chunks.values.reduce(Int64(0)) { $0.addingClamped($1) }
            if live.multipliedClamped(by: 2) < size {
                report.sparse.insert(pack)
                if named.byDevice[backing.deviceID]?.contains(pack) == true { report.sparseHere.insert(pack) }
            }
        }
        try collectOwn(devices: devices, segments: byDevice[backing.deviceID] ?? [], now: now, report: &report)
        let fossils = try backing.fossils()
        for (i, (pack, size)) in packs.enumerated() {
            let marker = fossils[pack]
            if referenced.contains(pack) {
                if marker != nil {
                    try backing.delete(Backing.fossilKey(pack))
                    report.restored += 1
                }
            } else if marker != nil {
                // A marker that cannot be read (damaged, or failing authentication in an
                // encrypted container) counts as unreadable: written again, which only
                // delays the deletion.
                let stamp = ((try? backing.object(Backing.fossilKey(pack))) ?? nil).flatMap {
                    Int64(String(decoding: $0.prefix(20), as: UTF8.self).trimmingWhitespace)
                }
                if let stamp, now.subtractingClamped(stamp) >= fossilAge {
                    try backing.delete(Pack.key(pack))
                    try backing.delete(Backing.fossilKey(pack))
                    report.deleted += 1
                    report.bytesDeleted = report.bytesDeleted.addingClamped(size)
                } else if stamp == nil {
                    // Unreadable: written again, so the week counts from now.
                    try put(Backing.fossilKey(pack), "\(now)\n")
                    report.fossils += 1
                } else {
                    report.fossils += 1
                }
            } else {
                try put(Backing.fossilKey(pack), "\(now)\n")
                report.fossilized += 1
                report.fossils += 1
            }
            if i % 100 == 99 { progress?("collecting packs", i + 1, packs.count) }
        }
        let present = Set(packs.map(\.0))
        for pack in fossils.keys where !present.contains(pack) { try backing.delete(Backing.fossilKey(pack)) }
        return report
    }

    /// What the records name: per pack, the chunks (offset → size), and per device, the
    /// packs its records name.
    private struct Named {
        var chunks: [String: [Int64: Int64]] = [:]
        var byDevice: [DeviceID: Set<String>] = [:]
    }

    /// The packs `device`'s records name: its newest checkpoint and its segments after it.
    private func references(of device: DeviceID, devices: Backing.Devices, segments: [SegmentLog.SegmentName],
                            into named: inout Named, report: inout Report) throws(StoreError) {
        let checkpoint = devices.newestCheckpoint(of: device)
        func take(_ bytes: [UInt8]) {
            for line in bytes.split(separator: UInt8(ascii: "\n")) {
                guard case .success(let record) = RecordCodec.decode(line, journalDevice: device) else { continue }
                report.records += 1
                for (id, size) in record.chunks.chunks {
                    guard let place = record.places[id] else { continue }
                    named.chunks[place.pack, default: [:]][place.offset] = Int64(size)
                    named.byDevice[device, default: []].insert(place.pack)
                }
            }
        }
        if let checkpoint {
            for part in 0..<checkpoint.parts {
                guard let bytes = try backing.checkpointPart(device, seq: checkpoint.seq, part: part) else {
                    throw .io(errno: EAGAIN, "the checkpoint of device \(device) changed while it was read: run gc again")
                }
                take(bytes)
            }
            report.checkpointsRead += 1
        }
        for name in segments where name.seq > (checkpoint?.seq ?? 0) {
            guard let bytes = try backing.segment(name) else {
                throw .io(errno: EAGAIN, "segment \(name.key) went while it was read: run gc again")
            }
            take(bytes)
            report.segmentsRead += 1
        }
    }

    /// This device's own leftovers: segments its newest checkpoint covers (after the
    /// grace), older checkpoints, unfinished ones, and its format-4 journal.
    private func collectOwn(devices: Backing.Devices, segments: [SegmentLog.SegmentName], now: Int64, report: inout Report) throws(StoreError) {
        let me = backing.deviceID
        // Key-value files older than the newest (the writer deletes the previous one; one it
        // could not, offline then, or one before an attempt that failed, goes here).
        if let newestKeyValue = devices.keyValues[me]?.max() {
            for generation in devices.keyValues[me] ?? [] where generation < newestKeyValue {
                try backing.delete(Backing.keyValueKey(me, generation: generation))
            }
        }
        guard let newest = devices.newestCheckpoint(of: me) else { return }
        let nowMs = now.multipliedClamped(by: 1000)
        for name in segments where name.seq <= newest.seq && nowMs.subtractingClamped(name.time) >= objectGrace.multipliedClamped(by: 1000) {
            try backing.delete(name.key)
            report.segmentsDeleted += 1
        }
        for (seq, parts) in devices.checkpoints[me] ?? [:] where seq < newest.seq {
            try backing.deleteCheckpoint(me, seq: seq, parts: parts)
            report.checkpointsDeleted += 1
        }
        for (seq, keys) in devices.partial[me] ?? [:] where seq < newest.seq {
            for key in keys { try backing.delete(key) }
        }
        let legacy = devices.legacyJournals.filter { $0.path.hasPrefix("devices/\(me.hex)/") }
        for key in legacy { try backing.delete(key) }
        report.legacyDeleted += legacy.count
        // Format 4's objects go once no device's format-4 journal is left.
        if devices.legacyJournals.count == legacy.count {
            let objects = try backing.call("list objects/") { () throws(BackingError) in try backing.store.listAll(prefix: "objects/") }
            for info in objects { try backing.delete(info.key) }
            report.legacyDeleted += objects.count
        }
    }

    private func put(_ key: BackingKey, _ text: String) throws(StoreError) {
        try backing.call("put \(key)") { () throws(BackingError) in try backing.store.put(key, Array(text.utf8)) }
    }
}

extension String {
    var trimmingWhitespace: String {
        String(drop { $0 == " " || $0 == "\n" }.reversed().drop { $0 == " " || $0 == "\n" }.reversed())
    }
}
