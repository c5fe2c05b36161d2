/// The live tree: inodes and directory entries in SQLite, the changes not folded yet in
/// the overlay (Store+Overlay), the inodes of the working set also in a bounded cache
/// (`InodeCache`). Each inode row carries its link count and its primary name (`parent`,
/// `name`: the link its path goes through), so resolving an inode or its path costs a
/// few indexed reads and nothing is loaded at open. Reads look at the overlay first and
/// go to SQLite around the gate for what it does not hold. Each mutation is one log frame
/// (or, inside a transaction, part of it), so a crash leaves the tree as it was before or
/// after it.
extension Store {
    static let inodeColumns = "id, kind, mode, uid, gid, size, atime, mtime, ctime, rdev, target, file_id, head, allocated, nlink, parent, name, absent, keep"

    /// At open, after the operation log's replay: reads SQLite around the gate and the
    /// overlay on top, so that a replay is not folded here.
    func loadTree() throws(StoreError) {
        let (hasRoot, highest, unnamed) = try db.aroundGate { () throws(StoreError) in
            (try !db.rows("SELECT 1 FROM inodes WHERE id = 1", [], { _ in true }).isEmpty,
             try db.rows("SELECT max(id) FROM inodes", []) { $0.int(0) }.first ?? 1,
             readOnly ? [] : try db.rows("SELECT id FROM inodes WHERE nlink = 0 AND id != 1", [], { $0.inode(0) }))
        }
        if !hasRoot && overlay.inode(Store.rootInode) == nil && !readOnly {
            var root = Inode(id: Store.rootInode, kind: .directory, mode: 0o755, uid: getuid(), gid: getgid(), time: clock())
            root.nlink = 2
            try persist(TreeNode(inode: root, link: nil))
        }
        nextInode = InodeNumber(rawValue: max(UInt64(max(highest, 1)), overlay.highestInode)).advanced(by: 1)
        // Inodes no entry names (unlinked while open when the last process stopped) are
        // gone: SQLite's unless the overlay has a newer row, and the overlay's own.
        if readOnly { return }
        var gone = unnamed.filter { overlay.inode($0) == nil }
        for case (let id, let node?) in overlay.inodes where node.inode.nlink == 0 && id != Store.rootInode { gone.append(id) }
        try dropAtOpen(Set(gone))
    }

    /// The inode and its primary name, from the cache or SQLite.
    func node(_ id: InodeNumber) throws(StoreError) -> TreeNode? {
        if let shadow = overlay.inode(id) { return shadow }
        if let held = bulkCreates?.nodes[id] { return held }
        if let hit = tree.withLock({ $0.inodes.get(id) }) { return hit }
        guard id.fitsColumn,
              let read = try db.aroundGate({ () throws(StoreError) in
                  try db.rows("SELECT \(Self.qualifiedInodeColumns), \(Self.headColumns) FROM inodes i \(Self.headJoin) WHERE i.id = ?",
                              [.inode(id)]) { r in (node: Self.treeNode(r), with: Self.readWithInode(r, from: 19)) }
              }).first
        else { return nil }
        let checked = try read.node.get()
        keepRead([(checked, read.with)])
        return checked
    }

    /// What an inode's read takes with it (`headJoin`): its head version's id and whether
    /// it is local-only, which a save of the file (its parent) and a delete (its tombstone)
    /// ask, and whether it has xattrs in SQLite, which a save's record carries; kept with
    /// the inode in the working set (`keepRead`).
    static let headColumns = "v.id, v.local, EXISTS(SELECT 1 FROM xattrs x WHERE x.inode = i.id)"
    static let headJoin = "LEFT JOIN versions v ON v.row = i.head"

    /// What `headColumns` read from column `first` on.
    struct ReadWithInode {
        var head: (id: VersionID, isLocal: Bool)?
        var hasXattrs: Bool
    }

    static func readWithInode(_ r: SQLRow, from first: Int32) -> ReadWithInode {
        ReadWithInode(head: r.isNull(first) ? nil : (id: r.versionID(first), isLocal: r.int(first + 1) != 0),
                      hasXattrs: r.int(first + 2) != 0)
    }

    /// Puts inodes read from SQLite into the working set with what their reads took: an
    /// inode without xattrs there is known to have the overlay's alone.
    func keepRead(_ read: [(TreeNode, ReadWithInode)]) {
        let xattrs = read.map { node, with -> [String: [UInt8]]? in
            guard !with.hasXattrs else { return nil }
            var all: [String: [UInt8]] = [:]
            for (name, value) in overlay.xattrs(of: node.inode.id).changed { all[name] = value }
            return all
        }
        tree.withLock { t in
            for ((node, with), xattrs) in zip(read, xattrs) { t.inodes.put(node, head: with.head, xattrs: xattrs) }
        }
    }

    static func treeNode(_ r: SQLRow) -> Result<TreeNode, StoreError> {
        guard let kind = NodeKind(rawValue: r.int(1)) else { return .failure(.database("inode \(r.int(0)) has unknown kind \(r.int(1))")) }
        var inode = Inode(id: r.inode(0), kind: kind, mode: UInt32(truncatingIfNeeded: r.int(2)),
                          uid: UInt32(truncatingIfNeeded: r.int(3)), gid: UInt32(truncatingIfNeeded: r.int(4)),
                          size: checkedSize(r.int(5)), time: 0, rdev: UInt64(bitPattern: r.int(9)),
                          target: r.isNull(10) ? nil : r.text(10), fileID: r.optionalFileID(11))
        inode.atime = r.int(6); inode.mtime = r.int(7); inode.ctime = r.int(8)
        inode.head = r.isNull(12) ? nil : r.int(12)
        // Stores before format 3 have no allocation: the size (no holes) is right for them.
        inode.allocated = r.isNull(13) ? inode.size : checkedSize(r.int(13))
        inode.nlink = UInt32(clamping: max(r.int(14), 0))
        inode.absent = min(checkedSize(r.int(17)), inode.allocated)
        inode.keep = KeepPolicy(rawValue: r.int(18)) ?? .automatic
        let link = r.isNull(15) ? nil : EntryRef(parent: r.inode(15), name: r.text(16))
        return .success(TreeNode(inode: inode, link: link))
    }

    /// A read the filesystem cannot act on a failure of (getattr, lookup): a failing database
    /// is logged and the node reported missing.
    func logged<T>(_ what: @autoclosure () -> String, _ body: () throws(StoreError) -> T?) -> T? {
        do { return try body() } catch {
            log("ubiquity: \(what()): \(error)")
            return nil
        }
    }

    public func inode(_ id: InodeNumber) -> Inode? { logged("read inode \(id)") { () throws(StoreError) in try lookUp(id) } }

    /// The inode's primary name.
    public func name(of id: InodeNumber) -> String? { logged("read inode \(id)") { () throws(StoreError) in try node(id)?.link?.name } }

    /// A directory's parent (directories have exactly one name).
    public func parentOfDirectory(_ id: InodeNumber) -> InodeNumber? {
        logged("read inode \(id)") { () throws(StoreError) in try node(id)?.link?.parent }
    }

    /// Inodes in the store (statfs); counted once, then kept by create and forget.
    public var inodeCount: Int {
        if let total = tree.inodeTotal { return total }
        let total = logged("count inodes") { () throws(StoreError) in try db.rows("SELECT count(*) FROM inodes", []) { Int($0.int(0)) }.first } ?? 0
        tree.withLock { $0.inodeTotal = total }
        return total
    }

    public func child(_ parent: InodeNumber, _ name: String) -> InodeNumber? { child(parent, name, loading: true) }

    /// - Parameter loading: load the directory's names for the lookups to come (a
    ///   request's); not for sync, which looks up one path of a directory at a time.
    func child(_ parent: InodeNumber, _ name: String, loading: Bool) -> InodeNumber? {
        logged("look up \(name) in \(parent)") { () throws(StoreError) in try childID(parent, name, loading: loading) }
    }

    /// The entries among `names` in directory `parent`, by name (reconcile looks up a
    /// slice's paths together); by bytes, as names are.
    func children(_ parent: InodeNumber, named names: [String]) throws(StoreError) -> [NameKey: InodeNumber] {
        let found = try db.rows(in: names, before: [.inode(parent)], { "SELECT name, inode FROM entries WHERE parent = ? AND name IN (\($0))" }) {
            (name: NameKey($0.text(0)), id: $0.inode(1))
        }
        return Dictionary(found.map { ($0.name, $0.id) }, uniquingKeysWith: { first, _ in first })
    }

    func childID(_ parent: InodeNumber, _ name: String, loading: Bool = false) throws(StoreError) -> InodeNumber? {
        let key = NameKey(name)
        if let shadow = overlay.entry(parent, key) { return shadow }
        if let held = bulkCreates?.entries[parent]?[key] { return held }
        if let loaded = try loadedEntry(parent, key, loading: loading) { return loaded }
        return try db.aroundGate { () throws(StoreError) in
            try db.rows("SELECT inode FROM entries WHERE parent = ? AND name = ?", [.inode(parent), .text(name)]) {
                $0.inode(0)
            }.first
        }
    }

    /// Entries of a directory, sorted by name bytes (a stable order for readdir offsets;
    /// SQLite compares text with memcmp).
    public func entries(_ parent: InodeNumber) -> [(name: String, id: InodeNumber)] {
        logged("list \(parent)") { () throws(StoreError) in
            let rows = try db.aroundGate { () throws(StoreError) in
                try db.rows("SELECT name, inode FROM entries WHERE parent = ? ORDER BY name", [.inode(parent)]) {
                    (name: $0.text(0), id: $0.inode(1))
                }
            }
            return try withOverlay(parent, rows, name: \.name) { (name: $0, id: $1) }
        } ?? []
    }

    /// A directory's rows from SQLite with the overlay's changes to it: its removed and
    /// replaced names out, its added ones in, by name bytes again.
    private func withOverlay<Row>(_ parent: InodeNumber, _ rows: [Row], name: (Row) -> String,
                                  _ make: (String, InodeNumber) throws(StoreError) -> Row?) throws(StoreError) -> [Row] {
        let added = overlay.addedEntries(parent), removed = overlay.removedNames(parent)
        guard !added.isEmpty || !removed.isEmpty else { return rows }
        var merged = rows.filter { row in
            let key = NameKey(name(row))
            return !removed.contains(key) && added[key] == nil
        }
        for (key, id) in added { if let row = try make(key.name, id) { merged.append(row) } }
        merged.sort { name($0).utf8.lexicographicallyPrecedes(name($1).utf8) }
        return merged
    }

    /// The entry from the directory's names in memory, loading them first if `loading`
    /// (nil: not loaded, or too big to load: the caller asks SQLite for the one name).
    private func loadedEntry(_ parent: InodeNumber, _ name: NameKey, loading: Bool) throws(StoreError) -> InodeNumber?? {
        if let known = tree.withLock({ $0.directories.lookUp(parent, name) }) { return known }
        guard loading, !readOnly, !tree.withLock({ $0.directories.isTooBig(parent) }) else { return nil }
        try loadDirectory(parent)
        return tree.withLock { $0.directories.lookUp(parent, name) }
    }

    /// Reads a directory's names (and, for a small one, its inodes into the inode cache,
    /// each with its head version's id and whether it is local-only: what a save or a
    /// delete of the file asks) with one query, around the gate; the overlay's changes to
    /// it go on top.
    private func loadDirectory(_ parent: InodeNumber) throws(StoreError) {
        let (limit, inodeCapacity) = tree.withLock { ($0.directories.largestLoaded + 1, $0.inodes.capacity) }
        let rows = try db.aroundGate { () throws(StoreError) in
            try db.rows("""
                SELECT \(Self.qualifiedInodeColumns), e.name, \(Self.headColumns) FROM entries e LEFT JOIN inodes i ON i.id = e.inode
                \(Self.headJoin) WHERE e.parent = ? LIMIT ?
                """, [.inode(parent), .int(Int64(limit))]) { r in
                (name: NameKey(r.text(19)), node: r.isNull(0) ? nil : Self.treeNode(r), with: Self.readWithInode(r, from: 20))
            }
        }
        guard rows.count < limit else { return tree.withLock { $0.directories.tooBigToLoad(parent) } }
        var names = DirectoryCache.Names(minimumCapacity: rows.count)
        for row in rows {
            // A damaged row, or an entry without its inode: the directory is not held, so
            // each name is looked up (and its damage reported) by itself.
            guard case .success(let node)? = row.node else { return }
            names[row.name] = node.inode.id
        }
        // Each inode as SQLite has it, unless the overlay holds it (the cache never holds
        // anything older than the overlay); only a small directory's, so one listing
        // does not push the working set out.
        var nodes: [(TreeNode, ReadWithInode)] = []
        if rows.count <= inodeCapacity / 8 {
            for row in rows {
                if case .success(let node) = row.node, overlay.inode(node.inode.id) == nil { nodes.append((node, row.with)) }
            }
        }
        for name in overlay.removedNames(parent) { names[name] = nil }
        for (name, id) in overlay.addedEntries(parent) { names[name] = id }
        keepRead(nodes)
        tree.withLock { $0.directories.load(parent, names) }
    }

    /// The inode entry `name` of `parent` names (a lookup): one query for both.
    public func childInode(_ parent: InodeNumber, _ name: String) -> Inode? {
        logged("look up \(name) in \(parent)") { () throws(StoreError) -> Inode? in try lookUp(parent, name) }
    }

    /// `childInode` and `inode` with a failing database thrown, not taken for "none": a
    /// lookup tells the kernel that a name is absent (which it then remembers) only when
    /// that is known.
    public func lookUp(_ parent: InodeNumber, _ name: String) throws(StoreError) -> Inode? {
        let key = NameKey(name)
        var known = overlay.entry(parent, key)
        if known == nil { known = try loadedEntry(parent, key, loading: true) }
        if let known {
            guard let id = known else { return nil }
            return try node(id)?.inode
        }
        guard let row = try db.aroundGate({ () throws(StoreError) in
            try db.rows("""
                SELECT \(Self.qualifiedInodeColumns), \(Self.headColumns) FROM entries e JOIN inodes i ON i.id = e.inode
                \(Self.headJoin) WHERE e.parent = ? AND e.name = ?
                """, [.inode(parent), .text(name)]) { r in (node: Self.treeNode(r), with: Self.readWithInode(r, from: 19)) }
        }).first else { return nil }
        let checked = try row.node.get()
        if let shadow = overlay.inode(checked.inode.id) { return shadow?.inode }
        keepRead([(checked, row.with)]) // never anything SQLite and the overlay do not hold
        return checked.inode
    }

    public func lookUp(_ id: InodeNumber) throws(StoreError) -> Inode? { try node(id)?.inode }

    static let qualifiedInodeColumns = inodeColumns.split(separator: ",").map { "i." + $0.filter { $0 != " " } }.joined(separator: ", ")
    /// The inode's columns, then the entry's name (column 19: `entriesWithInodes`).
    static let listingColumns = inodeColumns.split(separator: ",").map { column -> String in
        let name = String(column.filter { $0 != " " })
        return name == "target" || name == "file_id" ? "NULL" : "i." + name
    }.joined(separator: ", ")

    /// `primaryName` is the inode's own primary name (TinyPix is decided by it). The inodes
    /// are for attributes only: without symlink target and history id (a listing of a
    /// big directory makes no strings it does not need), and never cached.
    public func entriesWithInodes(_ parent: InodeNumber) -> [(name: String, inode: Inode, primaryName: String?)] {
        logged("list \(parent)") { () throws(StoreError) in
            let rows = try db.aroundGate { () throws(StoreError) in
                try db.rows("""
                    SELECT \(Self.listingColumns), e.name FROM entries e JOIN inodes i ON i.id = e.inode
                    WHERE e.parent = ? ORDER BY e.name
                    """, [.inode(parent)]) { r in (r.text(19), Self.treeNode(r)) }
            }
            .compactMap { (name, node) -> (name: String, inode: Inode, primaryName: String?)? in
                switch node {
                case .success(let n):
                    // An inode the overlay changed is listed as it is now.
                    if let shadow = overlay.inode(n.inode.id) {
                        return shadow.map { (name: name, inode: $0.inode, primaryName: $0.link?.name) }
                    }
                    return (name: name, inode: n.inode, primaryName: n.link?.name)
                case .failure(let error):
                    log("ubiquity: list \(parent): entry \(name) left out: \(error)") // a damaged row, not a crash
                    return nil
                }
            }
            return try withOverlay(parent, rows, name: \.name) { (name, id) throws(StoreError) in
                try node(id).map { (name: name, inode: $0.inode, primaryName: $0.link?.name) }
            }
        } ?? []
    }

    public func isEmptyDirectory(_ id: InodeNumber) -> Bool {
        logged("list \(id)") { () throws(StoreError) in
            if let count = tree.withLock({ $0.directories.count(id) }) { return count == 0 }
            guard overlay.addedEntries(id).isEmpty else { return false }
            let removed = overlay.removedNames(id)
            let names = try db.aroundGate { () throws(StoreError) in
                try db.rows("SELECT name FROM entries WHERE parent = ? LIMIT ?", [.inode(id), .int(Int64(removed.count + 1))]) { $0.text(0) }
            }
            return names.allSatisfy { removed.contains(NameKey($0)) }
        } ?? false
    }

    /// The inode's path from the root ("a/b/c"; "" for the root), through primary names.
    public func path(of id: InodeNumber) -> String? {
        logged("read the path of inode \(id)") { () throws(StoreError) in try treePath(of: id) }
    }

    /// `path(of:)` with a failed read thrown, for sync, which decides from the answer: a
    /// read that failed must not pass for an inode with no path.
    func treePath(of id: InodeNumber) throws(StoreError) -> String? {
        // Asked several times in a file's life (open, save, unlink): the names are gathered
        // once and copied into a string of the right size, not joined piece by piece.
        var components: [String] = []
        components.reserveCapacity(8)
        var bytes = 0
        var current = id
        while current != Store.rootInode {
            guard let link = try node(current)?.link, components.count < 4096 else { return nil }
            components.append(link.name)
            bytes += link.name.utf8.count + 1
            current = link.parent
        }
        guard bytes > 0 else { return "" }
        return String(unsafeUninitializedCapacity: bytes - 1) { out in
            var at = 0
            for (i, var name) in components.reversed().enumerated() {
                if i > 0 { out[at] = UInt8(ascii: "/"); at += 1 }
                at = name.withUTF8 { UnsafeMutableBufferPointer(rebasing: out[at...]).initialize(fromContentsOf: $0) + at }
            }
            return at
        }
    }

    /// Runs a tree mutation as one transaction; if it fails, the cache (which may hold
    /// what the rollback undid) starts over from SQLite.
    func treeTransaction<T>(_ body: () throws(StoreError) -> T) throws(StoreError) -> T {
        do {
            return try db.transaction(body)
        } catch {
            forgetCachedTree()
            throw error
        }
    }

    /// After a rollback: what memory kept of the tree (inodes, the count) may hold what
    /// was undone, so it is read again from SQLite and the overlay.
    func forgetCachedTree() {
        tree.withLock { t in
            t.inodes.removeAll()
            t.directories.removeAll()
            t.inodeTotal = nil
        }
        reserves = nil
        historyNames.removeAll()
        storedHistories.removeAll()
    }

    /// Loads, changes and saves one inode.
    private func modify(_ id: InodeNumber, _ body: (inout TreeNode) -> Void) throws(StoreError) {
        guard var node = try node(id) else { return }
        body(&node)
        try persist(node)
    }

    /// Creates an inode and its entry `name` in `parent`.
    /// `prepare` sets attributes before the row is written (reconcile shows a record's
    /// version this way: one write); `touchingParent: false` leaves the parent's times and
    /// link count to the caller (`touchDirectory`, once for many entries).
    public func create(parent: InodeNumber, name: String, kind: NodeKind, mode: UInt32, uid: UInt32, gid: UInt32,
                       rdev: UInt64 = 0, target: String? = nil, fileID: FileID? = nil, touchingParent: Bool = true,
                       prepare: (inout Inode) -> Void = { _ in }) throws(StoreError) -> Inode {
        let id = nextInode
        var inode = Inode(id: id, kind: kind, mode: mode, uid: uid, gid: gid,
                          size: Int64(target.map(NameCodec.byteCount) ?? 0), time: clock(), rdev: rdev, target: target,
                          fileID: kind == .file ? fileID ?? .new() : nil)
        inode.nlink = kind == .directory ? 2 : 1
        prepare(&inode)
        let node = TreeNode(inode: inode, link: EntryRef(parent: parent, name: name))
        if bulkCreates != nil && !touchingParent && !tracksChanges {
            holdCreated(node) // reconcile's: written as a set (Store+BulkCreate)
        } else {
            try treeChange { () throws(StoreError) in
                try persist(node)
                try insertEntry(parent: parent, name: name, id: id)
                if touchingParent { try touchDirectory(parent, subdirectories: kind == .directory ? 1 : 0) }
            }
        }
        nextInode = nextInode.advanced(by: 1)
        if overlayOn { overlay.noteFresh(id, history: fileID == nil ? inode.fileID : nil) }
        tree.withLock { t in
            t.inodeTotal = t.inodeTotal.map { $0 + 1 }
            if kind == .directory { t.directories.load(id, [:]) } // new, so known empty: no query at its first lookup
            t.inodes.knowXattrs(id, [:])
        }
        return inode
    }

    /// Adds a hard link.
    public func link(_ id: InodeNumber, parent: InodeNumber, name: String) throws(StoreError) {
        let now = clock()
        try treeChange { () throws(StoreError) in
            try insertEntry(parent: parent, name: name, id: id)
            try touchDirectory(parent)
            try modify(id) { node in
                node.inode.ctime = now
                node.inode.nlink += 1
                if node.link == nil { node.link = EntryRef(parent: parent, name: name) }
            }
        }
    }

    /// Removes the entry; returns the inode it named, with its new link count. The inode
    /// row stays until `forget(_:)` (it may still be open). `id`: the inode the entry names,
    /// when the caller has just looked it up (nil: looked up here).
    @discardableResult
    public func removeEntry(parent: InodeNumber, name: String, id known: InodeNumber? = nil) throws(StoreError) -> Inode? {
        let named: InodeNumber?
        if let known { named = known } else { named = try childID(parent, name) }
        guard let id = named, let node = try node(id) else { return nil }
        try noteVacated(id)
        let isDirectory = node.inode.kind == .directory
        let gone = EntryRef(parent: parent, name: name)
        let now = clock()
        // The primary name goes: another name, if any, becomes it (a directory has one
        // name, and so has a file of one link).
        let next = node.link != gone ? node.link
            : isDirectory || node.inode.nlink <= 1 ? nil : try nextLink(id, besides: gone)
        try treeChange { () throws(StoreError) in
            try record(.removeEntry(parent: parent, name: name))
            try touchDirectory(parent, subdirectories: isDirectory ? -1 : 0)
            try modify(id) { node in
                node.inode.ctime = now
                // A removed directory has no links at all (so it can be forgotten).
                node.inode.nlink = isDirectory ? 0 : max(node.inode.nlink, 1) - 1
                node.link = next
            }
        }
        return try self.node(id)?.inode
    }

    /// The name that becomes a file's primary one when `gone`, its primary, is removed:
    /// one on the same side of the local-only edge as `gone` when there is one, so that an
    /// unlink does not take a file that keeps a synced name out of sync (or one that keeps
    /// a local-only name into it); else the first.
    private func nextLink(_ id: InodeNumber, besides gone: EntryRef) throws(StoreError) -> EntryRef? {
        let links = try db.rows("SELECT parent, name FROM entries WHERE inode = ? ORDER BY parent, name LIMIT ?",
                                [.inode(id), .int(Self.linksLookedAt)]) {
            EntryRef(parent: $0.inode(0), name: $0.text(1))
        }.filter { $0 != gone }
        func isLocal(_ link: EntryRef) -> Bool? {
            guard let parentPath = path(of: link.parent) else { return nil }
            return LocalOnly.contains(parentPath.isEmpty ? link.name : parentPath + "/" + link.name)
        }
        guard links.count > 1, let goneIsLocal = isLocal(gone) else { return links.first }
        return links.first { isLocal($0) == goneIsLocal } ?? links.first
    }

    /// Of a file's names, those `nextLink` looks at (a file of more hard links takes the
    /// first of these on its side).
    static let linksLookedAt: Int64 = 64

    /// Moves an entry. The caller has removed or exchanged any target first.
    public func moveEntry(from parent: InodeNumber, _ name: String, to newParent: InodeNumber, _ newName: String) throws(StoreError) {
        guard let id = try childID(parent, name), let node = try node(id) else { return }
        let oldPath = try noteVacated(id)
        let moved = node.inode.kind == .directory && newParent != parent ? 1 : 0
        let old = EntryRef(parent: parent, name: name), new = EntryRef(parent: newParent, name: newName)
        let now = clock()
        try treeChange { () throws(StoreError) in
            try record(.removeEntry(parent: parent, name: name))
            try record(.putEntry(parent: newParent, name: newName, inode: id))
            try touchDirectory(parent, subdirectories: -moved)
            if newParent != parent { try touchDirectory(newParent, subdirectories: moved) }
            try modify(id) { node in
                node.inode.ctime = now
                if node.link == old { node.link = new }
            }
        }
        try noteMoved(id, node, from: oldPath)
    }

    /// A moved node has a new path, and so has everything below a moved directory: the
    /// directory goes into `moved`, and its subtree into the change set in the background
    /// (`settleMoves`), so a rename costs the same whatever it moves.
    private func noteMoved(_ id: InodeNumber, _ node: TreeNode, from oldPath: String?) throws(StoreError) {
        try changed.insert(id)
        guard node.inode.kind == .directory else { return }
        try moved.insert(id)
        if let oldPath, let newPath = try treePath(of: id) { try placeUnfoldedSaves(movedFrom: oldPath, to: newPath) }
    }

    /// Swaps what two entries name (RENAME_EXCHANGE).
    public func exchangeEntries(_ parentA: InodeNumber, _ nameA: String, _ parentB: InodeNumber, _ nameB: String) throws(StoreError) {
        guard let a = try childID(parentA, nameA), let b = try childID(parentB, nameB),
              let nodeA = try node(a), let nodeB = try node(b) else { return }
        let pathA = try noteVacated(a)
        let pathB = try noteVacated(b)
        let refA = EntryRef(parent: parentA, name: nameA), refB = EntryRef(parent: parentB, name: nameB)
        let delta = (nodeB.inode.kind == .directory ? 1 : 0) - (nodeA.inode.kind == .directory ? 1 : 0)
        let now = clock()
        try treeChange { () throws(StoreError) in
            try record(.putEntry(parent: parentA, name: nameA, inode: b))
            try record(.putEntry(parent: parentB, name: nameB, inode: a))
            try touchDirectory(parentA, subdirectories: delta)
            try touchDirectory(parentB, subdirectories: -delta)
            // Both swapped nodes changed status, as a renamed one does (ext4 stamps both).
            try modify(a) { $0.inode.ctime = now; if $0.link == refA { $0.link = refB } }
            try modify(b) { $0.inode.ctime = now; if $0.link == refB { $0.link = refA } }
        }
        try noteMoved(a, nodeA, from: pathA)
        try noteMoved(b, nodeB, from: pathB)
    }

    /// Saves changed attributes (the link count and names stay the tree's).
    public func update(_ inode: Inode) throws(StoreError) {
        try treeChange { () throws(StoreError) in
            try modify(inode.id) { node in
                let nlink = node.inode.nlink
                node.inode = inode
                node.inode.nlink = nlink
            }
        }
    }

    /// Drops an inode that no entry names and nothing has open.
    public func forget(_ id: InodeNumber) throws(StoreError) {
        guard let node = try node(id), node.inode.nlink == 0, id != Store.rootInode else { return }
        try treeChange { () throws(StoreError) in try record(.dropInode(id)) }
        tree.withLock { $0.inodeTotal = $0.inodeTotal.map { $0 - 1 } }
    }

    /// Notes the path `id` leaves, and returns it.
    @discardableResult
    private func noteVacated(_ id: InodeNumber) throws(StoreError) -> String? {
        guard let path = try treePath(of: id) else { return nil }
        try vacated.insert(NameKey(path))
        return path
    }

    private func insertEntry(parent: InodeNumber, name: String, id: InodeNumber) throws(StoreError) {
        if tracksChanges { try changed.insert(id) }
        try record(.putEntry(parent: parent, name: name, inode: id))
    }

    /// A directory's entries changed: new mtime and ctime; `subdirectories` more (or fewer)
    /// of them are directories (its link count is 2 + its subdirectories).
    func touchDirectory(_ id: InodeNumber, subdirectories: Int = 0) throws(StoreError) {
        let now = clock()
        try modify(id) { node in
            node.inode.mtime = now
            node.inode.ctime = now
            // A removed directory (no links) gets none back.
            if node.inode.nlink > 0 { node.inode.nlink = UInt32(max(2, Int(node.inode.nlink) + subdirectories)) }
        }
    }

    /// Saves an inode's attributes; its link count and names stay the tree's.
    func save(_ inode: Inode) throws(StoreError) { try update(inode) }

    func persist(_ node: TreeNode) throws(StoreError) {
        if tracksChanges { try changed.insert(node.inode.id) }
        try record(.putInode(node))
    }

    static let insertInode = "INSERT INTO inodes(\(inodeColumns)) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
    /// An update in place, not REPLACE: a REPLACE deletes the row first, which would reset
    /// the columns it does not name (`used`) and skip the delete trigger of the content
    /// totals (SQLite fires it for REPLACE only with recursive triggers on).
    static let upsertInode = insertInode + " ON CONFLICT(id) DO UPDATE SET "
        + inodeColumns.split(separator: ", ").dropFirst()
            .map { "\($0) = excluded.\($0)" }.joined(separator: ", ")

    /// Format 4 upgrade: every inode's link count and primary name, from its entries (the
    /// first by (parent, name), the order in which older stores loaded them).
    static func computeLinks(_ db: SQLiteDatabase) throws(StoreError) {
        try db.execute("""
            UPDATE inodes SET
              parent = (SELECT parent FROM entries WHERE inode = inodes.id ORDER BY parent, name LIMIT 1),
              name = (SELECT name FROM entries WHERE inode = inodes.id ORDER BY parent, name LIMIT 1),
              nlink = CASE
                WHEN kind != 2 THEN (SELECT count(*) FROM entries WHERE inode = inodes.id)
                WHEN id = 1 OR EXISTS (SELECT 1 FROM entries WHERE inode = inodes.id) THEN 2 + (
                  SELECT count(*) FROM entries e JOIN inodes c ON c.id = e.inode WHERE e.parent = inodes.id AND c.kind = 2)
                ELSE 0 END
            """)
    }

    /// A size read from the database, within 0...maxFileSize (a damaged row must not make
    /// later arithmetic overflow).
    static func checkedSize(_ value: Int64) -> Int64 { min(max(value, 0), maxFileSize) }
}

import Glibc
import UbiquitySystem
