import UbiquitySystem

/// Version rows and the synced view they enter: every record goes through `insert`, which
/// a fold runs for this device's saves and tombstones and a sync step for records it
/// makes or takes in. A fold's records enter the view at the next sync step
/// (`viewOwnRecords`), not in the fold: the fold writes versions, the sync step the view.
extension Index {
    /// Where a version row comes from.
    enum Origin {
        /// Made on this device: a record, to upload, in the view at once (a sync step's
        /// record, a conflict taken or discarded, a save written straight to SQLite).
        case here
        /// A save or tombstone of this device's that a fold writes: a record, to upload,
        /// that enters the view at the next sync step.
        case folded
        /// Made on this device for a local-only file: never a record, never synced.
        case hereLocalOnly
        /// Another device's record, read from the backing directory (so already there).
        case otherDevice
    }

    /// Writes record `r`'s row in the versions table (the one INSERT of a version):
    /// `row` as `insert` says, `lineage` as it is to be stored. Returns the row (one
    /// SQLite chose is the namespace's to count past: `Store.noteRowChosen`).
    func writeVersionRow(_ r: SyncRecord, origin: Origin, row given: Int64?, lineage: Lineage) throws(StoreError) -> Int64 {
        let local = origin == .hereLocalOnly, remote = origin == .otherDevice
        try connection.query("""
            INSERT INTO versions(row, id, file_id, parents, device, committed, mtime, mode, size, tombstone,
                                 local, path, chunks, kind, target, xattrs, meta, uploaded, lineage, viewed)
            VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)
            """, [given.map { .int($0) } ?? .null, .id(r.id), .node(r.node), .ids(r.parents), .int(try deviceNumber(r.deviceID, name: r.deviceName)), .int(r.committed), .int(r.mtime), .int(Int64(r.mode)), .int(r.size),
                  .int(r.isTombstone ? 1 : 0), .int(local ? 1 : 0), .text(r.path), .blob(r.chunks.encoded),
                  .int(r.kind.rawValue), r.target.map { .text($0) } ?? .null, .blob(XattrCodec.encode(r.xattrs)),
                  .int(r.isMeta ? 1 : 0), .int(remote ? 1 : 0), local ? .null : lineage.stored(device: r.deviceID).map { .text($0) } ?? .null,
                  .int(origin == .folded ? 0 : 1)])
        if origin == .folded { mayHaveUnviewed = true }
        noteVersionWritten(origin: origin)
        let row = connection.lastInsertRowID
        // What reconcile shows of another device's new file, kept for it (not read back).
        if remote && r.kind == .file && !r.isTombstone && takingIn != nil {
            takingIn?.shown[row] = Store.ShownFile(content: r.chunks, mode: r.mode, mtime: r.mtime, xattrs: XattrCodec.encode(r.xattrs))
        }
        return row
    }

    /// Appends a version row (every record goes through here) and adds it to the synced
    /// view in the same transaction (a fold's: at the next sync step); the paths it may
    /// change are queued for `reconcile`.
    /// `row`: the row the overlay gave it (nil: SQLite's next); `heads`: the node's heads,
    /// when the caller has just read them (a tombstone's parents are its live ones).
    func insert(_ r: SyncRecord, from origin: Origin, row given: Int64? = nil, heads: [Replica.Record]? = nil) throws(StoreError) -> Int64 {
        let local = origin == .hereLocalOnly
        return try connection.transaction { () throws(StoreError) -> Int64 in
            // The lineage is worked out now, from the view and `own_dots`: a dot is given
            // once, in the transaction that writes the record.
            let made = origin == .here || origin == .folded
            let (lineage, known) = made ? try replica.lineage(node: r.node, parents: r.parents, device: r.deviceID, heads: heads)
                                        : (r.lineage, Replica.Known())
            let row = try writeVersionRow(r, origin: origin, row: given, lineage: lineage)
            if local || origin == .folded { return row }
            let info = Replica.Record(row: row, id: r.id, node: r.node, parents: r.parents, kind: r.kind,
                                      isTombstone: r.isTombstone, mtime: r.mtime, device: r.deviceID, path: r.path,
                                      mode: r.mode, target: r.target, lineage: lineage)
            try view(info, from: origin, known: known)
            return row
        }
    }

    /// Adds a record whose row is written to the synced view, and queues the paths it may
    /// change for the sync step (`recheck`, this device's own) or for reconcile
    /// (`unreconciled`, another device's).
    private func view(_ r: Replica.Record, from origin: Origin, known: Replica.Known = Replica.Known()) throws(StoreError) {
        let remote = origin == .otherDevice
        let (changed, isCurrent, isAlone, isLive) = try replica.add(r, known: known)
        // Another device's file is listed under .versions/ from the start, even when it
        // never shows here as a file (a conflict that lost its path, say).
        // (A record can arrive after a tombstone that descends from it: simulation seed 39.)
        if remote && r.kind == .file && !r.isTombstone, let fileID = r.node.fileID {
            if isCurrent {
                try placeHistory(fileID, path: r.path, live: nil)
            } else {
                try placeHistory(fileID, path: r.path, live: false, keepExisting: true)
            }
        }
        // Its tombstone that leaves it no live head ends its history here and now, not
        // when reconcile takes the file out of the tree: a file and its tombstone taken
        // in together never reach the tree, and prune keeps a live history's last
        // versions for good (`FreshRecordsTests`, seed 116).
        if remote && r.kind == .file && r.isTombstone && !isLive, let fileID = r.node.fileID {
            try retireHistory(fileID)
        }
        // Another device's record: reconcile makes the tree show the view there. One of
        // this device's own can change what a path shows too (its tombstone reveals a
        // conflicting node; a skewed clock gives its new file an older mtime): the sync
        // step checks those paths (`recheck`) and queues the ones the tree does not show.
        // A file version of this device's own that its path now shows (the only node
        // there) needs no check of that path: the tree it was made from has it there,
        // and whatever changes that later makes a record of its own. Checking it would
        // cost a dozen statements per new file in the sync step. Its ancestors, and
        // every tombstone's path, are still checked.
        let shownAsMade = !remote && r.kind == .file && !r.isTombstone && isAlone
        for path in changed where !(shownAsMade && path.utf8.elementsEqual(r.path.utf8)) {
            try (remote ? unreconciled : recheck).insert(NameKey(path))
        }
    }

    /// Whether `versions` holds rows the view has not taken in (the open's look).
    func hasUnviewedRecords() throws(StoreError) -> Bool {
        try !connection.rows("SELECT 1 FROM versions WHERE viewed = 0 LIMIT 1", []) { _ in true }.isEmpty
    }

    /// The sync step's catch-up: the view takes in this device's records that folds wrote
    /// since (at most `limit` of them, nil: all), in row order, so a record's parents of
    /// its own come before it. In the caller's transaction, which reads the view next.
    /// Returns whether more remain.
    func viewOwnRecords(limit: Int? = nil) throws(StoreError) -> Bool {
        guard mayHaveUnviewed else { return false }
        let records = try replica.unviewed(limit: limit)
        if !records.isEmpty {
            try connection.transaction { () throws(StoreError) in
                // Marked first: a record's parent earlier in the batch is then found as a
                // record of the view (`Replica.add`), not awaited.
                try connection.query("UPDATE versions SET viewed = 1 WHERE viewed = 0 AND row <= ?", [.int(records.last!.row)])
                try replica.remembering { () throws(StoreError) in
                    try replica.rememberNewNodes(Set(records.map(\.node)))
                    let known = try replica.known(for: records)
                    try replica.deferringConflicts { () throws(StoreError) in
                        for record in records { try view(record, from: .here, known: known[record.row] ?? Replica.Known()) }
                    }
                }
            }
        }
        let more = limit.map { records.count >= $0 } ?? false
        mayHaveUnviewed = more
        return more
    }

    /// The tombstone's record: it descends from the file's live heads and `previous`, the
    /// version that was the file's head (the caller reads it: the store's side through the
    /// overlay, a fold as `NamespaceFacts` says); none (a file never saved), no tombstone.
    /// A head `previous` descends from is not a parent of its own: `previous` not in the
    /// view yet (a save folded since the last sync step) leaves its ancestors there as
    /// heads, and the tombstone's parents are the same as once it is.
    /// Returns its row (nil: none written).
    @discardableResult
    func writeTombstone(row: Int64?, id: VersionID, fileID: FileID, previous: Version?, path: String,
                        committed: Nanos, origin: Origin) throws(StoreError) -> Int64? {
        let heads = try replica.heads(.file(fileID))
        var live = heads.filter { !$0.isTombstone }
        if let previous, !previous.isLocal, !live.isEmpty, !live.contains(where: { $0.id == previous.id }),
           let record = try replica.record(id: previous.id) {
            live.removeAll { record.covers($0) }
        }
        var parents = live.map(\.id)
        if let previous, !previous.isLocal, !parents.contains(previous.id) { parents.append(previous.id) }
        guard !parents.isEmpty else { return nil }
        let tombstone = SyncRecord(id: id, node: .file(fileID), kind: .file, parents: parents.sorted(),
                                   deviceID: deviceID, deviceName: deviceName, committed: committed, mtime: committed,
                                   mode: previous?.mode ?? 0o644, isTombstone: true, isMeta: false, path: path)
        return try connection.transaction { () throws(StoreError) -> Int64 in
            let written = try insert(tombstone, from: origin, row: row, heads: heads)
            try placeHistory(fileID, path: path, live: false)
            return written
        }
    }

    func versionExists(_ id: VersionID) throws(StoreError) -> Bool {
        try !connection.rows("SELECT 1 FROM versions WHERE id = ?", [.id(id)]) { _ in true }.isEmpty
    }

    func versionRow(_ row: Int64) throws(StoreError) -> Version? {
        try VersionLog.version(row: row, in: connection)
    }
}
