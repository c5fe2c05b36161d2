/// Where histories are shown under `.versions/`, as the index writes it (Store+Histories
/// says what the two tables hold): every change of a history's path goes through
/// `placeHistory` or `dropHistory`, the one place that keeps `histories` and
/// `history_dirs` in step.
extension Index {
    /// Places the histories of fresh records a pull slice has just inserted as `rows`
    /// (`Store.takeInFresh`): each a live file's, at its path, with no row before
    /// (`Store.placedHistories`). What `placeHistory` does for each, with one statement
    /// for their rows.
    func placeFreshHistories(_ files: [(id: FileID, path: String)], rows: ClosedRange<Int64>) throws(StoreError) {
        guard !files.isEmpty else { return }
        try connection.query("""
            INSERT INTO histories(file_id, path, live) SELECT file_id, path, 1 FROM versions
            WHERE row BETWEEN ? AND ? AND kind = \(NodeKind.file.rawValue)
            """, [.int(rows.lowerBound), .int(rows.upperBound)])
        for file in files {
            historiesUnplaced.remove(file.id)
            takingIn?.histories[file.id] = (file.path, true)
            try countHistoryPath(file.path, by: 1)
        }
    }

    /// Shows history `fileID` at `path`. `live`: whether a live file has it (nil: keep
    /// what is recorded, 1 for a new row). `keepExisting`: leave a history that is already
    /// placed where it is.
    func placeHistory(_ fileID: FileID, path: String, live: Bool?, keepExisting: Bool = false) throws(StoreError) {
        var old = takingIn?.histories[fileID]
        if old == nil && historiesUnplaced.remove(fileID) == nil {
            old = try connection.rows("SELECT path, live FROM histories WHERE file_id = ?", [.id(fileID)]) { (path: $0.text(0), live: $0.int(1) != 0) }.first
        }
        if old != nil && keepExisting { return }
        let newLive = live ?? old?.live ?? true
        takingIn?.histories[fileID] = (path, newLive)
        if let old, old.path.utf8.elementsEqual(path.utf8) {
            if old.live != newLive { try connection.query("UPDATE histories SET live = ? WHERE file_id = ?", [.int(newLive ? 1 : 0), .id(fileID)]) }
            return
        }
        if let old { try countHistoryPath(old.path, by: -1) }
        try connection.query("REPLACE INTO histories(file_id, path, live) VALUES(?, ?, ?)", [.id(fileID), .text(path), .int(newLive ? 1 : 0)])
        try countHistoryPath(path, by: 1)
    }

    /// Marks a history as having no live file (it stays shown at its last path).
    func retireHistory(_ fileID: FileID) throws(StoreError) {
        takingIn?.histories[fileID] = nil
        try connection.query("UPDATE histories SET live = 0 WHERE file_id = ?", [.id(fileID)])
    }

    /// Stops showing a history under .versions/ (its versions stay in the database).
    /// An editor's atomic save (write a temp file, rename it over the file): the temp
    /// file's history, when its one version never left this device, goes altogether, as
    /// if it never was: its content becomes the target's next version. Otherwise that
    /// version would be a record now, shown at the temp path to every device, and a
    /// tombstone at the next sync step: three records per save instead of one, and until
    /// the step, one more live node at the temp path for each save (which every later
    /// save there would have to count for conflicts). Returns false when the history has more
    /// than that version, or it was uploaded or is being uploaded: the caller keeps it.
    func withdrawUnsentHistory(_ fileID: FileID) throws(StoreError) -> Bool {
        let rows = try connection.rows("SELECT row, id, device_id, uploaded, local FROM \(Store.versionsWithDevices) WHERE file_id = ? LIMIT 2", [.id(fileID)]) {
            (row: $0.int(0), id: $0.versionID(1), device: $0.deviceID(2), uploaded: $0.int(3) != 0, local: $0.int(4) != 0)
        }
        guard rows.count == 1, let only = rows.first, only.device == deviceID, !only.uploaded, !only.local,
              !uploadsInFlight.contains(only.id), let record = try replica.record(id: only.id) else { return false }
        try connection.transaction { () throws(StoreError) in
            try connection.query("DELETE FROM versions WHERE row = ?", [.int(only.row)])
            _ = try replica.remove(record)
            try connection.query("DELETE FROM own_dots WHERE node = ?", [.node(.file(fileID))])
            replica.ownDotDropped(.file(fileID))
            try dropHistory(fileID)
            // Its intent may not be applied yet (the batch can commit without the fold
            // that notes that): an open after a crash must not record it again.
            try keepWithdrawals([only.id])
        }
        return true
    }

    func dropHistory(_ fileID: FileID) throws(StoreError) {
        takingIn?.histories[fileID] = nil
        guard let path = try connection.rows("SELECT path FROM histories WHERE file_id = ?", [.id(fileID)], { $0.text(0) }).first else { return }
        try connection.query("DELETE FROM histories WHERE file_id = ?", [.id(fileID)])
        try countHistoryPath(path, by: -1)
    }

    /// Adds `delta` to the counts of `path` and its ancestors in `history_dirs`; a name
    /// whose count drops to zero goes.
    /// While a pull slice runs (`takeIn`), what a history adds to or takes from the
    /// directories above it is summed and written once at the slice's end
    /// (`writeHistoryDirectories`), not once per file of a joining device's directory (one
    /// statement per record). Additions and removals both wait, so a row's sum is what
    /// applying them one by one leaves (a removal applied at once to a row whose additions
    /// wait would delete the row and lose itself: the simulation's check of rebuilt views
    /// catches that). The leaf's own row is written at once.
    private func countHistoryPath(_ path: String, by delta: Int64) throws(StoreError) {
        // The names are the namespace's: it notes the paths placed later (`notePlaced`).
        if delta > 0 { notePlaced(path) }
        guard takingIn != nil else { return try Store.countHistoryPath(path, by: delta, in: connection) }
        try Store.countHistoryPath(path, by: delta, in: connection) { self.takingIn?.historyDirectories[$0, default: 0] += delta }
    }

    /// Runs `body` (a fold, in its savepoint) summing what it adds to `history_dirs` as a
    /// pull slice does, and remembering where it placed histories.
    func summingHistoryDirectories(_ body: () throws(StoreError) -> Void) throws(StoreError) {
        guard takingIn == nil else { return try body() } // a slice's: it writes them
        takingIn = TakeInMemo()
        defer { takingIn = nil }
        try body()
        try writeHistoryDirectories()
    }

    /// Writes what `countHistoryPath` summed during a pull slice (in its transaction).
    func writeHistoryDirectories() throws(StoreError) {
        guard let sums = takingIn?.historyDirectories, !sums.isEmpty else { return }
        // No caller goes on after a rollback inside the batch today; one that did would
        // fail its batch here rather than write counts of rows it undid.
        if takingIn?.undone == true { throw .database("a savepoint rolled back inside a batch that sums .versions/ directory counts") }
        takingIn?.historyDirectories = [:]
        for (key, delta) in sums where delta != 0 {
            try Store.countHistoryName(parent: key.parent, name: key.name, leaves: 0, total: delta, in: connection)
        }
    }
}
