import UbiquitySystem

/// Versions and histories. A version is appended, never changed; a file's current version
/// is its inode's `head`. Local-only files keep only their latest version (`local = 1`),
/// which is never listed or synced.
extension Store {
    static let versionColumns = "row, id, file_id, parents, device_id, device_name, committed, mtime, mode, size, tombstone, local, path"
    /// The versions table with each row's device (id and name) by its number (format 13).
    static let versionsWithDevices = "versions JOIN devices ON number = device"

    static func version(from r: SQLRow) -> Version {
        Version(row: r.int(0), id: r.versionID(1), node: r.nodeID(2), parents: r.versionIDs(3),
                deviceID: r.deviceID(4), deviceName: r.text(5), committed: r.int(6), mtime: r.int(7),
                mode: UInt32(r.int(8)), size: r.int(9), isTombstone: r.int(10) != 0, isLocal: r.int(11) != 0,
                path: r.text(12))
    }

    /// Records a new current version of a file and returns it.
    /// - Parameters:
    ///   - local: the file is local-only; its previous local version is dropped.
    ///   - versionID: the new version's id (the intent log's replay); a fresh one if nil.
    ///   - written: when the file's bytes last changed, if after its inode says (its mtime,
    ///     and its ctime unless that is later): set in the same inode write as the head.
    @discardableResult
    public func commit(_ id: InodeNumber, content: ChunkList, path: String, local: Bool, versionID: VersionID? = nil,
                       written: Nanos? = nil) throws(StoreError) -> Version {
        guard var inode = try node(id)?.inode, let fileID = inode.fileID else { throw .noSuchVersion("inode \(id) is not a file") }
        if let written {
            inode.mtime = written
            inode.ctime = max(inode.ctime, written) // a chmod after the write keeps its later ctime
        }
        let previous = try parentVersion(inode.head ?? continuedParents[id], of: id)
        let record = SyncRecord(id: versionID ?? .new(), node: .file(fileID), kind: .file,
                                parents: previous.flatMap { $0.isLocal ? nil : [$0.id] } ?? [],
                                deviceID: deviceID, deviceName: deviceName, committed: clock(), mtime: inode.mtime,
                                mode: inode.mode, isTombstone: false, isMeta: false, path: path, chunks: content,
                                xattrs: local ? [] : try currentXattrs(id))
        if overlayOn && (local || previous?.isLocal != true) {
            // Into the overlay and the log: the record enters SQLite and the synced view
            // when it is folded (a local file's version only SQLite, replacing the last).
            // A save that begins a history this process made (no version of it anywhere
            // yet): while nothing else writes one, it is the history's only version.
            let begins = previous == nil && overlay.isFresh(fileID) && overlay.versions(of: fileID).isEmpty
            let row = nextVersionRow
            nextVersionRow += 1
            let saved = SavedVersion(row: row, id: record.id, fileID: fileID, parents: record.parents, deviceName: deviceName,
                                     committed: record.committed, mtime: record.mtime, mode: record.mode, path: path,
                                     chunks: content, xattrs: record.xattrs)
            try treeChange { () throws(StoreError) in
                if local {
                    try self.record(.localSave(saved, inode: id, replaces: previous.flatMap { $0.isLocal ? $0.row : nil }))
                } else {
                    try self.record(.save(saved))
                }
                inode.head = row
                inode.size = content.totalSize
                inode.allocated = content.storedBytes
                inode.absent = inode.absent > 0 ? absentBytes(content) : 0
                try save(inode)
                if !local { try self.record(.history(fileID, path: path, live: true)) }
            }
            continuedParents[id] = nil
            let onlySince = begins ? index.versionsWrittenAside : nil
            tree.withLock {
                $0.inodes.knowHead(id, .init(row: row, id: record.id, isLocal: local, onlySince: onlySince))
                if content.count <= Self.keptChunkListPieces { $0.inodes.knowChunkList(id, row: row, content) }
            }
            try secure(id, content: content, path: path, version: record.id)
            return Version(row: row, id: record.id, node: record.node, parents: record.parents, deviceID: deviceID,
                           deviceName: deviceName, committed: record.committed, mtime: record.mtime, mode: record.mode,
                           size: record.size, isTombstone: false, isLocal: local, path: path)
        }
        let row = try db.transaction { () throws(StoreError) -> Int64 in
            // A local file keeps only its latest version; never drop one that another inode
            // still shows (else a hard link can point at nothing: t-differential.py seed 105).
            if let previous, previous.isLocal,
               try db.rows("SELECT 1 FROM inodes WHERE head = ? AND id != ? LIMIT 1", [.int(previous.row), .inode(id)], { _ in true }).isEmpty {
                try db.query("DELETE FROM versions WHERE row = ?", [.int(previous.row)])
                try claimedIndex.keepWithdrawals([previous.id])
            }
            let row = try insert(record, from: local ? .hereLocalOnly : .here)
            inode.head = row
            inode.size = content.totalSize
            inode.allocated = content.storedBytes
            // Chunks of a file not downloaded that the save kept are still elsewhere.
            inode.absent = inode.absent > 0 ? absentBytes(content) : 0
            try save(inode)
            if !local { try setHistory(fileID, path: path, live: true) }
            return row
        }
        continuedParents[id] = nil
        tree.withLock { $0.inodes.knowHead(id, .init(row: row, id: record.id, isLocal: local)) }
        try secure(id, content: content, path: path, version: record.id)
        // What `version(row:)` would read back, without the read.
        return Version(row: row, id: record.id, node: record.node, parents: record.parents, deviceID: deviceID,
                       deviceName: deviceName, committed: record.committed, mtime: record.mtime, mode: record.mode,
                       size: record.size, isTombstone: false, isLocal: local, path: path)
    }

    /// Records that a file's last name is gone: a tombstone version (kept in its history).
    /// It descends from every live head of the file, so deleting a file in conflict
    /// deletes it, rather than bringing a conflict version back as the file.
    /// `inode`: the file's, whose entry in the working set may know whether its head is
    /// local-only.
    public func commitTombstone(fileID: FileID, head: Int64?, path: String, of inode: InodeNumber?) throws(StoreError) {
        // The tombstone goes to the overlay, its parents worked out at the fold; the dead
        // history the overlay shows for it is checked later if the fold may write none
        // (`TreeOverlay.tombstonesToCheck`), unless the working set knows the head is a
        // synced version (it does for a file of a directory it loaded). A file never
        // saved whose history began in this process has no version anywhere: nothing to
        // record.
        if overlayOn && head == nil && overlay.isFresh(fileID) { return }
        if overlayOn, let head {
            let row = nextVersionRow
            nextVersionRow += 1
            try record(.tombstone(row: row, id: .new(), fileID: fileID, head: head, path: path, committed: clock()))
            overlay.noteNewestMark(fileID, index.versionsWrittenAside)
            if let inode, tree.withLock({ $0.inodes.headVersion(inode, row: head) })?.isLocal == false {
                overlay.noteTombstoneChecked(fileID)
            }
            return
        }
        let previous = try headVersion(head)
        if let row = try claimedIndex.writeTombstone(row: nil, id: .new(), fileID: fileID, previous: previous, path: path, committed: clock(), origin: .here) {
            noteRowChosen(row)
        }
    }

    /// Gives inode `id` the history `fileID` (rename over an existing file continues the
    /// target's history). Its next commit becomes a child of `head`, which the working set
    /// may know as the head of inode `knownFrom` (the target's): the commit then reads
    /// nothing of it.
    public func adoptHistory(_ id: InodeNumber, fileID: FileID, head: Int64?, knownFrom other: InodeNumber?) throws(StoreError) {
        guard var inode = try node(id)?.inode else { return }
        let known = other.flatMap { other in head.flatMap { head in tree.withLock { $0.inodes.headVersion(other, row: head) } } }
        // A target not saved yet that continues a dead history hands on the version it
        // descends from with it: the file taking its history descends from it too.
        if head == nil, let other, let parent = continuedParents[other] { continuedParents[id] = parent }
        // The history the inode leaves has no file any more (the sync step tombstones it
        // unless it is already dead or continued elsewhere).
        try treeChange { () throws(StoreError) in
            if let old = inode.fileID, old != fileID { try orphaned.insert(old) }
            inode.fileID = fileID
            inode.head = head
            try save(inode)
        }
        // Not `onlySince`: the history taken over is the target's, not one this inode began.
        if let known { tree.withLock { $0.inodes.knowHead(id, InodeCache.HeadVersion(row: known.row, id: known.id, isLocal: known.isLocal)) } }
    }

    /// A new, empty file continues the history `dead.fileID`: its first commit becomes a
    /// child of `dead.head`, but its content stays its own (empty), unlike `adoptHistory`.
    public func continueHistory(_ id: InodeNumber, _ dead: DeadHistory) throws(StoreError) {
        try adoptHistory(id, fileID: dead.fileID, head: nil)
        continuedParents[id] = dead.head
        // What the first save reads of that version (`parentVersion`), known already: the
        // newest SQLite has of a history is never local-only here.
        if let row = dead.head, let headID = dead.headID {
            tree.withLock { $0.inodes.knowHead(id, .init(row: row, id: headID, isLocal: false)) }
        }
    }

    /// A file's versions, oldest first (tombstones and local versions excluded); with
    /// `committed`, only those committed in that range (an index range scan).
    public func versions(of fileID: FileID, committed range: ClosedRange<Nanos> = .min ... .max) throws(StoreError) -> [Version] {
        try VersionLog.versions(of: fileID, committed: range, in: db)
    }

    /// The version a save descends from, as `commit` needs it (its id, and whether it
    /// is local-only). A tombstone the overlay holds (a file deleted and made again at
    /// its path: `rm f; echo new > f`) is worked out from the overlay, not folded: its
    /// record is made at the fold, with the id the overlay gave it, and it is surely
    /// made unless the overlay still has to check that (`TreeOverlay.tombstonesToCheck`).
    /// Its parents and times are not known before the fold: empty here.
    /// Of what it returns, `commit` uses the row, the id and whether it is local-only: a
    /// version the working set knows as inode `id`'s head comes with those alone.
    private func parentVersion(_ row: Int64?, of id: InodeNumber) throws(StoreError) -> Version? {
        guard let row else { return nil }
        if let tombstone = overlay.tombstones[row], overlay.tombstonesToCheck[tombstone.fileID] == nil {
            return Version(row: row, id: tombstone.id, node: .file(tombstone.fileID), parents: [], deviceID: deviceID,
                           deviceName: deviceName, committed: 0, mtime: 0, mode: 0, size: 0, isTombstone: true,
                           isLocal: false, path: "")
        }
        if let known = tree.withLock({ $0.inodes.headVersion(id, row: row) }) {
            return Version(row: row, id: known.id, node: .file(.zero), parents: [], deviceID: deviceID, deviceName: deviceName,
                           committed: 0, mtime: 0, mode: 0, size: 0, isTombstone: false, isLocal: known.isLocal, path: "")
        }
        let read = try headVersion(row)
        if let read, !read.isTombstone {
            tree.withLock { $0.inodes.knowHead(id, .init(row: row, id: read.id, isLocal: read.isLocal)) }
        }
        return read
    }

    func headVersion(_ row: Int64?) throws(StoreError) -> Version? {
        guard let row else { return nil }
        return try version(row: row)
    }

    /// Whether version `row` is local-only (nil: no such row), as `version(row:)` would
    /// say, reading one column of the row only.
    func isLocalVersion(row: Int64) throws(StoreError) -> Bool? {
        if overlay.saves[row] != nil { return overlay.localRows.contains(row) }
        if overlay.tombstones[row] != nil { return try version(row: row)?.isLocal }
        return try db.aroundGate { () throws(StoreError) -> Bool? in
            try db.rows("SELECT local FROM versions WHERE row = ?", [.int(row)]) { $0.int(0) != 0 }.first
        }
    }

    /// A version row does not change once written: one the overlay does not hold is read
    /// around the gate (opening a file must not fold); a tombstone it holds is folded first.
    public func version(row: Int64) throws(StoreError) -> Version? {
        if let saved = overlay.saves[row] {
            return Version(row: row, id: saved.id, node: .file(saved.fileID), parents: saved.parents, deviceID: deviceID,
                           deviceName: saved.deviceName, committed: saved.committed, mtime: saved.mtime, mode: saved.mode,
                           size: saved.chunks.totalSize, isTombstone: false, isLocal: overlay.localRows.contains(row), path: saved.path)
        }
        if overlay.tombstones[row] != nil { try foldTree() }
        return try db.aroundGate { () throws(StoreError) in try index.versionRow(row) }
    }

    public func version(id: VersionID) throws(StoreError) -> Version? {
        try db.rows("SELECT \(Store.versionColumns) FROM \(Store.versionsWithDevices) WHERE id = ?", [.id(id)], Store.version(from:)).first
    }

    public func chunkList(row: Int64) throws(StoreError) -> ChunkList {
        if let saved = overlay.saves[row] { return saved.chunks }
        if overlay.tombstones[row] != nil { try foldTree() }
        return try db.aroundGate { () throws(StoreError) in try VersionLog.chunkList(row: row, in: db) }
    }

    /// Lists of at most this many pieces are kept with their inode in the working set (a
    /// file of up to a few hundred KiB); a longer one is read at each open.
    static let keptChunkListPieces = 12

    /// The chunk list of inode `id`'s head version `row`, for an open: the overlay's save,
    /// else the working set's copy (kept at the save, or read with its directory's),
    /// else SQLite. A miss reads the short lists of the heads of every inode of the
    /// directory `parent` (the inode's primary one) with one statement, once, so `cat`,
    /// `grep -r` or `rsync` of a tree run one read a directory, not one a file.
    func headChunkList(_ id: InodeNumber, row: Int64, parent: InodeNumber?) throws(StoreError) -> ChunkList {
        if let saved = overlay.saves[row] { return saved.chunks }
        if let kept = tree.withLock({ $0.inodes.chunkList(id, row: row) }) { return kept }
        if let parent, chunkListsRead.insert(parent).inserted {
            if chunkListsRead.count > Self.chunkListDirectoriesRemembered { chunkListsRead = [parent] }
            try readChunkLists(in: parent)
            if let kept = tree.withLock({ $0.inodes.chunkList(id, row: row) }) { return kept }
        }
        return try chunkList(row: row)
    }

    public func headChunkList(_ id: InodeNumber, row: Int64) throws(StoreError) -> ChunkList {
        try headChunkList(id, row: row, parent: nil)
    }

    /// Directories whose lists `headChunkList` read lately are remembered up to this many
    /// (then forgotten at once): a miss there reads its own list, not the directory's again.
    static let chunkListDirectoriesRemembered = 4096
    /// A directory of more entries has its lists read one open at a time.
    static let chunkListDirectoryLimit = 2048

    /// Keeps the short head chunk lists of the inodes of `parent` that the working set
    /// holds. Around the gate: a row the overlay changed is checked at use (by row), and
    /// versions in SQLite never change.
    private func readChunkLists(in parent: InodeNumber) throws(StoreError) {
        let rows = try db.aroundGate { () throws(StoreError) in
            try db.rows("""
                SELECT i.id, i.head, CASE WHEN length(v.chunks) <= \(Self.keptChunkListPieces * 36) THEN v.chunks END
                FROM (SELECT inode FROM entries WHERE parent = ? LIMIT \(Self.chunkListDirectoryLimit)) e
                JOIN inodes i ON i.id = e.inode JOIN versions v ON v.row = i.head
                """, [.inode(parent)]) { r in (id: r.inode(0), row: r.int(1), blob: r.isNull(2) ? nil : r.blob(2)) }
        }
        var lists: [(InodeNumber, Int64, ChunkList)] = []
        for row in rows {
            guard let blob = row.blob, let list = ChunkList(encoded: blob), list.count <= Self.keptChunkListPieces else { continue }
            lists.append((row.id, row.row, list))
        }
        tree.withLock { t in for (id, row, list) in lists { t.inodes.knowChunkList(id, row: row, list) } }
    }

    /// Every version's row and chunk list (fsck, gc).
    public func allChunkLists(_ body: (Int64, VersionID, ChunkList?) throws(StoreError) -> Void) throws(StoreError) {
        let rows = try db.rows("SELECT row, id, chunks FROM versions", []) { ($0.int(0), $0.versionID(1), $0.blob(2)) }
        for (row, id, blob) in rows { try body(row, id, ChunkList(encoded: blob)) }
    }

    public var versionCount: Int {
        (try? db.rows("SELECT count(*) FROM versions WHERE tombstone = 0 AND local = 0 AND meta = 0 AND kind = 1", []) { Int($0.int(0)) }.first) ?? 0
    }

    /// Appends record `r`'s version row, in the row SQLite chooses, and adds it to the
    /// synced view (`Index.insert`). Returns the row.
    func insert(_ r: SyncRecord, from origin: Index.Origin) throws(StoreError) -> Int64 {
        let row = try claimedIndex.insert(r, from: origin)
        noteRowChosen(row)
        return row
    }

    /// A version row SQLite chose (written straight to SQLite): the rows the overlay gives
    /// from here on come after it. (A row given, the overlay's, is below the next already;
    /// the folder writes only those.)
    func noteRowChosen(_ row: Int64) { nextVersionRow = max(nextVersionRow, row + 1) }
}
