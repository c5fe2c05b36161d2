import Glibc
import UbiquityBacking
import UbiquityStore
import UbiquitySystem

/// Keeping the backing store within the retention policy (backing format 5): this device
/// writes a checkpoint of its live records (so its segments and the records it pruned can
/// go), and the collector turns packs no record names into fossils and deletes old ones.
extension SyncEngine {
    public struct Checkpoint: Sendable {
        public var seq: UInt64
        public var records: Int64
        public var bytes: Int64
    }

    /// Writes a checkpoint of this device's records if a quarter of those in the last one
    /// are pruned, or its segments since add up to a quarter of its size (so the log
    /// stays short and a joining device reads little more than the checkpoints), or
    /// `force`. Runs as a sync cycle would (nothing is pushed meanwhile).
    @discardableResult
    public func checkpointJournal(force: Bool = false) throws(StoreError) -> Checkpoint? {
        try cycleLock.withLock { (_: inout ()) throws(StoreError) -> Checkpoint? in
            let due = try shared.withLedger { (store) throws(StoreError) -> Bool in
                if force { return true }
                if try store.journalCheckpointDue() { return true }
                let log = try store.setting(Self.logBytesKey).flatMap { Int64($0) } ?? 0
                let last = try store.setting(Self.checkpointBytesKey).flatMap { Int64($0) } ?? 0
                return log > 0 && log.multipliedClamped(by: 4) >= max(last, 1 << 20)
            }
            guard due else { return nil }
            try openBacking()
            return try writeCheckpoint()
        }
    }

    /// Writes the checkpoint (callers hold `cycleLock`): every record of this device in
    /// the store that went out, in the order they were made, covering its segments up to
    /// the last. Older checkpoints are deleted by the collector.
    @discardableResult
    func writeCheckpoint() throws(StoreError) -> Checkpoint {
        let devices = try backing.devices()
        var seq = try shared.withLedger { (store) throws(StoreError) in try store.setting(Self.seqKey).flatMap { UInt64($0) } ?? 0 }
        if let newest = devices.newestCheckpoint(of: backing.deviceID), newest.seq >= seq {
            // A checkpoint of this seq is there (readers may have read it): a new seq, by
            // an empty segment, so no key is ever written twice.
            try writeSegment([], ids: [])
            seq += 1
        }
        var after: Int64 = 0
        let (records, bytes) = try backing.writeCheckpoint(seq: seq) { (add) throws(StoreError) in
            var batch: [SyncRecord] = []
            while true {
                // Small pages: saves wait for the store's lock meanwhile.
                let page = try shared.withLedger { (store) throws(StoreError) in try store.uploadedRecords(after: after, limit: 200) }
                if let last = page.last {
                    batch += page.map(\.record)
                    after = last.row
                }
                // Small chunks inline; a chunk whose pack is gone, a fossil or sparse (or
                // never had one: records from format 4) goes into a new pack. Batches of
                // 2,000 records, so that repacking makes full packs, not one per page.
                if batch.count >= 2_000 || (page.isEmpty && !batch.isEmpty) {
                    try placeChunks(&batch, tolerant: true)
                    try add(batch.map(RecordCodec.encode))
                    batch = []
                }
                if page.isEmpty { return }
            }
        }
        try shared.withLedger { (store) throws(StoreError) in
            try store.journalRewritten(records: records)
            try store.setSetting(Self.logBytesKey, "0")
            try store.setSetting(Self.checkpointBytesKey, String(bytes))
        }
        log("ubiquity: sync: wrote checkpoint \(seq) of this device: \(records) records, \(byteText(bytes))")
        return Checkpoint(seq: seq, records: records, bytes: bytes)
    }

    /// The backing store's gc: a checkpoint of this device's records if one is due, then
    /// the collector. `now`: seconds since the epoch. Returns the report line.
    public func collectBacking(now: Int64 = Int64(time(nil)), progress: ((String, Int, Int) -> Void)? = nil) throws(StoreError) -> String {
        if state.withLock({ $0.paused }) { return "backing store: not collected (syncing is paused)" }
        try cycleLock.withLock { (_: inout ()) throws(StoreError) in try openBacking() }
        let checkpoint = try checkpointJournal()
        let collector = BackingCollector(backing: backing, objectGrace: options.objectGrace, fossilAge: options.fossilAge)
        let report = try collector.run(now: now, progress: progress)
        var text = "backing store: "
        if let checkpoint {
            text += "wrote a checkpoint of this device's records (\(checkpoint.records) records, \(byteText(checkpoint.bytes))); "
        }
        text += report.summary
        // Repacking: this device's records stop naming sparse packs (their chunks go into
        // new packs as the checkpoint is written); a later run finds them unnamed.
        cycleLock.withLock { _ in memory.sparsePacks = report.sparse }
        // Not again for packs a repacking checkpoint already left named here (a chunk this
        // device cannot read keeps its place): a full checkpoint a day that changes nothing.
        let tried = try shared.withLedger { (store) throws(StoreError) in
            Set((try store.setting(Self.repackTriedKey) ?? "").split(separator: ",").map(String.init))
        }
        if !report.sparseHere.isSubset(of: tried), let repacked = try checkpointJournal(force: true) {
            text += "; repacked: wrote a checkpoint of this device's records (\(repacked.records) records, \(byteText(repacked.bytes))) naming none of the \(report.sparseHere.count) sparse packs"
            try shared.withLedger { (store) throws(StoreError) in
                // Bounded: with more, the next gc tries again.
                try store.setSetting(Self.repackTriedKey, report.sparseHere.count <= 1_000 ? report.sparseHere.sorted().joined(separator: ",") : "")
            }
        }
        return text
    }
}
