/// Where histories are shown under `.versions/`: the `histories` table (a file's current
/// path, or the last path it had) and `history_dirs`, the directory tree those paths make,
/// with counts, so a listing or lookup under `.versions/` reads only the rows it returns
/// (store format 3). Every change of a history's path goes through `placeHistory` or
/// `dropHistory`, the one place that keeps the two tables in step.
extension Store {
    /// Of `fileIDs`, those with a row in `histories` (placed, live or not).
    func placedHistories(_ fileIDs: [FileID]) throws(StoreError) -> Set<FileID> {
        Set(try db.rows(in: fileIDs.map { SQLValue.id($0) }, { "SELECT file_id FROM histories WHERE file_id IN (\($0))" }) { $0.fileID(0) })
    }

    /// Places the histories of fresh records a pull slice has just inserted as `rows`
    /// (`Store.takeInFresh`): each a live file's, at its path, with no row before
    /// (`placedHistories`). What `placeHistory` does for each, with one statement for
    /// their rows.
    func placeFreshHistories(_ files: [(id: FileID, path: String)], rows: ClosedRange<Int64>) throws(StoreError) {
        guard !files.isEmpty else { return }
        try db.query("""
            INSERT INTO histories(file_id, path, live) SELECT file_id, path, 1 FROM versions
            WHERE row BETWEEN ? AND ? AND kind = \(NodeKind.file.rawValue)
            """, [.int(rows.lowerBound), .int(rows.upperBound)])
        for file in files {
            index.historiesUnplaced.remove(file.id)
            takingIn?.histories[file.id] = (file.path, true)
            try countHistoryPath(file.path, by: 1)
        }
    }

    /// Shows history `fileID` at `path`. `live`: whether a live file has it (nil: keep
    /// what is recorded, 1 for a new row). `keepExisting`: leave a history that is already
    /// placed where it is.
    func placeHistory(_ fileID: FileID, path: String, live: Bool?, keepExisting: Bool = false) throws(StoreError) {
        var old = takingIn?.histories[fileID]
        if old == nil && index.historiesUnplaced.remove(fileID) == nil {
            old = try db.rows("SELECT path, live FROM histories WHERE file_id = ?", [.id(fileID)]) { (path: $0.text(0), live: $0.int(1) != 0) }.first
        }
        if old != nil && keepExisting { return }
        let newLive = live ?? old?.live ?? true
        takingIn?.histories[fileID] = (path, newLive)
        if let old, old.path.utf8.elementsEqual(path.utf8) {
            if old.live != newLive { try db.query("UPDATE histories SET live = ? WHERE file_id = ?", [.int(newLive ? 1 : 0), .id(fileID)]) }
            return
        }
        if let old { try countHistoryPath(old.path, by: -1) }
        try db.query("REPLACE INTO histories(file_id, path, live) VALUES(?, ?, ?)", [.id(fileID), .text(path), .int(newLive ? 1 : 0)])
        try countHistoryPath(path, by: 1)
    }

    /// Moves where a history is shown (after a rename, a save, a remote record). With the
    /// overlay on, the change goes there (a rename reads and writes no SQLite; the fold's
    /// `placeHistory` writes nothing for a history already shown there), unless the
    /// overlay shows it there already (an editor's save placed it a moment before).
    public func setHistory(_ fileID: FileID, path: String, live: Bool) throws(StoreError) {
        guard overlayOn else { return try placeHistory(fileID, path: path, live: live) }
        if let shown = overlay.histories[fileID], shown.live == live, shown.path.utf8.elementsEqual(path.utf8) { return }
        try record(.history(fileID, path: path, live: live))
    }

    /// Marks a history as having no live file (it stays shown at its last path).
    public func retireHistory(_ fileID: FileID) throws(StoreError) {
        takingIn?.histories[fileID] = nil
        try db.query("UPDATE histories SET live = 0 WHERE file_id = ?", [.id(fileID)])
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
    public func withdrawUnsentHistory(_ fileID: FileID) throws(StoreError) -> Bool {
        let rows = try db.rows("SELECT row, id, device_id, uploaded, local FROM \(Store.versionsWithDevices) WHERE file_id = ? LIMIT 2", [.id(fileID)]) {
            (row: $0.int(0), id: $0.versionID(1), device: $0.deviceID(2), uploaded: $0.int(3) != 0, local: $0.int(4) != 0)
        }
        guard rows.count == 1, let only = rows.first, only.device == deviceID, !only.uploaded, !only.local,
              !uploadsInFlight.contains(only.id), let record = try replica.record(id: only.id) else { return false }
        try db.transaction { () throws(StoreError) in
            try db.query("DELETE FROM versions WHERE row = ?", [.int(only.row)])
            _ = try replica.remove(record)
            try db.query("DELETE FROM own_dots WHERE node = ?", [.node(.file(fileID))])
            replica.ownDotDropped(.file(fileID))
            try dropHistory(fileID)
            // Its intent may not be applied yet (the batch can commit without the fold
            // that notes that): an open after a crash must not record it again.
            try keepWithdrawals([only.id])
        }
        return true
    }

    /// What becomes of the history of a file renamed over another file whose history it
    /// continues (an editor's atomic save, `sed -i`): a history of one version this device
    /// made goes (`withdrawUnsentHistory`), or only leaves `.versions/` when that version
    /// was sent; a longer history, or another device's, stays shown at its old path.
    /// A history whose one version is a save the overlay still holds (the usual case: the
    /// temp file was written and renamed within the group commit's interval) is withdrawn
    /// there, so the rename folds nothing: the fold then writes neither the save nor its
    /// history (`foldTree`).
    public func endHistoryRenamedOver(_ fileID: FileID) throws(StoreError) {
        if overlayOn, let only = overlay.onlySave(of: fileID), try !hasIndexedVersions(fileID) {
            try record(.withdraw(row: only.row, id: only.id, fileID: fileID))
            return
        }
        let versions = try versions(of: fileID)
        if versions.count <= 1 && versions.allSatisfy({ $0.deviceID == deviceID }) {
            if try !withdrawUnsentHistory(fileID) { try dropHistory(fileID) }
        } else {
            try retireHistory(fileID)
        }
    }

    /// Whether SQLite holds a version of history `fileID`: rows there never change, so
    /// this reads around the gate (and not at all for a history begun since the fold).
    private func hasIndexedVersions(_ fileID: FileID) throws(StoreError) -> Bool {
        if overlay.isFresh(fileID) { return false }
        return try db.aroundGate { () throws(StoreError) -> Bool in
            try !db.rows("SELECT 1 FROM versions WHERE file_id = ? LIMIT 1", [.id(fileID)]) { _ in true }.isEmpty
        }
    }

    public func dropHistory(_ fileID: FileID) throws(StoreError) {
        takingIn?.histories[fileID] = nil
        guard let path = try db.rows("SELECT path FROM histories WHERE file_id = ?", [.id(fileID)], { $0.text(0) }).first else { return }
        try db.query("DELETE FROM histories WHERE file_id = ?", [.id(fileID)])
        try countHistoryPath(path, by: -1)
    }

    /// The names directly below `path` ("" is `.versions/` itself) in byte order, and
    /// whether each is a file's history (else only a directory on the way to some).
    public func historyChildren(of path: String) throws(StoreError) -> [(name: String, isHistory: Bool)] {
        try db.rows("SELECT name, leaves FROM history_dirs WHERE parent = ? ORDER BY name", [.text(path)]) {
            (name: $0.text(0), isHistory: $0.int(1) > 0)
        }
    }

    /// One name below `path`: nil when nothing is shown there.
    public func historyChild(of path: String, name: String) throws(StoreError) -> Bool? {
        try db.rows("SELECT leaves FROM history_dirs WHERE parent = ? AND name = ?", [.text(path), .text(name)]) { $0.int(0) > 0 }.first
    }

    /// The histories shown at `path`.
    public func histories(at path: String) throws(StoreError) -> [FileID] {
        try db.rows("SELECT file_id FROM histories WHERE path = ?", [.text(path)]) { $0.fileID(0) }
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
        if delta > 0 {
            // The names are the namespace's: the folder leaves them to the fold's bookkeeping.
            if isFolderWriting { index.folderWork?.placed.append(path) } else { historyNames.noteTaken(path) }
        }
        guard takingIn != nil else { return try Self.countHistoryPath(path, by: delta, in: db) }
        try Self.countHistoryPath(path, by: delta, in: db) { self.takingIn?.historyDirectories[$0, default: 0] += delta }
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
            try Self.countHistoryName(parent: key.parent, name: key.name, leaves: 0, total: delta, in: db)
        }
    }

    /// `ancestors`: given the directories above the leaf instead of writing them.
    static func countHistoryPath(_ path: String, by delta: Int64, in db: SQLiteDatabase,
                                 ancestors: ((HistoryName) -> Void)? = nil) throws(StoreError) {
        var parent = ""
        let components = PathBytes.components(path, keepingEmpty: true)
        for (i, name) in components.enumerated() {
            let isLeaf = i == components.count - 1
            if !isLeaf, let ancestors {
                ancestors(HistoryName(parent: parent, name: name))
            } else {
                try countHistoryName(parent: parent, name: name, leaves: isLeaf ? delta : 0, total: delta, in: db)
            }
            parent = parent.isEmpty ? name : parent + "/" + name
        }
    }

    /// Adds to one row of `history_dirs`; a row whose total drops to zero goes.
    private static func countHistoryName(parent: String, name: String, leaves: Int64, total: Int64, in db: SQLiteDatabase) throws(StoreError) {
        try db.query("""
            INSERT INTO history_dirs(parent, name, leaves, total) VALUES(?, ?, ?, ?)
            ON CONFLICT(parent, name) DO UPDATE SET leaves = leaves + excluded.leaves, total = total + excluded.total
            """, [.text(parent), .text(name), .int(leaves), .int(total)])
        if total < 0 { try db.query("DELETE FROM history_dirs WHERE parent = ? AND name = ? AND total <= 0", [.text(parent), .text(name)]) }
    }

    /// Builds `history_dirs` from `histories` (upgrading a store from before format 3).
    static func buildHistoryDirectories(_ db: SQLiteDatabase) throws(StoreError) {
        let paths = try db.rows("SELECT path FROM histories", []) { $0.text(0) }
        try db.transaction { () throws(StoreError) in
            for path in paths { try countHistoryPath(path, by: 1, in: db) }
        }
    }
}
