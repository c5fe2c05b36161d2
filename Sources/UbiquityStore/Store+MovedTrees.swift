/// What a directory's move leaves below it. Every inode there has a new path, so the sync
/// step must look at each (`changed`), and every file's history is shown at the file's
/// path under `.versions/`. A rename does neither: it puts the directory in `moved`
/// (one pending entry in its log frame), and the work, which grows with the subtree,
/// is done here later, a slice at a time:
/// - by the group commit's loop once the overlay is folded (`foldDone`, a slice a step),
///   so it is usually done a moment after the rename;
/// - first thing in whatever reads what it writes: a sync step's slice, a pull slice,
///   a read of `.versions/`, prune (the last three a slice a hold before their own,
///   `SharedStore.settleMoves`).
///
/// A slice is one transaction: the directories it finishes leave `moved`, and their
/// subdirectories join it, so the walk resumes after a crash where it stopped (inside
/// a directory, from that directory's first name).
///
/// Only moves that leave every file below local-only or synced as it was come here
/// whole: a move across a `.nosync` name changes the files' versions, which the
/// filesystem does at the rename (`Meta.pathsChanged`). The histories then stand where
/// this would put them, and settling finds nothing to move.
extension Store {
    /// Entries a slice of `settleMoves` visits (a bigger directory goes on in the next
    /// slice). A slice holds the store's lock: at a few statements an entry, this costs about what
    /// a sync step's slice of 64 changes does.
    public static let movedEntriesPerSlice = 256

    /// Whether moved directories wait to be settled.
    public var hasUnsettledMoves: Bool { !moved.isEmpty }

    /// Settles moved directories until `limit` entries were visited, as one sync step
    /// (its own transaction). Returns whether more remain.
    @discardableResult
    public func settleMoves(limit: Int = movedEntriesPerSlice) throws(StoreError) -> Bool {
        guard !readOnly, !moved.isEmpty else { return false }
        do {
            return try syncStep(viewing: false) { () throws(StoreError) -> Bool in
                var visited = 0
                while visited < limit, let directory = moved.members.first {
                    visited += try settleMoved(directory, limit: limit - visited)
                }
                return !moved.isEmpty
            }
        } catch {
            // The step rolled back: the directories start again from their first names.
            movedCursors = [:]
            throw error
        }
    }

    /// Settles every moved directory: before a read of what settling writes, and before
    /// a rename across a local-only name (it retires or begins histories where they are
    /// shown, which must be their files' paths).
    public func settleAllMoves() throws(StoreError) {
        while try settleMoves(limit: .max) {}
    }

    /// The saves the overlay holds below a directory moved from `old` to `new`: each one's
    /// history goes to its file's new path now, in the overlay, so that the fold writes
    /// the save with that path (`Index.amendedSaves` takes it from a placement in the same
    /// part) and a tree written under a staging name and moved before the fold (`tar -x`
    /// into `pkg.tmp`, then `mv pkg.tmp pkg`) is one record a file, not a save at the old
    /// path and a record of the move. Memory only: the overlay's saves, a burst at most.
    /// A save whose file was moved or deleted since (its history shown elsewhere) is left
    /// to the settling.
    func placeUnfoldedSaves(movedFrom old: String, to new: String) throws(StoreError) {
        guard overlayOn, !overlay.saves.isEmpty else { return }
        var placed: Set<FileID> = []
        for save in overlay.saves.values where !overlay.localRows.contains(save.row) && Self.isBelow(save.path, old) {
            guard placed.insert(save.fileID).inserted, let shown = overlay.histories[save.fileID], shown.live,
                  shown.path.utf8.elementsEqual(save.path.utf8) else { continue }
            let path = new + String(decoding: save.path.utf8.dropFirst(old.utf8.count), as: UTF8.self)
            if !LocalOnly.contains(path) { try setHistory(save.fileID, path: path, live: true) }
        }
    }

    /// Whether `path` is below directory `directory` ("" is the root), by bytes.
    static func isBelow(_ path: String, _ directory: String) -> Bool {
        guard !directory.isEmpty else { return true }
        let p = path.utf8, d = directory.utf8
        return p.count > d.count && p.starts(with: d) && p[p.index(p.startIndex, offsetBy: d.count)] == UInt8(ascii: "/")
    }

    /// One directory: its entries into `changed`, its subdirectories into `moved`, and
    /// the history of each file whose primary name is here to that name's path (a hard
    /// link's other names do not move it). At most `limit` entries, in name order: a
    /// directory with more stays in `moved`, and the next slice goes on after the last
    /// name settled (`movedCursors`, in memory: after a crash the directory is walked
    /// again from its start, which changes nothing already done). An entry made or moved
    /// in behind the cursor placed its own history. Returns how many entries it visited.
    private func settleMoved(_ directory: InodeNumber, limit: Int) throws(StoreError) -> Int {
        guard let node = try node(directory), node.inode.kind == .directory, node.inode.nlink > 0,
              let path = try treePath(of: directory) else {
            try moved.remove(directory)
            movedCursors[directory] = nil
            return 0
        }
        // In the step's transaction: the gate has folded the overlay, SQLite is the tree.
        let after = movedCursors[directory] ?? ""
        let page = min(limit, Self.movedEntriesPerSlice * 64)
        let children = try db.rows("""
            SELECT \(Self.qualifiedInodeColumns), e.name FROM entries e JOIN inodes i ON i.id = e.inode
            WHERE e.parent = ? AND e.name > ? ORDER BY e.name LIMIT ?
            """, [.inode(directory), .text(after), .int(Int64(page))]) { r in (name: r.text(19), node: Self.treeNode(r)) }
        if children.count < page {
            try moved.remove(directory)
            movedCursors[directory] = nil
        } else {
            movedCursors[directory] = children.last?.name
        }
        for child in children {
            guard case .success(let childNode) = child.node else { continue } // a damaged row: fsck's to report
            let inode = childNode.inode
            try changed.insert(inode.id)
            switch inode.kind {
            case .directory:
                try moved.insert(inode.id)
            case .file:
                guard let fileID = inode.fileID, inode.head != nil,
                      childNode.link == EntryRef(parent: directory, name: child.name) else { continue }
                let filePath = path.isEmpty ? child.name : path + "/" + child.name
                if !LocalOnly.contains(filePath) { try setHistory(fileID, path: filePath, live: true) }
            default:
                break
            }
        }
        return children.count
    }
}
