/// Files on demand (store format 11): a file's current version may name chunks that are
/// not on this device yet: their places in the backing store are known (`chunk_places`),
/// and the chunk store fetches them when they are read. Each inode keeps how many bytes
/// of its content are absent, so `stat` (st_blocks), `user.ubiquity.downloaded` and
/// background downloading need no look at the chunks; the partial index `inodes_absent`
/// is the queue of files not downloaded.
///
/// The count is exact when it is set (a record shown, a save, a refresh); chunks that
/// arrive for one file also make other files that share them more complete, which their
/// count shows at their next refresh (a read to the end, a download, a status query).
extension Store {
    /// Chunks up to this size travel inside their records (backing format 3), so every
    /// device has them as soon as it has the record (`RecordCodec.maxInline`).
    public static let inlineChunkLimit = 1024


    /// Bytes of the list's pieces whose chunk is not here (each chunk looked at once).
    func absentBytes(_ list: ChunkList) -> Int64 {
        var local: [ChunkID: Bool] = [:]
        var total: Int64 = 0
        for (id, size) in list.chunks {
            let here = local[id] ?? chunks.isLocal(id)
            local[id] = here
            if !here { total += Int64(size) }
        }
        return total
    }

    /// Looks again at which chunks of file `id`'s current content are here (written only
    /// when that changed): the bytes that are not, and whether the file's `DownloadState`
    /// changed (watchers hear of it).
    @discardableResult
    public func refreshAbsent(_ id: InodeNumber) throws(StoreError) -> (absent: Int64, stateChanged: Bool) {
        guard var inode = try node(id)?.inode, inode.kind == .file, let head = inode.head else { return (0, false) }
        let absent = min(absentBytes(try chunkList(row: head)), inode.allocated)
        let before = DownloadState(allocated: inode.allocated, absent: inode.absent)
        // A file evicted by hand that is all here again (it was read) is kept as usual.
        let keep = absent == 0 && inode.keep == .evicted ? KeepPolicy.automatic : inode.keep
        if absent != inode.absent || keep != inode.keep {
            inode.absent = absent
            inode.keep = keep
            try update(inode)
        }
        return (absent, DownloadState(allocated: inode.allocated, absent: absent) != before)
    }

    /// Files whose content is not all here that background downloading fetches, in inode
    /// order after `after`, at most `limit`: with `everything` (`--download all`) all but
    /// those evicted by hand, else only the pinned ones.
    public func filesNotDownloaded(after: InodeNumber, limit: Int, everything: Bool) throws(StoreError) -> [InodeNumber] {
        try db.rows("SELECT id FROM inodes WHERE absent > 0 AND id > ? AND \(everything ? "keep != 2" : "keep = 1") ORDER BY id LIMIT ?",
                    [.inode(after), .int(Int64(limit))]) { $0.inode(0) }
    }

    /// Sets what this device keeps of file `id` (local state: never synced).
    public func setKeep(_ id: InodeNumber, _ keep: KeepPolicy) throws(StoreError) {
        guard var inode = try node(id)?.inode, inode.kind == .file, inode.keep != keep else { return }
        inode.keep = keep
        try update(inode)
    }

    /// The chunks of unresolved conflict versions that are not here (each once): in `all`
    /// mode they are downloaded too (taking one makes a record that names its chunks,
    /// and what a conflict shows must not depend on a pack its author may collect). The
    /// cost is in proportion to the unresolved conflicts.
    public func missingConflictChunks() throws(StoreError) -> [ChunkWant] {
        var seen: Set<ChunkID> = []
        var wants: [ChunkWant] = []
        for path in try replica.conflictedPaths() {
            for record in try replica.state(at: path).conflicts where record.kind == .file && !record.isTombstone {
                for (chunk, size) in try chunkList(row: record.row).chunks where seen.insert(chunk).inserted && !chunks.isLocal(chunk) {
                    wants.append(ChunkWant(id: chunk, size: size))
                }
            }
        }
        return wants
    }

    /// The chunks of file `id`'s current content that are not here (each once).
    public func missingChunks(of id: InodeNumber) throws(StoreError) -> [ChunkWant] {
        guard let inode = try node(id)?.inode, inode.kind == .file, inode.absent > 0, let head = inode.head else { return [] }
        var seen: Set<ChunkID> = []
        var wants: [ChunkWant] = []
        for (chunk, size) in try chunkList(row: head).chunks where seen.insert(chunk).inserted && !chunks.isLocal(chunk) {
            wants.append(ChunkWant(id: chunk, size: size))
        }
        return wants
    }
}
