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
struct InodeCache {
    let capacity: Int
    private var newer: [InodeNumber: TreeNode] = [:]
    private var older: [InodeNumber: TreeNode] = [:]

    init(capacity: Int) { self.capacity = max(2, capacity) }

    var count: Int { newer.count + older.count }

    mutating func get(_ id: InodeNumber) -> TreeNode? {
        if let hit = newer[id] { return hit }
        guard let hit = older.removeValue(forKey: id) else { return nil }
        put(hit)
        return hit
    }

    mutating func put(_ node: TreeNode) {
        let id = node.inode.id
        older[id] = nil
        newer[id] = node
        if newer.count >= capacity / 2 {
            older = newer
            newer = [:]
        }
    }

    mutating func remove(_ id: InodeNumber) {
        newer[id] = nil
        older[id] = nil
    }

    mutating func removeAll() {
        newer = [:]
        older = [:]
    }
}
