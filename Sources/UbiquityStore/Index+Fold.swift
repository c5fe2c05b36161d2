import UbiquitySystem

/// A fold's rows: the one place a tree change becomes SQL, and the transaction's rest
/// (withdrawals kept, the log's mark, the intents applied). The folder runs it with the
/// index and a part alone (`write`); the store's side runs it for a fold through the gate
/// (`Store.foldTree`) and for a change written straight to SQLite (`Store.record`).
extension Index {
    /// What a fold's rows need of the namespace, which the index does not read: the part
    /// carries it for the folder, the store's side gives it for what it writes.
    struct NamespaceFacts {
        /// Of the inodes the changes drop, those with reserved ranges (nil: not known,
        /// so each dropped inode's row in `reserves` is deleted).
        var reserved: Set<InodeNumber>?
        /// The overlay's versions, by row, of the heads the changes' tombstones name. Any
        /// other head is read from SQLite: it was saved before the tombstone, so this
        /// fold or an earlier one wrote it.
        var heads: [Int64: Version] = [:]
    }

    static let treeLogMarkKey = "tree_log_mark"
    /// Saves withdrawn by folded frames, until their intents are noted as applied
    /// (`keepWithdrawals`; the name is older than that rule).
    static let withdrawnKey = "withdrawn_at_open"

    /// Writes a fold's changes, in its transaction, with the mark of its last frame.
    /// Written whole or not at all, its inner transactions flattened into it. Its records
    /// enter the synced view at the next sync step; what a withdrawal takes out of it
    /// (a save the view had taken in) is counted once (`deferringConflicts`), and what
    /// the histories begun since the last fold surely lack (heads, dots) is not read
    /// (`remembering`, `rememberFreshNodes`).
    func writeFolded(_ changes: [TreeChange], fresh: Set<FileID>, through: LogSequence, facts: NamespaceFacts) throws(StoreError) {
        replacedInFold = []
        try replica.remembering { () throws(StoreError) in
            replica.rememberFreshNodes(Set(fresh.map { NodeID.file($0) }))
            try replica.deferringConflicts { () throws(StoreError) in
                try summingHistoryDirectories { () throws(StoreError) in
                    for change in Self.written(changes) { try writeRow(change, facts: facts) }
                }
            }
        }
        // Saves that are gone for good, whose intents may not be applied yet: an
        // editor's temp file withdrawn, a local file's version replaced.
        var withdrawn = replacedInFold
        for case .withdraw(_, let id, _) in changes { withdrawn.append(id) }
        try keepWithdrawals(withdrawn)
        try connection.query("REPLACE INTO settings(key, value) VALUES(?, ?)", [.text(Self.treeLogMarkKey), .text(String(through.value))])
    }

    /// The changes of a fold that are written, in order:
    /// - A save withdrawn in the same fold is not, nor where its history is shown: the
    ///   withdrawal then only makes sure no history row is left.
    /// - An inode's row is written once, as it is last: a put that a later put or drop of
    ///   the same inode follows is not written (a file made, written and closed is three
    ///   puts). A local save is the one change that reads inodes (whether another inode's
    ///   head is the row it replaces), so puts before it are written.
    /// - A save takes the path, mode and mtime its file has at the end of the fold, when
    ///   the file is still there with that save as its head and one name. The save has
    ///   not left the device (it enters SQLite and uploads only now, the view after), so
    ///   nobody saw the state it replaces; the sync step then finds nothing to record for
    ///   the file. `rsync` and `cp -p` save a temp file, then set its mode and times and
    ///   rename it: without this, each file became two records, the second costing the
    ///   sync step about 30 statements (`WorkTests.copiedFilesAreOneRecordEach`).
    static func written(_ changes: [TreeChange]) -> [TreeChange] {
        var withdrawn: (rows: Set<Int64>, histories: Set<FileID>) = ([], [])
        for case .withdraw(let row, _, let fileID) in changes {
            withdrawn.rows.insert(row)
            withdrawn.histories.insert(fileID)
        }
        let amended = amendedSaves(changes)
        var result: [TreeChange] = []
        var later: Set<InodeNumber> = [] // inodes a later change writes, since the last local save
        for change in changes.reversed() {
            switch change {
            case .save(let v) where withdrawn.rows.contains(v.row): continue
            case .save(let v): result.append(.save(amended[v.row] ?? v)); continue
            case .localSave(let v, _, _) where withdrawn.rows.contains(v.row): continue
            case .history(let fileID, _, _) where withdrawn.histories.contains(fileID): continue
            case .putInode(let node) where !later.insert(node.inode.id).inserted: continue
            case .dropInode(let id): later.insert(id)
            case .localSave: later = []
            default: break
            }
            result.append(change)
        }
        return result.reversed()
    }

    /// The saves of `changes` that `written` amends, by row, as they are written (also
    /// what the overlay keeps of a folded part: `TreeOverlay.markFolded`).
    static func amendedSaves<C: Collection<TreeChange>>(_ changes: C) -> [Int64: SavedVersion] {
        var last: [InodeNumber: Inode?] = [:] // each inode as the fold leaves it (nil: dropped)
        var shown: [FileID: (path: String, live: Bool)] = [:] // each history as the fold leaves it
        var tombstoned: Set<FileID> = []
        for change in changes {
            switch change {
            case .putInode(let node): last[node.inode.id] = node.inode
            case .dropInode(let id): last[id] = .some(nil)
            case .history(let fileID, let path, let live): shown[fileID] = (path, live)
            case .tombstone(_, _, let fileID, _, _, _): tombstoned.insert(fileID)
            default: break
            }
        }
        var holders: [Int64: Inode?] = [:] // by the row of the version that is its head (nil: two have it)
        for case let inode?? in last.values where inode.kind == .file && inode.nlink == 1 {
            if let head = inode.head { holders[head] = holders[head] == nil ? inode : .some(nil) }
        }
        var amended: [Int64: SavedVersion] = [:]
        for case .save(var v) in changes {
            guard let inode = holders[v.row] ?? nil, inode.fileID == v.fileID, !tombstoned.contains(v.fileID),
                  let history = shown[v.fileID], history.live else { continue }
            if v.path.utf8.elementsEqual(history.path.utf8) && v.mode == inode.mode && v.mtime == inode.mtime { continue }
            v.path = history.path
            v.mode = inode.mode
            v.mtime = inode.mtime
            amended[v.row] = v
        }
        return amended
    }

    /// An inode's row, in the order of `Store.inodeColumns`.
    static func inodeValues(_ node: TreeNode) -> [SQLValue] {
        let inode = node.inode
        return [
            .inode(inode.id), .int(inode.kind.rawValue), .int(Int64(inode.mode)), .int(Int64(inode.uid)),
            .int(Int64(inode.gid)), .int(inode.size), .int(inode.atime), .int(inode.mtime), .int(inode.ctime),
            .int(Int64(bitPattern: inode.rdev)), inode.target.map { .text($0) } ?? .null,
            inode.fileID.map { .id($0) } ?? .null, inode.head.map { .int($0) } ?? .null, .int(inode.allocated),
            .int(Int64(inode.nlink)), node.link.map { .inode($0.parent) } ?? .null,
            node.link.map { .text($0.name) } ?? .null, .int(inode.absent), .int(inode.keep.rawValue),
        ]
    }

    /// The one place a tree change becomes SQL.
    func writeRow(_ change: TreeChange, facts: NamespaceFacts) throws(StoreError) {
        let db = connection
        switch change {
        case .putInode(let node):
            try db.query(Store.upsertInode, Self.inodeValues(node))
        case .dropInode(let id):
            try db.query("DELETE FROM inodes WHERE id = ?", [.inode(id)])
            try db.query("DELETE FROM xattrs WHERE inode = ?", [.inode(id)])
            // Most files have no reserve: nothing to delete, and no statement.
            if facts.reserved?.contains(id) ?? true { try db.query("DELETE FROM reserves WHERE inode = ?", [.inode(id)]) }
        case .putEntry(let parent, let name, let inode):
            try db.query("INSERT INTO entries(parent, name, inode) VALUES(?, ?, ?) ON CONFLICT(parent, name) DO UPDATE SET inode = excluded.inode",
                         [.inode(parent), .text(name), .inode(inode)])
        case .removeEntry(let parent, let name):
            try db.query("DELETE FROM entries WHERE parent = ? AND name = ?", [.inode(parent), .text(name)])
        case .pending(let kind, let key):
            try db.query("INSERT OR IGNORE INTO pending(kind, key) VALUES(?, ?)", [.int(kind), .text(key)])
        // A version folded twice (a fold that failed halfway, written again) is there once.
        case .save(let v):
            guard try !mayBeWritten(v.id) else { return }
            let record = SyncRecord(id: v.id, node: .file(v.fileID), kind: .file, parents: v.parents, deviceID: deviceID,
                                    deviceName: v.deviceName, committed: v.committed, mtime: v.mtime, mode: v.mode,
                                    isTombstone: false, isMeta: false, path: v.path, chunks: v.chunks, xattrs: v.xattrs)
            _ = try insert(record, from: .folded, row: v.row)
        case .localSave(let v, let inode, let replaces):
            guard try !mayBeWritten(v.id) else { return }
            // A local file keeps only its latest version; one another inode still shows
            // stays (else a hard link can point at nothing: t-differential.py seed 105).
            if let replaces {
                replacedInFold += try db.rows("DELETE FROM versions WHERE row = ?1 AND local = 1 AND NOT EXISTS (SELECT 1 FROM inodes WHERE head = ?1 AND id != ?2) RETURNING id",
                                              [.int(replaces), .inode(inode)]) { $0.versionID(0) }
            }
            let record = SyncRecord(id: v.id, node: .file(v.fileID), kind: .file, parents: v.parents, deviceID: deviceID,
                                    deviceName: v.deviceName, committed: v.committed, mtime: v.mtime, mode: v.mode,
                                    isTombstone: false, isMeta: false, path: v.path, chunks: v.chunks, xattrs: [])
            _ = try insert(record, from: .hereLocalOnly, row: v.row)
        case .tombstone(let row, let id, let fileID, let head, let path, let committed):
            guard try !mayBeWritten(id) else { return }
            var previous = head.flatMap { facts.heads[$0] }
            if previous == nil, let head { previous = try versionRow(head) }
            try writeTombstone(row: row, id: id, fileID: fileID, previous: previous, path: path, committed: committed, origin: .folded)
        case .history(let fileID, let path, let live):
            try placeHistory(fileID, path: path, live: live)
        // The save was not written (`Store.foldTree`), or, folded before the withdrawal
        // (which the fold's order makes unlikely), goes as `withdrawUnsentHistory` lets it.
        case .withdraw(_, _, let fileID):
            if try !withdrawUnsentHistory(fileID) { try dropHistory(fileID) }
        case .xattr(let id, let name, let value?):
            try db.query("REPLACE INTO xattrs(inode, name, value) VALUES(?, ?, ?)", [.inode(id), .text(name), .blob(value)])
        case .xattr(let id, let name, nil):
            try db.query("DELETE FROM xattrs WHERE inode = ? AND name = ?", [.inode(id), .text(name)])
        }
    }

    /// Whether the overlay's version `id` may be in SQLite already (looked up unless a
    /// fold writes it). Only a fold that failed can leave one there (in a transaction
    /// that goes on): a version's id is
    /// new when the overlay takes it, a committed fold leaves the overlay, and a fold
    /// rolled back wrote nothing. The intent log's replay commits its saves straight to
    /// SQLite, after the gate folded what the operation log brought back.
    private func mayBeWritten(_ id: VersionID) throws(StoreError) -> Bool {
        if folding && !foldFailed { return false }
        return try versionExists(id)
    }

    // MARK: intents applied, withdrawals kept

    /// Notes in the transaction about to commit (the batch's, `Store.commitBatch`, or a
    /// fold's) that the intents up to `sequence` are applied: one write per batch, not
    /// one per save, in the transaction of the versions it covers. A frame appended while
    /// no batch was open (an fsync's, of a version committed before) is noted by the next
    /// batch; until then replay skips it, as its version is in the database.
    ///
    /// Every save appended so far is then applied: the withdrawals kept for the intents
    /// not applied yet (`keepWithdrawals`) go in the same transaction.
    /// - Parameter sequence: the last sequence given (the store's `intentSequence` when
    ///   the fold that calls it began: the folder does not read the namespace's).
    func noteIntentsApplied(through sequence: Int64) throws(StoreError) {
        guard connection.level > 0 else { return }
        if sequence > 0 {
            try connection.query("REPLACE INTO settings(key, value) VALUES('intent_applied', ?)", [.text(String(sequence))])
        }
        if withdrawalsKept {
            try connection.query("DELETE FROM settings WHERE key = ?", [.text(Self.withdrawnKey)])
            withdrawalsKept = false
        }
    }

    /// A save that is gone for good (an editor's temp file withdrawn, a local file's
    /// version replaced by its next) may have an intent not applied yet (a fold of a
    /// part, or through the gate, or a batch committed without the fold, notes nothing),
    /// and an open must not record that save again. So such versions are kept in
    /// `settings`, in the transaction that deletes them, until the intents are noted as
    /// applied.
    /// Only intents of a mounted store (it batches) can be pending, and those a fold
    /// brings back from the log (the open's, before batching starts).
    func keepWithdrawals(_ ids: [VersionID]) throws(StoreError) {
        guard !ids.isEmpty, connection.batching || folding else { return }
        let kept = try withdrawnSetting().union(ids)
        try connection.query("REPLACE INTO settings(key, value) VALUES(?, ?)",
                             [.text(Self.withdrawnKey), .text(kept.map(\.hex).sorted().joined(separator: ","))])
        withdrawalsKept = true
    }

    func withdrawnSetting() throws(StoreError) -> Set<VersionID> {
        let text = try connection.rows("SELECT value FROM settings WHERE key = ?", [.text(Self.withdrawnKey)]) { $0.text(0) }.first
        return Set((text ?? "").split(separator: ",").compactMap { VersionID(hex: String($0)) })
    }
}
