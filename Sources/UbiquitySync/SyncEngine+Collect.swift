import Glibc
import UbiquityStore
import UbiquitySystem

/// Keeping the backing directory within the retention policy (backing format 4): this
/// device rewrites its own journal without the records it pruned (a checkpoint), and the
/// collector turns objects no journal names into fossils and deletes old fossils.
extension SyncEngine {
    public struct Checkpoint: Sendable {
        public var generation: Int64
        public var records: Int64
        public var bytes: Int64
    }

    /// Rewrites this device's journal as a new generation holding its records the store
    /// still has (in the order they were made, small chunks inline), if a quarter of the
    /// journal's records are pruned (or `force`). Runs as a sync cycle would (nothing is
    /// appended meanwhile); other devices read the new generation from its start.
    @discardableResult
    public func checkpointJournal(force: Bool = false) throws(StoreError) -> Checkpoint? {
        try cycleLock.withLock { (_: inout ()) throws(StoreError) -> Checkpoint? in
            var due = force
            try access.withStore { (store, _) throws(StoreError) -> TreeChanges in
                if !due { due = try store.journalCheckpointDue() }
                return TreeChanges()
            }
            guard due else { return nil }
            try backing.open()
            let generation = (try backing.generations(of: backing.deviceID).last ?? 0) + 1
            var records: Int64 = 0
            var after: Int64 = 0
            let bytes = try backing.rewriteJournal(generation: generation) { (add) throws(StoreError) in
                while true {
                    var page: [(row: Int64, record: SyncRecord)] = []
                    try access.withStore { (store, _) throws(StoreError) -> TreeChanges in
                        // Small pages: saves wait for the filesystem's lock meanwhile.
                        page = try store.uploadedRecords(after: after, limit: 200)
                        return TreeChanges()
                    }
                    guard let last = page.last else { return }
                    // Small chunks inline; an object gone from the backing directory (a
                    // fossil deleted too early, a damaged copy removed) is uploaded again.
                    var batch = page.map(\.record)
                    try uploadObjects(&batch, tolerant: true)
                    try add(batch.map(RecordCodec.encode))
                    records += Int64(page.count)
                    after = last.row
                }
            }
            try access.withStore { (store, _) throws(StoreError) -> TreeChanges in
                try store.journalRewritten(records: records)
                return TreeChanges()
            }
            log("ubiquity: sync: rewrote this device's journal as \(Backing.journalName(generation)): \(records) records, \(byteText(bytes))")
            return Checkpoint(generation: generation, records: records, bytes: bytes)
        }
    }

    /// The backing directory's gc: a checkpoint of this device's journal if one is due,
    /// then the object collector. `now`: seconds since the epoch. Returns the report line.
    public func collectBacking(now: Int64 = Int64(time(nil)), progress: ((String, Int, Int) -> Void)? = nil) throws(StoreError) -> String {
        if state.withLock({ $0.paused }) { return "backing directory: not collected (syncing is paused)" }
        try backing.open()
        let checkpoint = try checkpointJournal()
        let collector = BackingCollector(backing: backing, objectGrace: options.objectGrace, fossilAge: options.fossilAge)
        let report = try collector.run(now: now, progress: progress)
        var text = "backing directory: "
        if let checkpoint {
            text += "rewrote this device's journal (\(checkpoint.records) records, \(byteText(checkpoint.bytes))); "
        }
        return text + report.summary
    }
}
