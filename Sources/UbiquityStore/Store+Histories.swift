/// Where histories are shown under `.versions/`: the `histories` table (a file's current
/// path, or the last path it had) and `history_dirs`, the directory tree those paths make,
/// with counts, so a listing or lookup under `.versions/` reads only the rows it returns
/// (store format 3). Every change of a history's path goes through the index's
/// `placeHistory` or `dropHistory` (Index+Histories), the one place that keeps the two
/// tables in step.
extension Store {
    /// Of `fileIDs`, those with a row in `histories` (placed, live or not).
    func placedHistories(_ fileIDs: [FileID]) throws(StoreError) -> Set<FileID> {
        Set(try db.rows(in: fileIDs.map { SQLValue.id($0) }, { "SELECT file_id FROM histories WHERE file_id IN (\($0))" }) { $0.fileID(0) })
    }

    /// Moves where a history is shown (after a rename, a save, a remote record). With the
    /// overlay on, the change goes there (a rename reads and writes no SQLite; the fold's
    /// `placeHistory` writes nothing for a history already shown there), unless the
    /// overlay shows it there already (an editor's save placed it a moment before).
    public func setHistory(_ fileID: FileID, path: String, live: Bool) throws(StoreError) {
        guard overlayOn else { return try claimedIndex.placeHistory(fileID, path: path, live: live) }
        if let shown = overlay.histories[fileID], shown.live == live, shown.path.utf8.elementsEqual(path.utf8) { return }
        try record(.history(fileID, path: path, live: live))
    }

    /// Marks a history as having no live file (it stays shown at its last path).
    public func retireHistory(_ fileID: FileID) throws(StoreError) { try claimedIndex.retireHistory(fileID) }

    /// Stops showing a history under .versions/, its one version too when that never
    /// left this device (`Index.withdrawUnsentHistory`). Returns false when it keeps them.
    public func withdrawUnsentHistory(_ fileID: FileID) throws(StoreError) -> Bool {
        try claimedIndex.withdrawUnsentHistory(fileID)
    }

    /// What becomes of the history of a file renamed over another file whose history it
    /// continues (an editor's atomic save, `sed -i`): a history of one version this device
    /// made goes (`withdrawUnsentHistory`), or only leaves `.versions/` when that version
    /// was sent; a longer history, or another device's, stays shown at its old path.
    /// A history whose one version is a save the overlay still holds (the usual case: the
    /// temp file was written and renamed within the group commit's interval) is withdrawn
    /// there, so the rename folds nothing: the fold then writes neither the save nor its
    /// history (`foldTree`). So does a history the fold has written: its versions are read
    /// around the gate, and the overlay takes the withdrawal (which the fold then does
    /// as `withdrawUnsentHistory` lets it, else it drops the history) or the retirement.
    /// `inode`: the file renamed, whose entry in the working set may know that its head
    /// is the history's only version (a temp file saved once, then folded): withdrawn then
    /// without a read.
    public func endHistoryRenamedOver(_ fileID: FileID, of inode: InodeNumber?) throws(StoreError) {
        if overlayOn, let only = overlay.onlySave(of: fileID), try !hasIndexedVersions(fileID) {
            try record(.withdraw(row: only.row, id: only.id, fileID: fileID))
            return
        }
        // The working set alone (its entry is never older than the tree): an inode it does
        // not hold has no head known there either, and is not read for nothing.
        if overlayOn, let inode, let head = tree.withLock({ t -> InodeCache.HeadVersion? in
            guard let node = t.inodes.get(inode)?.inode, node.fileID == fileID, let row = node.head else { return nil }
            return t.inodes.headVersion(inode, row: row)
        }), !head.isLocal, head.onlySince == index.versionsWrittenAside {
            try record(.withdraw(row: head.row, id: head.id, fileID: fileID))
            return
        }
        if overlayOn {
            var versions = overlay.versions(of: fileID).mapValues { (id: $0, own: true) }
            let stored = try db.aroundGate { () throws(StoreError) in
                try db.rows("SELECT row, id, device_id FROM \(Store.versionsWithDevices) WHERE file_id = ? LIMIT 2", [.id(fileID)]) {
                    (row: $0.int(0), id: $0.versionID(1), own: $0.deviceID(2) == deviceID)
                }
            }
            for v in stored { versions[v.row] = (v.id, v.own) }
            if versions.count == 1, let (row, only) = versions.first, only.own {
                try record(.withdraw(row: row, id: only.id, fileID: fileID))
            } else if let shown = try shownPath(of: fileID) {
                try record(.history(fileID, path: shown, live: false))
            }
            return
        }
        let versions = try versions(of: fileID)
        if versions.count <= 1 && versions.allSatisfy({ $0.deviceID == deviceID }) {
            if try !withdrawUnsentHistory(fileID) { try dropHistory(fileID) }
        } else {
            try retireHistory(fileID)
        }
    }

    /// Where history `fileID` is shown under `.versions/` (nil: nowhere): the overlay's
    /// placement, else SQLite's row, read around the gate.
    private func shownPath(of fileID: FileID) throws(StoreError) -> String? {
        if let shown = overlay.histories[fileID] { return shown.path }
        return try db.aroundGate { () throws(StoreError) in
            try db.rows("SELECT path FROM histories WHERE file_id = ?", [.id(fileID)]) { $0.text(0) }.first
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

    /// Stops showing a history under .versions/ (its versions stay in the database).
    public func dropHistory(_ fileID: FileID) throws(StoreError) { try claimedIndex.dropHistory(fileID) }

    /// The names directly below `path` ("" is `.versions/` itself) in byte order, and
    /// whether each is a file's history (else only a directory on the way to some).
    public func historyChildren(of path: String) throws(StoreError) -> [(name: String, isHistory: Bool)] {
        try settleAllMoves()
        return try VersionLog.historyChildren(of: path, in: db)
    }

    /// One name below `path`: nil when nothing is shown there.
    public func historyChild(of path: String, name: String) throws(StoreError) -> Bool? {
        try settleAllMoves()
        return try VersionLog.historyChild(of: path, name: name, in: db)
    }

    /// The histories shown at `path`.
    public func histories(at path: String) throws(StoreError) -> [FileID] {
        try settleAllMoves()
        return try VersionLog.histories(at: path, in: db)
    }

    /// Adds `delta` to the counts of `path` and its ancestors in `history_dirs`; a name
    /// whose count drops to zero goes (`Index.countHistoryPath` sums the ancestors' during
    /// a pull slice). `ancestors`: given the directories above the leaf instead of
    /// writing them.
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
    static func countHistoryName(parent: String, name: String, leaves: Int64, total: Int64, in db: SQLiteDatabase) throws(StoreError) {
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
