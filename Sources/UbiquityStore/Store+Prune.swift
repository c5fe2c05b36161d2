import UbiquitySystem

/// Prune: drops the versions a retention policy does not keep. Works a page of histories
/// at a time (the caller holds the store's lock per page), so a big store is pruned
/// in slices while the mount keeps serving. The chunks pruned versions leave behind are
/// freed by gc (Store+Gc).
extension Store {
    /// One pruned version, for the report.
    public struct PrunedVersion: Sendable {
        public var row: Int64
        public var id: VersionID
        public var path: String
        public var committed: Nanos
        public var size: Int64
    }

    public struct PruneResult: Sendable {
        public var versions: [PrunedVersion] = []
        /// Histories of deleted files that lost their last version (gone from .versions/).
        public var histories = 0
        /// The last history looked at: the next page starts after it (nil: done).
        public var resumeAfter: FileID?
        public init() {}
    }

    /// Histories one call of `prune` looks at unless told otherwise.
    public static let pruneSlice = 50

    /// Prunes (or with `dryRun`, only lists) the versions of up to `limit` histories after
    /// `after` (in file id order) that `policy` does not keep at `now`. `under`: only
    /// histories shown at that path or below it ("" for all).
    public func prune(policy: RetentionPolicy, now: Nanos, under: String = "", after: FileID? = nil,
                      limit: Int = pruneSlice, dryRun: Bool) throws(StoreError) -> PruneResult {
        var result = PruneResult()
        try settleAllMoves() // `under` is decided by where the histories are shown
        let page = try db.rows("SELECT file_id, path, live FROM histories WHERE file_id > ? ORDER BY file_id LIMIT ?",
                               [after.map { .id($0) } ?? .blob([]), .int(Int64(limit))]) { (id: $0.fileID(0), path: $0.text(1), live: $0.int(2) != 0) }
        result.resumeAfter = page.count == limit ? page.last?.id : nil
        if policy.keepEverything { return result }
        try db.transaction { () throws(StoreError) in
            for history in page where Self.isAtOrBelow(history.path, under) {
                try prune(history: history.id, live: history.live, policy: policy, now: now, dryRun: dryRun, into: &result)
            }
        }
        return result
    }

    static func isAtOrBelow(_ path: String, _ root: String) -> Bool {
        root.isEmpty || path.utf8.elementsEqual(root.utf8) || path.utf8.starts(with: (root + "/").utf8)
    }

    private func prune(history fileID: FileID, live: Bool, policy: RetentionPolicy, now: Nanos, dryRun: Bool,
                       into result: inout PruneResult) throws(StoreError) {
        struct Row {
            var row: Int64, id: VersionID, committed: Nanos, tombstone: Bool, meta: Bool, uploaded: Bool, path: String, size: Int64
            var device: DeviceID, viewed: Bool
            var content: Bool { !tombstone && !meta }
        }
        let rows = try db.rows("""
            SELECT row, committed, tombstone, meta, uploaded, device_id, path, size, id, viewed FROM \(Store.versionsWithDevices)
            WHERE file_id = ? AND local = 0
            """, [.id(fileID)]) {
            Row(row: $0.int(0), id: $0.versionID(8), committed: $0.int(1), tombstone: $0.int(2) != 0, meta: $0.int(3) != 0,
                uploaded: $0.int(4) != 0 || $0.deviceID(5) != deviceID, path: $0.text(6), size: $0.int(7), device: $0.deviceID(5),
                viewed: $0.int(9) != 0)
        }
        // Never pruned: the node's heads (its current version, unresolved conflicts, its
        // tombstone), what an inode shows or a new file continues, and records of this
        // device's own not yet in the backing directory or not yet in the view (which
        // does not know yet whether they are heads).
        var protected = Set(try db.rows("SELECT row FROM view_heads WHERE node = ?", [.id(fileID)]) { $0.int(0) })
        for row in rows where !row.uploaded || !row.viewed { protected.insert(row.row) }
        for row in rows where try !db.rows("SELECT 1 FROM inodes WHERE head = ? AND nlink > 0 LIMIT 1", [.int(row.row)], { _ in true }).isEmpty {
            protected.insert(row.row)
        }
        protected.formUnion(continuedParents.values)
        let deletedAt = live ? nil : rows.filter(\.tombstone).map(\.committed).max()
        // The policy staggers the versions .versions/ lists; the rows between them that
        // carry no content of their own (meta records, tombstones) go once they are past
        // the keep-everything window, unless protected.
        let content = rows.filter(\.content).map { RetentionPolicy.Candidate(row: $0.row, committed: $0.committed) }
        var drop = Set(policy.prunable(content, now: now, deletedAt: deletedAt, protected: protected))
        for row in rows where !row.content && !protected.contains(row.row) && RetentionPolicy.age(row.committed, now: now) > policy.keepAll {
            drop.insert(row.row)
        }
        if drop.isEmpty { return }
        for row in rows where drop.contains(row.row) && row.content {
            result.versions.append(PrunedVersion(row: row.row, id: row.id, path: row.path, committed: row.committed, size: row.size))
        }
        let remaining = rows.filter { $0.content && !drop.contains($0.row) }.count
        if !live && remaining == 0 { result.histories += 1 }
        if dryRun { return }
        for row in rows where drop.contains(row.row) {
            try db.query("DELETE FROM versions WHERE row = ?", [.int(row.row)])
            try notePruned(id: row.id, device: row.device, uploaded: row.uploaded)
        }
        if !live && remaining == 0 {
            try dropHistory(fileID)
            // Its heads (tombstones, never pruned) hold every dot this device gave it.
            try db.query("DELETE FROM own_dots WHERE node = ?", [.id(fileID)])
            replica.ownDotDropped(.file(fileID))
        }
    }
}

/// Space pressure: history goes oldest-first, whatever the policy says.
extension Store {
    /// Drops up to `limit` of the oldest versions (in the order this store received them,
    /// after row `after`) that nothing protects: not a node's head (current, conflict or
    /// tombstone), not what an inode shows or a new file continues, not one the synced
    /// view has not taken in yet. Unlike prune, a version of this device still waiting
    /// for upload may go: on a full disk that is offline, its history is what frees
    /// space (the current version still syncs; other devices then miss that intermediate
    /// version, as if it had been pruned). Stops early
    /// once the dropped versions' sizes add up to `bytes`. Returns them and the row to
    /// resume after (nil: the end of the table).
    public func pruneOldest(limit: Int, bytes: Int64 = .max, after: Int64) throws(StoreError) -> (versions: [PrunedVersion], resumeAfter: Int64?) {
        var dropped: [PrunedVersion] = []
        var covered: Int64 = 0
        var last = after
        let continued = Set(continuedParents.values)
        // The view takes in this device's records first: which of them are heads is not
        // known before, and under space pressure the saves that filled the disk are
        // those (t-space: nothing dropped while no sync step had run). If it cannot (the
        // disk is that full), they are kept.
        do {
            try viewOwnRecords()
        } catch {
            log("ubiquity: space pressure: the synced view could not take in the versions saved since the last sync step (\(error)); they are kept")
        }
        try db.transaction { () throws(StoreError) in
            while dropped.count < limit && covered < bytes {
                let page = try db.rows("""
                    SELECT row, file_id, committed, path, size, tombstone, meta, id, device_id, uploaded, viewed FROM \(Store.versionsWithDevices)
                    WHERE local = 0 AND row > ? ORDER BY row LIMIT 500
                    """, [.int(last)]) {
                    (row: $0.int(0), id: $0.versionID(7), node: $0.nodeID(1), committed: $0.int(2), path: $0.text(3), size: $0.int(4),
                     content: $0.int(5) == 0 && $0.int(6) == 0, device: $0.deviceID(8), uploaded: $0.int(9) != 0, viewed: $0.int(10) != 0)
                }
                guard let end = page.last?.row else { break }
                for v in page where dropped.count < limit && covered < bytes {
                    last = v.row
                    // A record the view has not taken in may be a head (a tombstone, say).
                    if continued.contains(v.row) || !v.viewed { continue }
                    if try !db.rows("SELECT 1 FROM view_heads WHERE node = ? AND row = ?", [.node(v.node), .int(v.row)], { _ in true }).isEmpty { continue }
                    if try !db.rows("SELECT 1 FROM inodes WHERE head = ? AND nlink > 0 LIMIT 1", [.int(v.row)], { _ in true }).isEmpty { continue }
                    try db.query("DELETE FROM versions WHERE row = ?", [.int(v.row)])
                    try notePruned(id: v.id, device: v.device, uploaded: v.uploaded)
                    if v.content {
                        dropped.append(PrunedVersion(row: v.row, id: v.id, path: v.path, committed: v.committed, size: v.size))
                        covered = covered.addingClamped(v.size)
                    }
                }
                if dropped.count < limit && covered < bytes { last = end }
            }
        }
        let more = try !db.rows("SELECT 1 FROM versions WHERE row > ? LIMIT 1", [.int(last)], { _ in true }).isEmpty
        return (dropped, more ? last : nil)
    }
}
