/// The namespace in memory (the namespace engine's memtable, not yet serving requests): nodes,
/// directory entries and extended attributes, changed only by `apply`. `apply` checks an
/// operation against the state first and changes nothing when it is refused, so the same
/// code makes the request path's POSIX checks and replays the operation log (where a
/// refusal means the log does not fit the state: damage).
///
/// Link counts are ext4's: a file's is its number of names; a directory's is 2 plus its
/// subdirectories. A node goes with its last name; keeping it while it is open is the
/// filesystem layer's business.
public struct Namespace: Equatable, Sendable {
    public private(set) var nodes: [InodeNumber: Inode] = [:]
    /// Each directory's names.
    public private(set) var entries: [InodeNumber: [String: InodeNumber]] = [:]
    /// Each directory's parent (a directory has one name); the root is its own parent.
    public private(set) var parents: [InodeNumber: InodeNumber] = [:]
    public private(set) var xattrs: [InodeNumber: [String: [UInt8]]] = [:]

    public enum Refusal: Error, Equatable, Sendable {
        case notFound, exists, notDirectory, isDirectory, notEmpty, notPermitted, invalid, noAttribute
    }

    public init(root: Inode) {
        var root = root
        root.kind = .directory
        root.nlink = 2
        nodes[root.id] = root
        entries[root.id] = [:]
        parents[root.id] = root.id
    }

    public func lookup(_ parent: InodeNumber, _ name: String) -> InodeNumber? { entries[parent]?[name] }

    public mutating func apply(_ op: NamespaceOperation) throws(Refusal) {
        switch op {
        case .create(let n):
            try checkName(n.name)
            guard nodes[n.inode] == nil else { throw .exists }
            try checkFree(n.parent, n.name)
            var node = Inode(id: n.inode, kind: n.kind, mode: n.mode & 0o7777, uid: n.uid, gid: n.gid,
                             size: Int64(n.target?.utf8.count ?? 0), time: n.time, rdev: n.rdev, target: n.kind == .symlink ? n.target : nil)
            node.allocated = 0
            if n.kind == .directory {
                node.nlink = 2
                entries[n.inode] = [:]
                parents[n.inode] = n.parent
                nodes[n.parent]!.nlink += 1
            } else {
                node.nlink = 1
            }
            nodes[n.inode] = node
            entries[n.parent]![n.name] = n.inode
            touchDirectory(n.parent, n.time)
        case .link(let inode, let parent, let name, let time):
            try checkName(name)
            // In link(2)'s order: the source, then the new name, then the source's kind.
            guard let node = nodes[inode] else { throw .notFound }
            try checkFree(parent, name)
            guard node.kind != .directory else { throw .notPermitted }
            entries[parent]![name] = inode
            nodes[inode]!.nlink += 1
            nodes[inode]!.ctime = time
            touchDirectory(parent, time)
        case .unlink(let parent, let name, let time):
            guard let inode = lookup(parent, name) else { throw .notFound }
            if nodes[inode]!.kind == .directory, !(entries[inode]?.isEmpty ?? true) { throw .notEmpty }
            removeName(parent, name, time)
            touchDirectory(parent, time)
        case .rename(let from, let fromName, let to, let toName, let exchange, let time):
            try rename(from, fromName, to, toName, exchange: exchange, time: time)
        case .setAttributes(let inode, let c):
            guard var node = nodes[inode] else { throw .notFound }
            if let size = c.size {
                guard node.kind == .file else { throw node.kind == .directory ? .isDirectory : .invalid }
                guard size >= 0 else { throw .invalid }
                node.size = size
            }
            if let mode = c.mode { node.mode = mode & 0o7777 }
            if let uid = c.uid { node.uid = uid }
            if let gid = c.gid { node.gid = gid }
            if let atime = c.atime { node.atime = atime }
            if let mtime = c.mtime { node.mtime = mtime }
            node.ctime = c.ctime
            nodes[inode] = node
        case .setXattr(let inode, let name, let value, let time):
            guard nodes[inode] != nil else { throw .notFound }
            guard !name.isEmpty else { throw .invalid }
            xattrs[inode, default: [:]][name] = value
            nodes[inode]!.ctime = time
        case .removeXattr(let inode, let name, let time):
            guard nodes[inode] != nil else { throw .notFound }
            guard xattrs[inode]?[name] != nil else { throw .noAttribute }
            xattrs[inode]![name] = nil
            if xattrs[inode]!.isEmpty { xattrs[inode] = nil }
            nodes[inode]!.ctime = time
        }
    }

    // MARK: rename

    private mutating func rename(_ from: InodeNumber, _ fromName: String, _ to: InodeNumber, _ toName: String,
                                 exchange: Bool, time: Nanos) throws(Refusal) {
        try checkName(toName)
        guard let source = lookup(from, fromName) else { throw .notFound }
        guard let toDirectory = nodes[to] else { throw .notFound }
        guard toDirectory.kind == .directory else { throw .notDirectory }
        let target = lookup(to, toName)
        if exchange && target == nil { throw .notFound }
        let sourceIsDirectory = nodes[source]!.kind == .directory
        // In rename(2)'s order, after both lookups: a directory cannot go below itself
        // (EINVAL); a target that is an ancestor of the source is ENOTEMPTY (EINVAL for
        // an exchange, where it would go below itself).
        if sourceIsDirectory, isSelfOrBelow(to, source) { throw .invalid }
        if let target, nodes[target]!.kind == .directory, isSelfOrBelow(from, target) { throw exchange ? .invalid : .notEmpty }
        if exchange, let target {
            if from == to && fromName == toName { return }
            entries[from]![fromName] = target
            entries[to]![toName] = source
            moveDirectory(source, from: from, to: to)
            moveDirectory(target, from: to, to: from)
            nodes[source]!.ctime = time
            nodes[target]!.ctime = time
            touchDirectory(from, time)
            touchDirectory(to, time)
            return
        }
        if let target {
            // The same node under both names: rename does nothing (rename(2)).
            if target == source { return }
            let targetIsDirectory = nodes[target]!.kind == .directory
            if sourceIsDirectory {
                guard targetIsDirectory else { throw .notDirectory }
                guard entries[target]?.isEmpty ?? true else { throw .notEmpty }
            } else if targetIsDirectory {
                throw .isDirectory
            }
            removeName(to, toName, time)
        }
        entries[from]![fromName] = nil
        entries[to]![toName] = source
        moveDirectory(source, from: from, to: to)
        nodes[source]!.ctime = time
        touchDirectory(from, time)
        touchDirectory(to, time)
    }

    /// Whether `inode` is `ancestor` or lies below it.
    private func isSelfOrBelow(_ inode: InodeNumber, _ ancestor: InodeNumber) -> Bool {
        var at = inode
        while true {
            if at == ancestor { return true }
            guard let up = parents[at], up != at else { return false }
            at = up
        }
    }

    private mutating func moveDirectory(_ inode: InodeNumber, from: InodeNumber, to: InodeNumber) {
        guard nodes[inode]!.kind == .directory, from != to else { return }
        parents[inode] = to
        nodes[from]!.nlink -= 1
        nodes[to]!.nlink += 1
    }

    // MARK: helpers

    private func checkName(_ name: String) throws(Refusal) {
        guard !name.isEmpty, name != ".", name != "..", !name.utf8.contains(UInt8(ascii: "/")), !name.utf8.contains(0) else {
            throw .invalid
        }
    }

    /// `parent` is a directory without `name`.
    private func checkFree(_ parent: InodeNumber, _ name: String) throws(Refusal) {
        guard let directory = nodes[parent] else { throw .notFound }
        guard directory.kind == .directory else { throw .notDirectory }
        guard entries[parent]![name] == nil else { throw .exists }
    }

    /// Removes a name (checked by the caller), and the node with its last one.
    private mutating func removeName(_ parent: InodeNumber, _ name: String, _ time: Nanos) {
        let inode = entries[parent]![name]!
        entries[parent]![name] = nil
        if nodes[inode]!.kind == .directory {
            nodes[parent]!.nlink -= 1
            forget(inode)
            entries[inode] = nil
            parents[inode] = nil
            return
        }
        nodes[inode]!.nlink -= 1
        nodes[inode]!.ctime = time
        if nodes[inode]!.nlink == 0 { forget(inode) }
    }

    private mutating func forget(_ inode: InodeNumber) {
        nodes[inode] = nil
        xattrs[inode] = nil
    }

    private mutating func touchDirectory(_ inode: InodeNumber, _ time: Nanos) {
        nodes[inode]!.mtime = time
        nodes[inode]!.ctime = time
    }
}
