/// Other devices' records that are new here in the simplest way, taken in a table at a
/// time: most of a joining device's checkpoint, and most of a peer's new subtree (an
/// archive unpacked there, a repository cloned). Adding one record at a time (`insert`,
/// `Replica.add`) reads what each record may meet (heads, the path's nodes, a history
/// already placed) and wraps it in a savepoint; for these records the answers are known
/// for the whole slice from a few batched queries, so the rows go in as sets and the
/// counts are summed per directory. The result is the same rows (`FreshRecordsTests`
/// holds it against the one-at-a-time path).
extension Store {
    /// Splits a pull slice's records (checked: none held or pruned here) into those
    /// `takeInFresh` takes and the rest, each in its order. A fresh record is another
    /// device's first and only record of a node the view has no heads of, with no
    /// parents, not a tombstone or a metadata change, alone at its path in the slice and
    /// in the view (no live node there), and, unless a directory, with nothing below it
    /// in either; a file's history has no row yet; no record held here waits for it as a
    /// parent.
    func freshRecords(_ records: [SyncRecord]) throws(StoreError) -> (fresh: [SyncRecord], rest: [SyncRecord]) {
        guard takesFreshRecordsInBulk, records.count > 1 else { return ([], records) }
        // A record another waits for is added as `Replica.add` does: it ends the wait.
        let awaited = try replica.awaited(among: records.map(\.id))
        var perNode: [NodeID: Int] = [:]
        var perPath: [NameKey: Int] = [:]
        var above: Set<NameKey> = []
        for r in records {
            perNode[r.node, default: 0] += 1
            perPath[NameKey(r.path), default: 0] += 1
            for ancestor in PathBytes.ancestors(r.path) where !above.insert(NameKey(ancestor)).inserted { break }
        }
        let candidates = records.filter { r in
            r.deviceID != deviceID && !r.isTombstone && !r.isMeta && r.parents.isEmpty && !r.path.isEmpty && !awaited.contains(r.id)
                && perNode[r.node] == 1 && perPath[NameKey(r.path)] == 1 && replica.isNew(r.node)
                && Self.kindMatchesNode(r) && (r.kind == .directory || !above.contains(NameKey(r.path)))
        }
        guard !candidates.isEmpty else { return ([], records) }
        let counts = try replica.pathCounts(candidates.map(\.path))
        let placed = try placedHistories(candidates.compactMap(\.node.fileID))
        var fresh: [SyncRecord] = []
        var taken: Set<VersionID> = []
        for r in candidates {
            let here = counts[NameKey(r.path)] ?? (nodes: 0, below: 0)
            guard here.nodes == 0, r.kind == .directory || here.below == 0 else { continue }
            if let file = r.node.fileID, placed.contains(file) { continue }
            fresh.append(r)
            taken.insert(r.id)
        }
        return (fresh, records.filter { !taken.contains($0.id) })
    }

    /// A file record names a history, a directory's and a symlink's their paths.
    private static func kindMatchesNode(_ r: SyncRecord) -> Bool {
        switch (r.kind, r.node) {
        case (.file, .file): true
        case (.directory, .directory(let path)), (.symlink, .symlink(let path)): path.utf8.elementsEqual(r.path.utf8)
        default: false
        }
    }

    /// Takes in records `freshRecords` found fresh, in the pull slice's transaction: their
    /// version rows (consecutive), their heads, current records and path counts
    /// (`Replica.addFresh`), their files' histories, and the paths reconcile then shows.
    func takeInFresh(_ records: [SyncRecord]) throws(StoreError) {
        guard !records.isEmpty else { return }
        var added: [Replica.Record] = []
        var files: [(id: FileID, path: String)] = []
        added.reserveCapacity(records.count)
        for r in records {
            let row = try claimedIndex.writeVersionRow(r, origin: .otherDevice, row: nil, lineage: r.lineage)
            noteRowChosen(row)
            if let first = added.first?.row, row != first + Int64(added.count) {
                throw .database("fresh records' version rows are not consecutive (row \(row) after \(first) and \(added.count - 1) more)")
            }
            added.append(Replica.Record(row: row, id: r.id, node: r.node, parents: [], kind: r.kind, isTombstone: false,
                                        mtime: r.mtime, device: r.deviceID, path: r.path, mode: r.mode, target: r.target,
                                        lineage: r.lineage))
            if let file = r.node.fileID { files.append((file, r.path)) }
        }
        let rows = added[0].row...added[added.count - 1].row
        let changed = try replica.addFresh(added, rows: rows)
        try claimedIndex.placeFreshHistories(files, rows: rows)
        for path in changed { try unreconciled.insert(NameKey(path)) }
        freshRecordsTaken += added.count
    }
}
