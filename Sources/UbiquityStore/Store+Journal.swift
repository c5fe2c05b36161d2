/// The store's half of journal generations (backing format 4, docs/FORMAT.md): where this
/// device has read each other device's journal, which of their records it pruned (so a
/// rewritten journal does not bring them back), and when its own journal is worth
/// rewriting as a checkpoint. The backing directory's I/O is UbiquitySync's.
extension Store {
    /// A position in another device's journal.
    public struct JournalPosition: Sendable, Equatable {
        public var generation: Int64
        public var offset: Int64
        public init(generation: Int64, offset: Int64) {
            self.generation = generation
            self.offset = offset
        }
    }

    public func peerPosition(_ device: DeviceID) throws(StoreError) -> JournalPosition {
        try db.rows("SELECT generation, offset FROM sync_peers WHERE device = ?", [.device(device)]) {
            JournalPosition(generation: $0.int(0), offset: $0.int(1))
        }.first ?? JournalPosition(generation: 0, offset: 0)
    }

    /// Every device's position (the sync engine loads its cursor from them). A row whose
    /// device is not a device id (only a damaged database holds one) is left out: that
    /// device is read from its start again.
    public func peerPositions() throws(StoreError) -> [(device: DeviceID, position: JournalPosition)] {
        try db.rows("SELECT device, generation, offset FROM sync_peers", []) { row in
            DeviceID(hex: row.text(0)).map { ($0, JournalPosition(generation: row.int(1), offset: row.int(2))) }
        }.compactMap { $0 }
    }

    public func setPeerPosition(_ device: DeviceID, _ position: JournalPosition) throws(StoreError) {
        try db.query("REPLACE INTO sync_peers(device, offset, generation) VALUES(?, ?, ?)",
                     [.device(device), .int(position.offset), .int(position.generation)])
    }

    // MARK: other devices' records this device pruned

    func isPrunedRecord(_ id: VersionID) throws(StoreError) -> Bool {
        try !db.rows("SELECT 1 FROM pruned_records WHERE id = ?", [.id(id)], { _ in true }).isEmpty
    }

    /// Prune calls this for each record it drops. Another device's record is remembered
    /// (with the generation of its author's journal this device reads now), so that it is
    /// skipped when that journal is read again from the start. This device's own records
    /// count towards rewriting its journal (`journalCheckpointDue`) once they are in it.
    func notePruned(id: VersionID, device: DeviceID, uploaded: Bool) throws(StoreError) {
        if device != deviceID {
            try db.query("REPLACE INTO pruned_records(id, device, seen) VALUES(?, ?, ?)",
                         [.id(id), .device(device), .int(try peerPosition(device).generation)])
        } else if uploaded {
            try addToSetting(Self.journalDroppedKey, 1)
        }
    }

    /// Of `ids`, read in generation `generation` of `device`'s journal, those this store
    /// holds or pruned: a reader skips them. A pruned one is marked as still present in
    /// that generation.
    public func knownRecords(_ ids: [VersionID], device: DeviceID, generation: Int64) throws(StoreError) -> Set<VersionID> {
        var known: Set<VersionID> = []
        let keys = ids.map { SQLValue.id($0) }
        try db.transaction { () throws(StoreError) in
            known.formUnion(try db.rows(in: keys, { "SELECT id FROM versions WHERE local = 0 AND id IN (\($0))" }) { $0.versionID(0) })
            for id in try db.rows(in: keys, { "SELECT id FROM pruned_records WHERE id IN (\($0))" }, { $0.versionID(0) }) where !known.contains(id) {
                try db.query("UPDATE pruned_records SET seen = ? WHERE id = ? AND device = ?", [.int(generation), .id(id), .device(device)])
                known.insert(id)
            }
        }
        return known
    }

    /// Called when a reader has read generation `generation` of `device`'s journal to its
    /// end (so all of the checkpoint it starts with): the pruned records it did not meet
    /// there are gone from the backing directory for good and need not be remembered.
    /// Returns how many were forgotten.
    @discardableResult
    public func forgetPrunedRecords(of device: DeviceID, before generation: Int64) throws(StoreError) -> Int {
        try db.query("DELETE FROM pruned_records WHERE device = ? AND seen < ?", [.device(device), .int(generation)])
        return db.changes
    }

    // MARK: this device's journal

    static let journalRecordsKey = "journal_records"
    static let journalDroppedKey = "journal_dropped"

    public func addToSetting(_ key: String, _ delta: Int64) throws(StoreError) {
        let value = (try setting(key).flatMap { Int64($0) } ?? 0).addingClamped(delta)
        try setSetting(key, String(value))
    }

    /// Records of this device in its journal, and how many of them it has pruned since
    /// the journal was last rewritten.
    public func journalCounts() throws(StoreError) -> (records: Int64, dropped: Int64) {
        (try setting(Self.journalRecordsKey).flatMap { Int64($0) } ?? 0,
         try setting(Self.journalDroppedKey).flatMap { Int64($0) } ?? 0)
    }

    /// Whether rewriting the journal pays: a quarter of its records are pruned.
    public func journalCheckpointDue() throws(StoreError) -> Bool {
        let (records, dropped) = try journalCounts()
        return dropped > 0 && dropped.multipliedClamped(by: 4) >= records
    }

    /// This device's records in the backing directory after row `after`, in row order: the
    /// content of a rewritten journal.
    public func uploadedRecords(after: Int64, limit: Int) throws(StoreError) -> [(row: Int64, record: SyncRecord)] {
        try ownRecords("uploaded = 1", after: after, limit: limit)
    }

    /// The journal was rewritten with `records` records.
    public func journalRewritten(records: Int64) throws(StoreError) {
        try setSetting(Self.journalRecordsKey, String(records))
        try setSetting(Self.journalDroppedKey, "0")
    }
}
