/// A live inode as the tree keeps it: its attributes and its primary name (the link its
/// path goes through; nil for the root and for an inode no entry names).
struct TreeNode {
    var inode: Inode
    var link: EntryRef?
}

/// The inodes read lately, so lookups and getattr of a working set do not touch SQLite.
/// Bounded: two generations of at most `capacity / 2` entries each; a hit in the older one
/// moves the entry to the newer, and when the newer fills it becomes the older and the
/// older is dropped. Every entry is also in SQLite, so dropping one costs only a re-read:
/// any inode the kernel still knows stays resolvable.
///
/// An entry may also know what a save of a file the fold has written needs besides its
/// row, so that the save reads no SQLite: the inode's user xattrs (its record carries
/// them; most files have none), known once read or made here and following every
/// `TreeChange.xattr` (`Store.record`); and the id of a version the inode had as its head
/// (the save's parent), by row: a version row never changes, so it holds for as long as
/// the inode's head is that row. Both go with the entry. So does the chunk list of a
/// head it had, by row, when that list is short (`Store.headChunkList`): an open of a
/// file whose version the fold has written then reads no SQLite either.
struct InodeCache {
    /// A version an inode had as its head, or descends from (a history it continues): its
    /// row, id and whether it is local-only.
    struct HeadVersion {
        var row: Int64
        var id: VersionID
        var isLocal: Bool
        /// For a save that began a history this process made: `Index.versionsWrittenAside`
        /// at the save. While that count holds, no other version of the history reached SQLite
        /// from elsewhere, so this save is its only version (`Store.endHistoryRenamedOver`).
        var onlySince: UInt64? = nil
    }

    private struct Entry {
        var node: TreeNode
        /// The inode's xattrs by full name (nil: not known here).
        var xattrs: [String: [UInt8]]?
        var head: HeadVersion?
        var chunks: (row: Int64, list: ChunkList)?
    }

    let capacity: Int
    private var newer: [InodeNumber: Entry] = [:]
    private var older: [InodeNumber: Entry] = [:]

    init(capacity: Int) { self.capacity = max(2, capacity) }

    var count: Int { newer.count + older.count }

    mutating func get(_ id: InodeNumber) -> TreeNode? { entry(id)?.node }

    /// A new version of the inode's row: what was known of its xattrs stays true.
    /// `head`: the head version's id and whether it is local-only, when the read that
    /// found the inode read them too (SQLite's row: `node.inode.head` is its head);
    /// `xattrs`: all of the inode's, when that read knew them.
    mutating func put(_ node: TreeNode, head read: (id: VersionID, isLocal: Bool)? = nil, xattrs: [String: [UInt8]]? = nil) {
        let id = node.inode.id
        let known = newer[id] ?? older.removeValue(forKey: id)
        // A chunk list stays only while the inode's head is its version.
        let chunks = known?.chunks.flatMap { $0.row == node.inode.head ? $0 : nil }
        var head = known?.head
        if let read, let row = node.inode.head { head = HeadVersion(row: row, id: read.id, isLocal: read.isLocal) }
        insert(Entry(node: node, xattrs: known?.xattrs ?? xattrs, head: head, chunks: chunks))
    }

    /// The chunk list of version `row`, if the inode's entry knows it as a head it had.
    mutating func chunkList(_ id: InodeNumber, row: Int64) -> ChunkList? {
        guard let known = entry(id)?.chunks, known.row == row else { return nil }
        return known.list
    }

    /// Keeps version `row`'s chunk list with the inode's entry, if it has one and `row` is
    /// its head (without moving it to the newer generation: a directory's lists are read
    /// at once, from SQLite, whose head may be older than the entry's).
    mutating func knowChunkList(_ id: InodeNumber, row: Int64, _ list: ChunkList) {
        if newer[id]?.node.inode.head == row {
            newer[id]!.chunks = (row, list)
        } else if older[id]?.node.inode.head == row {
            older[id]!.chunks = (row, list)
        }
    }

    /// Version `row`, if the inode's entry knows it as a head it had.
    mutating func headVersion(_ id: InodeNumber, row: Int64) -> HeadVersion? {
        guard let head = entry(id)?.head, head.row == row else { return nil }
        return head
    }

    mutating func knowHead(_ id: InodeNumber, _ head: HeadVersion) {
        if newer[id] != nil { newer[id]!.head = head } else { older[id]?.head = head }
    }

    /// The inode's xattrs, if known here.
    mutating func xattrs(_ id: InodeNumber) -> [String: [UInt8]]? { entry(id)?.xattrs }

    /// What a read found of the inode's xattrs (kept only with the inode's entry).
    mutating func knowXattrs(_ id: InodeNumber, _ all: [String: [UInt8]]) {
        if newer[id] != nil { newer[id]!.xattrs = all } else { older[id]?.xattrs = all }
    }

    /// One xattr set (or removed, nil) on an inode whose xattrs are known here.
    mutating func changeXattr(_ id: InodeNumber, _ name: String, _ value: [UInt8]?) {
        if newer[id] != nil { newer[id]!.xattrs?[name] = value } else { older[id]?.xattrs?[name] = value }
    }

    mutating func remove(_ id: InodeNumber) {
        newer[id] = nil
        older[id] = nil
    }

    mutating func removeAll() {
        newer = [:]
        older = [:]
    }

    /// The entry, moved to the newer generation when it was in the older.
    private mutating func entry(_ id: InodeNumber) -> Entry? {
        if let hit = newer[id] { return hit }
        guard let hit = older.removeValue(forKey: id) else { return nil }
        insert(hit)
        return hit
    }

    private mutating func insert(_ entry: Entry) {
        newer[entry.node.inode.id] = entry
        if newer.count >= capacity / 2 {
            older = newer
            newer = [:]
        }
    }
}
