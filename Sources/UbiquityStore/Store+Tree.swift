/// The live tree: inodes and directory entries, in memory and in SQLite. Each mutation is
/// one transaction, so a crash leaves the tree as it was before or after it.
extension Store {
    func loadTree() throws(StoreError) {
        if try db.rows("SELECT count(*) FROM inodes WHERE id = 1", [], { $0.int(0) }).first == 0 && !readOnly {
            let now = clock()
            let root = Inode(id: Store.rootInode, kind: .directory, mode: 0o755, uid: getuid(), gid: getgid(), time: now)
            try persist(root, insert: true)
        }
        try db.query("SELECT id, kind, mode, uid, gid, size, atime, mtime, ctime, rdev, target, file_id, head, allocated FROM inodes") { (r) throws(StoreError) in
            guard let kind = NodeKind(rawValue: r.int(1)) else { throw .database("inode \(r.int(0)) has unknown kind \(r.int(1))") }
            var inode = Inode(id: InodeNumber(r.int(0)), kind: kind, mode: UInt32(r.int(2)), uid: UInt32(r.int(3)),
                              gid: UInt32(r.int(4)), size: Self.checkedSize(r.int(5)), time: 0, rdev: UInt64(bitPattern: r.int(9)),
                              target: r.isNull(10) ? nil : r.text(10), fileID: r.isNull(11) ? nil : r.text(11))
            inode.atime = r.int(6); inode.mtime = r.int(7); inode.ctime = r.int(8)
            inode.head = r.isNull(12) ? nil : r.int(12)
            // Stores before format 3 have no allocation: the size (no holes) is right for them.
            inode.allocated = r.isNull(13) ? inode.size : min(Self.checkedSize(r.int(13)), inode.size)
            inodes[inode.id] = inode
            nextInode = max(nextInode, inode.id + 1)
        }
        try db.query("SELECT parent, name, inode FROM entries") { (r) throws(StoreError) in
            let parent = InodeNumber(r.int(0)), name = r.text(1), id = InodeNumber(r.int(2))
            children[parent, default: [:]][NameKey(name)] = id
            links[id, default: []].append(EntryRef(parent: parent, name: name))
        }
        for (parent, names) in children {
            subdirectories[parent] = names.values.filter { inodes[$0]?.kind == .directory }.count
        }
        for id in Array(inodes.keys) { recountLinks(id) }
        // Inodes no entry names (unlinked while open when the last process stopped) are gone.
        if readOnly { return }
        for (id, inode) in inodes where id != Store.rootInode && inode.nlink == 0 {
            try db.query("DELETE FROM inodes WHERE id = ?", [.int(Int64(id))])
            try db.query("DELETE FROM xattrs WHERE inode = ?", [.int(Int64(id))])
            inodes[id] = nil
        }
    }

    /// Recomputes a link count. A directory's subdirectories are counted once at load and
    /// then kept in `subdirectories` (counting children per create made big directories
    /// quadratic).
    private func recountLinks(_ id: InodeNumber) {
        guard var inode = inodes[id] else { return }
        if inode.kind == .directory {
            // A removed directory has no links at all (so it can be forgotten).
            let named = id == Store.rootInode || !(links[id]?.isEmpty ?? true)
            inode.nlink = named ? UInt32(2 + (subdirectories[id] ?? 0)) : 0
        } else {
            inode.nlink = UInt32(links[id]?.count ?? 0)
        }
        inodes[id] = inode
    }

    public func inode(_ id: InodeNumber) -> Inode? { inodes[id] }

    /// The inode's (first) name.
    public func name(of id: InodeNumber) -> String? { links[id]?.first?.name }

    /// A directory's parent (directories have exactly one name).
    public func parentOfDirectory(_ id: InodeNumber) -> InodeNumber? { links[id]?.first?.parent }

    public var inodeNumbers: Dictionary<InodeNumber, Inode>.Keys { inodes.keys }

    public func child(_ parent: InodeNumber, _ name: String) -> InodeNumber? { children[parent]?[NameKey(name)] }

    /// Entries of a directory, sorted by name (a stable order for readdir offsets).
    public func entries(_ parent: InodeNumber) -> [(name: String, id: InodeNumber)] {
        (children[parent] ?? [:]).map { ($0.key.name, $0.value) }.sorted { $0.name.utf8.lexicographicallyPrecedes($1.name.utf8) }
    }

    public func isEmptyDirectory(_ id: InodeNumber) -> Bool { children[id]?.isEmpty ?? true }

    /// The inode's path from the root ("a/b/c"; "" for the root), through its first link.
    public func path(of id: InodeNumber) -> String? {
        var components: [String] = []
        var current = id
        while current != Store.rootInode {
            guard let link = links[current]?.first, components.count < 4096 else { return nil }
            components.append(link.name)
            current = link.parent
        }
        return components.reversed().joined(separator: "/")
    }

    /// Creates an inode and its entry `name` in `parent`.
    public func create(parent: InodeNumber, name: String, kind: NodeKind, mode: UInt32, uid: UInt32, gid: UInt32,
                       rdev: UInt64 = 0, target: String? = nil) throws(StoreError) -> Inode {
        let id = nextInode
        var inode = Inode(id: id, kind: kind, mode: mode, uid: uid, gid: gid,
                          size: Int64(target.map(NameCodec.byteCount) ?? 0), time: clock(), rdev: rdev, target: target,
                          fileID: kind == .file ? randomHex(bytes: 16) : nil)
        try db.transaction { () throws(StoreError) in
            try persist(inode, insert: true)
            try insertEntry(parent: parent, name: name, id: id)
            try touchDirectory(parent)
        }
        nextInode += 1
        inodes[id] = inode
        children[parent, default: [:]][NameKey(name)] = id
        links[id] = [EntryRef(parent: parent, name: name)]
        if kind == .directory { subdirectories[parent, default: 0] += 1 }
        recountLinks(id)
        recountLinks(parent)
        inode = inodes[id]!
        return inode
    }

    /// Adds a hard link.
    public func link(_ id: InodeNumber, parent: InodeNumber, name: String) throws(StoreError) {
        try db.transaction { () throws(StoreError) in
            try insertEntry(parent: parent, name: name, id: id)
            try touchDirectory(parent)
            inodes[id]!.ctime = clock()
            try persist(inodes[id]!)
        }
        children[parent, default: [:]][NameKey(name)] = id
        links[id, default: []].append(EntryRef(parent: parent, name: name))
        recountLinks(id)
    }

    /// Removes the entry; returns the inode it named, with its new link count. The inode
    /// row stays until `forget(_:)` (it may still be open).
    @discardableResult
    public func removeEntry(parent: InodeNumber, name: String) throws(StoreError) -> Inode? {
        guard let id = children[parent]?[NameKey(name)] else { return nil }
        noteVacated(id)
        try db.transaction { () throws(StoreError) in
            try db.query("DELETE FROM entries WHERE parent = ? AND name = ?", [.int(Int64(parent)), .text(name)])
            try touchDirectory(parent)
            inodes[id]!.ctime = clock()
            try persist(inodes[id]!)
        }
        children[parent]![NameKey(name)] = nil
        links[id]?.removeAll { $0 == EntryRef(parent: parent, name: name) }
        if inodes[id]?.kind == .directory { subdirectories[parent, default: 0] -= 1 }
        recountLinks(id)
        recountLinks(parent)
        return inodes[id]
    }

    /// Moves an entry. The caller has removed or exchanged any target first.
    public func moveEntry(from parent: InodeNumber, _ name: String, to newParent: InodeNumber, _ newName: String) throws(StoreError) {
        guard let id = children[parent]?[NameKey(name)] else { return }
        noteVacated(id)
        try db.transaction { () throws(StoreError) in
            try db.query("UPDATE entries SET parent = ?, name = ? WHERE parent = ? AND name = ?",
                         [.int(Int64(newParent)), .text(newName), .int(Int64(parent)), .text(name)])
            try touchDirectory(parent)
            if newParent != parent { try touchDirectory(newParent) }
            inodes[id]!.ctime = clock()
            try persist(inodes[id]!)
        }
        children[parent]![NameKey(name)] = nil
        children[newParent, default: [:]][NameKey(newName)] = id
        if inodes[id]?.kind == .directory {
            subdirectories[parent, default: 0] -= 1
            subdirectories[newParent, default: 0] += 1
        }
        if let i = links[id]?.firstIndex(of: EntryRef(parent: parent, name: name)) {
            links[id]![i] = EntryRef(parent: newParent, name: newName)
        }
        recountLinks(parent)
        recountLinks(newParent)
        markSubtreeChanged(id)
    }

    /// Everything below a moved directory has a new path: all of it is in the change set
    /// (the walk is as large as the move, not as the tree).
    private func markSubtreeChanged(_ id: InodeNumber) {
        var pending = [id]
        while let next = pending.popLast() {
            changed.insert(next)
            if inodes[next]?.kind == .directory, let names = children[next] { pending += names.values }
        }
    }

    /// Swaps what two entries name (RENAME_EXCHANGE).
    public func exchangeEntries(_ parentA: InodeNumber, _ nameA: String, _ parentB: InodeNumber, _ nameB: String) throws(StoreError) {
        guard let a = children[parentA]?[NameKey(nameA)], let b = children[parentB]?[NameKey(nameB)] else { return }
        noteVacated(a)
        noteVacated(b)
        try db.transaction { () throws(StoreError) in
            try db.query("UPDATE entries SET inode = ? WHERE parent = ? AND name = ?", [.int(Int64(b)), .int(Int64(parentA)), .text(nameA)])
            try db.query("UPDATE entries SET inode = ? WHERE parent = ? AND name = ?", [.int(Int64(a)), .int(Int64(parentB)), .text(nameB)])
            try touchDirectory(parentA)
            try touchDirectory(parentB)
        }
        children[parentA]![NameKey(nameA)] = b
        children[parentB]![NameKey(nameB)] = a
        let delta = (inodes[b]?.kind == .directory ? 1 : 0) - (inodes[a]?.kind == .directory ? 1 : 0)
        subdirectories[parentA, default: 0] += delta
        subdirectories[parentB, default: 0] -= delta
        let refA = EntryRef(parent: parentA, name: nameA), refB = EntryRef(parent: parentB, name: nameB)
        if let i = links[a]?.firstIndex(of: refA) { links[a]![i] = refB }
        if let i = links[b]?.firstIndex(of: refB) { links[b]![i] = refA }
        recountLinks(parentA)
        recountLinks(parentB)
        markSubtreeChanged(a)
        markSubtreeChanged(b)
    }

    /// Saves changed attributes.
    public func update(_ inode: Inode) throws(StoreError) {
        try persist(inode)
        let nlink = inodes[inode.id]?.nlink ?? 0
        inodes[inode.id] = inode
        inodes[inode.id]!.nlink = nlink
    }

    /// Drops an inode that no entry names and nothing has open.
    public func forget(_ id: InodeNumber) throws(StoreError) {
        guard let inode = inodes[id], inode.nlink == 0, id != Store.rootInode else { return }
        try db.transaction { () throws(StoreError) in
            try db.query("DELETE FROM inodes WHERE id = ?", [.int(Int64(id))])
            try db.query("DELETE FROM xattrs WHERE inode = ?", [.int(Int64(id))])
        }
        inodes[id] = nil
        links[id] = nil
        children[id] = nil
        subdirectories[id] = nil
    }

    private func noteVacated(_ id: InodeNumber) {
        if let path = path(of: id) { vacated.insert(NameKey(path)) }
    }

    private func insertEntry(parent: InodeNumber, name: String, id: InodeNumber) throws(StoreError) {
        changed.insert(id)
        try db.query("INSERT INTO entries(parent, name, inode) VALUES(?, ?, ?)", [.int(Int64(parent)), .text(name), .int(Int64(id))])
    }

    private func touchDirectory(_ id: InodeNumber) throws(StoreError) {
        let now = clock()
        inodes[id]?.mtime = now
        inodes[id]?.ctime = now
        if let dir = inodes[id] { try persist(dir) }
    }

    func persist(_ inode: Inode, insert: Bool = false) throws(StoreError) {
        changed.insert(inode.id)
        let values: [SQLValue] = [
            .int(Int64(inode.id)), .int(inode.kind.rawValue), .int(Int64(inode.mode)), .int(Int64(inode.uid)),
            .int(Int64(inode.gid)), .int(inode.size), .int(inode.atime), .int(inode.mtime), .int(inode.ctime),
            .int(Int64(bitPattern: inode.rdev)), inode.target.map { .text($0) } ?? .null,
            inode.fileID.map { .text($0) } ?? .null, inode.head.map { .int($0) } ?? .null, .int(inode.allocated),
        ]
        try db.query(insert
            ? "INSERT INTO inodes(id, kind, mode, uid, gid, size, atime, mtime, ctime, rdev, target, file_id, head, allocated) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
            : "REPLACE INTO inodes(id, kind, mode, uid, gid, size, atime, mtime, ctime, rdev, target, file_id, head, allocated) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            values)
    }

    /// A size read from the database, within 0...maxFileSize (a damaged row must not make
    /// later arithmetic overflow).
    static func checkedSize(_ value: Int64) -> Int64 { min(max(value, 0), maxFileSize) }
}

import Glibc
import UbiquitySystem
