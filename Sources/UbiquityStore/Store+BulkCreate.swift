/// New inodes and their entries written as sets: a joining device's reconcile makes tens
/// of thousands of files a slice, and an upsert of the inode and one of the entry per
/// file, each in a transaction of its own inside the step's, would cost more than the
/// rows themselves. While `creatingInBulk` runs, `create` (without touching the parent) keeps each
/// new row here; `node` and `childID` look here first, so the step reads what it made;
/// and the rows go to SQLite with multi-row INSERTs at the end, in the same transaction.
extension Store {
    /// Rows a bulk create holds until it writes them.
    struct BulkCreates {
        var nodes: [InodeNumber: TreeNode] = [:]
        var order: [InodeNumber] = []
        var entries: [InodeNumber: [NameKey: InodeNumber]] = [:]
    }

    /// Rows of one multi-row INSERT: 19 values each for an inode, 950 in all, under the
    /// 999 bound parameters that SQLite before 3.32 allows.
    static let bulkRowsPerStatement = 50

    /// Runs `body` with new inodes' rows held (`create`), then writes them. Only where the
    /// tree is written straight to SQLite (a sync step's transaction), never through the
    /// overlay: a request's create stays one change in the log.
    func creatingInBulk<T>(_ body: () throws(StoreError) -> T) throws(StoreError) -> T {
        guard !overlayOn, bulkCreates == nil else { return try body() }
        bulkCreates = BulkCreates()
        defer { bulkCreates = nil }
        let result = try body()
        try writeBulkCreates()
        return result
    }

    /// Holds a new inode and its entry (`create` with the parent left to its caller).
    func holdCreated(_ node: TreeNode) {
        guard let link = node.link else { return }
        bulkCreates!.nodes[node.inode.id] = node
        bulkCreates!.order.append(node.inode.id)
        bulkCreates!.entries[link.parent, default: [:]][NameKey(link.name)] = node.inode.id
        tree.withLock { t in
            t.inodes.put(node)
            t.directories.put(link.parent, NameKey(link.name), node.inode.id)
        }
    }

    /// Takes a change to what is held (`record`, with the tree written straight to
    /// SQLite): a held inode put again is kept as it is now (returns true); any other
    /// change of a held inode or entry writes what is held first.
    func absorbInBulk(_ change: TreeChange) throws(StoreError) -> Bool {
        guard let held = bulkCreates, !held.order.isEmpty else { return false }
        switch change {
        case .putInode(let node) where held.nodes[node.inode.id] != nil:
            bulkCreates!.nodes[node.inode.id] = node
            return true
        case .dropInode(let id) where held.nodes[id] != nil:
            try writeBulkCreates()
        case .putEntry(let parent, let name, let id) where held.nodes[id] != nil || held.entries[parent]?[NameKey(name)] != nil:
            try writeBulkCreates()
        case .removeEntry(let parent, let name) where held.entries[parent]?[NameKey(name)] != nil:
            try writeBulkCreates()
        default:
            break
        }
        return false
    }

    /// Writes what `holdCreated` held: inode rows, then entry rows, `bulkRowsPerStatement`
    /// a statement. A row held and then changed by the step (its node put again) is
    /// written as it is last.
    private func writeBulkCreates() throws(StoreError) {
        guard let held = bulkCreates, !held.order.isEmpty else { return }
        bulkCreates = BulkCreates()
        let row = "(" + Array(repeating: "?", count: Self.inodeColumns.split(separator: ",").count).joined(separator: ",") + ")"
        for start in stride(from: 0, to: held.order.count, by: Self.bulkRowsPerStatement) {
            let ids = held.order[start..<min(start + Self.bulkRowsPerStatement, held.order.count)]
            let values = ids.flatMap { Index.inodeValues(held.nodes[$0]!) }
            try db.query("INSERT INTO inodes(\(Self.inodeColumns)) VALUES " + Array(repeating: row, count: ids.count).joined(separator: ","), values)
            let names = ids.map { held.nodes[$0]!.link! }
            try db.query("INSERT INTO entries(parent, name, inode) VALUES " + Array(repeating: "(?,?,?)", count: names.count).joined(separator: ",")
                         + " ON CONFLICT(parent, name) DO UPDATE SET inode = excluded.inode",
                         zip(names, ids).flatMap { [SQLValue.inode($0.parent), .text($0.name), .inode($1)] })
        }
    }
}
