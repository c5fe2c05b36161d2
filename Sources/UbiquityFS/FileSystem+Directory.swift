import Glibc
import UbiquityStore
import UbiquitySystem

public struct DirectoryEntry: Sendable {
    public var name: String
    public var attributes: Attributes
}

/// Renameat2 flags (not exported by the Glibc module: they need _GNU_SOURCE).
public enum RenameFlags {
    public static let noReplace: UInt32 = 1
    public static let exchange: UInt32 = 2
}

extension FileSystem {
    public func mkdir(parent: InodeNumber, name: String, mode: UInt32, caller: Caller) throws(Errno) -> Attributes {
        try meta.withLock { (m, store) throws(Errno) -> Attributes in
            let inode = try m.makeNode(parent: parent, name: name, kind: .directory, mode: mode, caller: caller, store: store)
            references.add(inode.id)
            return m.attributes(inode, store: store)
        }
    }

    /// mknod: fifos and sockets only (device nodes make no sense in a synced container).
    public func mknod(parent: InodeNumber, name: String, mode: UInt32, rdev: UInt64, caller: Caller) throws(Errno) -> Attributes {
        // Device nodes are stored with their rdev, like ext4 (the kernel checks CAP_MKNOD).
        guard let kind = NodeKindBits.kind(mode: mode), kind.isLocalNode || kind == .file else { throw .invalid }
        if kind == .file {
            let (attributes, handle) = try create(parent: parent, name: name, mode: mode, flags: OpenFlags(O_WRONLY), caller: caller)
            try release(handle)
            return attributes
        }
        return try meta.withLock { (m, store) throws(Errno) -> Attributes in
            let inode = try m.makeNode(parent: parent, name: name, kind: kind, mode: mode, caller: caller,
                                       rdev: kind == .blockDevice || kind == .characterDevice ? rdev : 0, store: store)
            references.add(inode.id)
            return m.attributes(inode, store: store)
        }
    }

    public func symlink(target: String, parent: InodeNumber, name: String, caller: Caller) throws(Errno) -> Attributes {
        guard NameCodec.byteCount(target) <= 4095 else { throw .nameTooLong }
        return try meta.withLock { (m, store) throws(Errno) -> Attributes in
            let inode = try m.makeNode(parent: parent, name: name, kind: .symlink, mode: 0o777, caller: caller, target: target, store: store)
            references.add(inode.id)
            return m.attributes(inode, store: store)
        }
    }

    public func link(_ ino: InodeNumber, parent: InodeNumber, name: String) throws(Errno) -> Attributes {
        try meta.withLock { (m, store) throws(Errno) -> Attributes in
            try m.checkNewName(parent: parent, name: name, store: store)
            guard let inode = store.inode(ino) else { throw .notFound }
            guard inode.kind != .directory else { throw .notPermitted }
            try storeCall { () throws(StoreError) in try store.link(ino, parent: parent, name: name) }
            references.add(ino)
            return m.attributes(store.inode(ino)!, store: store)
        }
    }

    public func unlink(parent: InodeNumber, name: String) throws(Errno) {
        if parent == KeyValueDoor.root { return try kvUnlink(parent: parent, name: name) }
        if VirtualViews.isVirtual(parent) { return try discardConflict(parent: parent, name: name) }
        try meta.withLock { (m, store) throws(Errno) in
            let (id, inode) = try m.existing(parent: parent, name: name, store: store)
            guard inode.kind != .directory else { throw .isDirectory }
            let path = feed.isWatched ? m.childPath(parent, name, store: store) : nil
            try m.removeName(parent: parent, name: name, id: id, store: store)
            if let path, inode.kind == .file { publishFileEvents(store, [(.removed, path)]) }
        }
    }

    public func rmdir(parent: InodeNumber, name: String) throws(Errno) {
        try meta.withLock { (m, store) throws(Errno) in
            let (id, inode) = try m.existing(parent: parent, name: name, store: store)
            guard inode.kind == .directory else { throw .notDirectory }
            guard store.isEmptyDirectory(id) else { throw .notEmpty }
            try m.removeName(parent: parent, name: name, id: id, store: store)
        }
    }

    /// rename(2)/renameat2(2). Renaming a file keeps its history; renaming a file over an
    /// existing file continues the *target's* history with the source's content, which is
    /// how editors' "write temp, rename over" saves stay one history.
    public func rename(parent: InodeNumber, name: String, newParent: InodeNumber, newName: String, flags: UInt32) throws(Errno) {
        guard flags & ~(RenameFlags.noReplace | RenameFlags.exchange) == 0,
              flags != RenameFlags.noReplace | RenameFlags.exchange else { throw .invalid }
        // Keys are not files: mv falls back to copy and remove.
        if KeyValueDoor.owns(parent) || KeyValueDoor.owns(newParent) { throw Errno(EXDEV) }
        if VirtualViews.isVirtual(parent) && flags == 0 {
            return try takeConflict(parent: parent, name: name, newParent: newParent, newName: newName)
        }
        // Commit the source's pending writes first, so the content that moves is a version.
        let pending = meta.withLock { (m, store) -> (InodeNumber, OpenFile)? in
            guard let id = store.child(parent, name), let open = m.openFiles[id], open.content.isChanged else { return nil }
            return (id, open)
        }
        if let (id, open) = pending { try commit(id, open) }

        try meta.withLock { (m, store) throws(Errno) in
            // For watchers, in the same hold of the lock as the rename (a query that
            // subscribes meanwhile sees it in its snapshot or as events): the files at both
            // names before and after (a directory's files).
            let watched = feed.isWatched
            let before = watched ? m.filePaths(parent, name, store: store).union(m.filePaths(newParent, newName, store: store)) : []
            try renameLocked(&m, store, parent: parent, name: name, newParent: newParent, newName: newName, flags: flags)
            if watched {
                let after = m.filePaths(parent, name, store: store).union(m.filePaths(newParent, newName, store: store))
                publishFileEvents(store, before.subtracting(after).sorted().map { (.removed, $0) }
                                    + after.sorted().map { (before.contains($0) ? .changed : .added, $0) })
            }
        }
    }

    private func renameLocked(_ m: inout Meta, _ store: any FileSystemStore, parent: InodeNumber, name: String, newParent: InodeNumber, newName: String,
                              flags: UInt32) throws(Errno) {
        if VirtualViews.isVirtual(parent) || VirtualViews.isVirtual(newParent) {
            throw .readOnly
        }
        if newParent == Store.rootInode && VirtualViews.rootNames.contains(newName) { throw .readOnly }
        let (sourceID, source) = try m.existing(parent: parent, name: name, store: store)
        guard let newDir = store.inode(newParent) else { throw .notFound }
        guard newDir.kind == .directory else { throw .notDirectory }
        try checkName(newName)
        if source.kind == .directory && m.isAncestor(sourceID, of: newParent, store: store) { throw .invalid }
        let targetID = store.child(newParent, newName)
        if targetID == sourceID { return }
        let sourcePath = store.path(of: sourceID)
        try m.settleMovesBeforeCrossing(source, from: sourcePath, to: newParent, newName, store: store)

        if flags & RenameFlags.exchange != 0 {
            guard let targetID else { throw .notFound }
            if let target = store.inode(targetID), target.kind == .directory, m.isAncestor(targetID, of: parent, store: store) { throw .invalid }
            let targetPath = store.path(of: targetID)
            try storeCall { () throws(StoreError) in try store.exchangeEntries(parent, name, newParent, newName) }
            try m.pathsChanged(sourceID, from: sourcePath, store: store)
            try m.pathsChanged(targetID, from: targetPath, store: store)
            return
        }
        var continued: (fileID: FileID, head: Int64?)?
        if let targetID, let target = store.inode(targetID) {
            if flags & RenameFlags.noReplace != 0 { throw .exists }
            if source.kind == .directory {
                guard target.kind == .directory else { throw .notDirectory }
                guard store.isEmptyDirectory(targetID) else { throw .notEmpty }
            } else if target.kind == .directory {
                throw .isDirectory
            }
            let targetPath = store.path(of: targetID) ?? ""
            // Only a target whose last name goes hands its history on: a hard-linked
            // target lives on under its other names and keeps its history (seed 105).
            if source.kind == .file, target.kind == .file, target.nlink == 1, let fileID = target.fileID,
               !LocalOnly.contains(targetPath) {
                continued = (fileID, target.head)
            }
        }
        // Saving a picture through a temp file (sed -i, vim): the temp's content is the
        // grid, so encode it now; a save of an invalid grid over a picture is refused
        // before anything changes, as a refused write is. The content is read only
        // for that or for a history it continues (a plain move reads no chunk list).
        let becomesPicture = source.kind == .file && TinyPixView.applies(to: newName) && !TinyPixView.applies(to: name)
        var content = ChunkList()
        if becomesPicture || continued != nil, let row = source.head {
            content = try storeCall { () throws(StoreError) -> ChunkList in try store.headChunkList(sourceID, row: row) }
        }
        var encoded = false
        if becomesPicture {
            do throws(StoreError) {
                content = try TinyPixView.stored(from: content, chunks: store.chunks, path: newName)
                encoded = true
            } catch {
                // Content that is not here (files on demand) cannot be read under the
                // filesystem's lock: it is kept as it is, as any content that is no picture.
                if case .missingChunk = error {} else if continued != nil { throw storeErrorLogged(error) }
            }
        }
        if let targetID {
            try m.removeName(parent: newParent, name: newName, id: targetID, historyContinues: continued != nil, store: store)
        }
        try storeCall { () throws(StoreError) in try store.moveEntry(from: parent, name, to: newParent, newName) }
        if encoded && continued == nil {
            let path = store.path(of: sourceID) ?? newName
            let finalContent = content
            _ = try storeCall { () throws(StoreError) in
                try store.commit(sourceID, content: finalContent, path: path, local: LocalOnly.contains(path))
            }
        }
        if let continued {
            // The source's content becomes the next version of the target's history.
            let content = content
            try storeCall { () throws(StoreError) in
                // A temp file saved once (sed -i, an editor's atomic save) has no history
                // worth showing of its own: its one version becomes the target's newest.
                // A source with a longer history keeps it, shown at its old path.
                // Only a history this device made: another device's file keeps its own
                // (else a synced file's only version leaves .versions/: simulation seed 20).
                if let old = source.fileID { try store.endHistoryRenamedOver(old, of: sourceID) }
                try store.adoptHistory(sourceID, fileID: continued.fileID, head: continued.head, knownFrom: targetID)
                try store.commit(sourceID, content: content, path: store.path(of: sourceID) ?? newName, local: false)
            }
        }
        try m.pathsChanged(sourceID, from: continued == nil ? sourcePath : nil, store: store)
    }

    // MARK: readdir

    public func opendir(_ ino: InodeNumber) throws(Errno) -> HandleID {
        if Self.isTreeNode(ino), let (dir, _, _) = store.tree.inode(ino, holding: { _ in () }), dir.kind == .directory {
            return handles.register(.directory(ino: ino, entries: nil))
        }
        // `.kv/` and the views: the first read lists (and finds a node gone).
        if ino == KeyValueDoor.root || VirtualViews.isVirtual(ino) {
            return state.withLock { m in m.register(.directory(ino: ino, entries: nil)) }
        }
        return try meta.withLock { (m, store) throws(Errno) -> HandleID in
            guard let dir = store.inode(ino) else { throw .notFound }
            guard dir.kind == .directory else { throw .notDirectory }
            return m.register(.directory(ino: ino, entries: nil))
        }
    }

    /// The listing snapshot taken by the first read: offsets stay stable while the
    /// directory changes. A read from offset 0 (the first, or one after rewinddir) takes
    /// a new snapshot: POSIX wants every entry that exists at the rewind (t-hostile.py
    /// checks it). Nothing is listed at opendir: that would read every directory twice.
    public func readdir(_ handle: HandleID, fromStart: Bool = false) throws(Errno) -> [DirectoryEntry] {
        // A directory of the tree (not the root, which lists the views too) whose names
        // and inodes are all in the working set is listed without the filesystem's or
        // the store's lock. The kernel runs one readdir of a handle at a time.
        if case .directory(let ino, let entries) = handles[handle], ino != Store.rootInode, Self.isTreeNode(ino) {
            if !fromStart, let entries { return entries }
            if let listed = store.tree.listing(ino, holding: { [openFiles] in openFiles[$0] }) {
                let fresh = listed.map {
                    DirectoryEntry(name: $0.name, attributes: Self.attributes($0.inode, primaryName: $0.primaryName, open: $0.extra))
                }
                handles[handle] = .directory(ino: ino, entries: fresh)
                return fresh
            }
        }
        // `.kv/`: the filesystem's lock and the key-value store's, not the store's.
        if case .directory(KeyValueDoor.root, _) = handles[handle] {
            let owner = kvOwner()
            return try state.withLock { (m) throws(Errno) -> [DirectoryEntry] in
                guard case .directory(let ino, let entries) = m.handles[handle], ino == KeyValueDoor.root else { throw .badHandle }
                if !fromStart, let entries { return entries }
                let fresh = try m.kvListing(keyValues: keyValues, owner: owner)
                m.handles[handle] = .directory(ino: ino, entries: fresh)
                return fresh
            }
        }
        // The views: `.versions/` without the store's lock (`withViews`).
        if case .directory(let ino, let entries) = handles[handle], VirtualViews.isVirtual(ino) {
            if !fromStart, let entries { return entries }
            return try withViews(about: ino) { (m, source) throws(Errno) -> [DirectoryEntry] in
                m.pruneViews()
                let fresh = try m.views.entries(ino, from: source)
                m.handles[handle] = .directory(ino: ino, entries: fresh)
                return fresh
            }
        }
        return try meta.withLock { (m, store) throws(Errno) -> [DirectoryEntry] in
            guard case .directory(let ino, let entries) = m.handles[handle] else { throw .badHandle }
            if !fromStart, let entries { return entries }
            let fresh = try m.listing(ino, showVersions: options.showVersions, store: store)
            m.handles[handle] = .directory(ino: ino, entries: fresh)
            return fresh
        }
    }

    /// readdirplus hands the kernel an entry reference for each listed node. The tree's
    /// are counted under their own lock; the views' and keys' under the filesystem's.
    public func noteLookups(_ inos: [InodeNumber]) {
        guard !inos.isEmpty else { return }
        let inTree = inos.filter(Self.isTreeNode)
        references.add(inTree)
        guard inTree.count < inos.count else { return }
        state.withLock { m in
            for ino in inos {
                if KeyValueDoor.owns(ino) {
                    m.kv.referenced(ino)
                } else if VirtualViews.isVirtual(ino) {
                    m.views.referenced(ino)
                }
            }
        }
    }

    public func releasedir(_ handle: HandleID) {
        _ = handles.removeValue(forKey: handle)
    }
}

/// Names the filesystem accepts: what POSIX allows, up to 255 bytes.
func checkName(_ name: String) throws(Errno) {
    if name.isEmpty || name == "." || name == ".." || name.contains("/") || name.contains("\0") { throw .invalid }
    if NameCodec.byteCount(name) > 255 { throw .nameTooLong }
}

extension FileSystem.Meta {
    /// Lets the history views drop nodes the kernel holds no reference to, keeping those
    /// that open directory handles list.
    mutating func pruneViews() {
        let handles = self.handles.values
        views.pruneUnreferenced {
            var pinned: Set<InodeNumber> = []
            for case .directory(_, let entries?) in handles {
                for entry in entries where VirtualViews.isVirtual(entry.attributes.ino) { pinned.insert(entry.attributes.ino) }
            }
            return pinned
        }
    }

    /// The entries of directory `ino` (control entries at the root), with attributes.
    mutating func listing(_ ino: InodeNumber, showVersions: Bool, store: any FileSystemStore) throws(Errno) -> [DirectoryEntry] {
        if ino == KeyValueDoor.root {
            return try kvListing(keyValues: store.keyValues, owner: KeyValueDoor.Owner(store.inode(Store.rootInode)))
        }
        if KeyValueDoor.owns(ino) { throw .notDirectory }
        guard let dir = store.inode(ino) else { throw .notFound }
        guard dir.kind == .directory else { throw .notDirectory }
        var list = store.entriesWithInodes(ino).map { DirectoryEntry(name: $0.name, attributes: attributes($0.inode, primaryName: $0.primaryName)) }
        if ino == Store.rootInode { list = try views.rootEntries(store: store, root: dir, showVersions: showVersions) + list }
        return list
    }

    func existing(parent: InodeNumber, name: String, store: any FileSystemStore) throws(Errno) -> (InodeNumber, Inode) {
        if VirtualViews.isVirtual(parent) || (parent == Store.rootInode && VirtualViews.rootNames.contains(name)) { throw .readOnly }
        guard let dir = store.inode(parent) else { throw .notFound }
        guard dir.kind == .directory else { throw .notDirectory }
        guard let id = store.child(parent, name), let inode = store.inode(id) else { throw .notFound }
        return (id, inode)
    }

    func checkNewName(parent: InodeNumber, name: String, store: any FileSystemStore) throws(Errno) {
        if VirtualViews.isVirtual(parent) { throw .readOnly }
        if parent == Store.rootInode && VirtualViews.rootNames.contains(name) { throw .exists }
        try checkName(name)
        guard let dir = store.inode(parent) else { throw .notFound }
        guard dir.kind == .directory else { throw .notDirectory }
        guard dir.nlink > 0 || parent == Store.rootInode else { throw .notFound }
        if store.child(parent, name) != nil { throw .exists }
    }

    mutating func makeNode(parent: InodeNumber, name: String, kind: NodeKind, mode: UInt32, caller: Caller,
                           rdev: UInt64 = 0, target: String? = nil, store: any FileSystemStore) throws(Errno) -> Inode {
        try checkNewName(parent: parent, name: name, store: store)
        // A set-group-ID directory passes its group on (and, to directories, the bit).
        let dir = store.inode(parent)!
        let sgid = dir.mode & UInt32(S_ISGID) != 0
        let gid = sgid ? dir.gid : caller.gid
        var bits = mode & 0o7777
        if sgid && kind == .directory { bits |= UInt32(S_ISGID) }
        let finalBits = bits
        return try storeCall { () throws(StoreError) in
            let inode = try store.create(parent: parent, name: name, kind: kind, mode: finalBits, uid: caller.uid, gid: gid,
                                         rdev: rdev, target: target)
            // A file created where a deleted file (or one an editor moved aside) was shown
            // continues that history: vim's rename-then-write save stays one history.
            guard kind == .file, let path = store.path(of: inode.id), !LocalOnly.contains(path),
                  let dead = try store.deadHistory(at: path) else { return inode }
            try store.continueHistory(inode.id, dead)
            return store.inode(inode.id)!
        }
    }

    /// Removes one name. A file whose last name goes gets a tombstone in its history
    /// (unless its history continues under another inode: rename over).
    mutating func removeName(parent: InodeNumber, name: String, id: InodeNumber, historyContinues: Bool = false, store: any FileSystemStore) throws(Errno) {
        let path = store.path(of: id) ?? name
        let before = store.inode(id)!
        // Another name may become the file's on the other side of a local-only edge
        // (below): histories of directories moved before must stand at their files' paths
        // first, as for a rename across it (`settleMovesBeforeCrossing`).
        if before.kind == .file, before.nlink > 1, store.hasUnsettledMoves {
            try storeCall { () throws(StoreError) in try store.settleAllMoves() }
        }
        let after = try storeCall { () throws(StoreError) in try store.removeEntry(parent: parent, name: name, id: id) }
        if let after, after.kind == .file, after.nlink == 0, let fileID = before.fileID {
            if historyContinues {
                // The old inode may still be open; give it a fresh, detached identity.
                try storeCall { () throws(StoreError) in try store.adoptHistory(id, fileID: .new(), head: nil) }
            } else if !LocalOnly.contains(path) {
                try storeCall { () throws(StoreError) in try store.commitTombstone(fileID: fileID, head: before.head, path: path, of: id) }
            }
        }
        if after?.nlink == 0 { noteUnlinked(id, store: store) }
        // A hard link's other name is now the file's (its primary path): when one name is
        // local-only and the other synced, the file crossed the edge as a rename would.
        if let after, after.kind == .file, after.nlink > 0, let newPath = store.path(of: id),
           LocalOnly.contains(newPath) != LocalOnly.contains(path) {
            try pathsChanged(id, from: nil, store: store)
        }
    }

    func isAncestor(_ ancestor: InodeNumber, of node: InodeNumber, store: any FileSystemStore) -> Bool {
        var current = node
        var steps = 0
        while steps < 4096 {
            if current == ancestor { return true }
            if current == Store.rootInode { return false }
            guard let path = store.path(of: current), !path.isEmpty else { return false }
            guard let parent = store.parentOfDirectory(current) else { return false }
            current = parent
            steps += 1
        }
        return false
    }

    /// A rename that takes a file or a directory across a local-only name retires or
    /// begins histories where they are shown (`pathsChanged`): a directory moved before,
    /// whose files' histories still wait at their old paths (Store+MovedTrees), is
    /// settled first, or an editor's rename-aside there would leave the file's history
    /// behind and its next save would begin another.
    fileprivate func settleMovesBeforeCrossing(_ source: Inode, from sourcePath: String?, to newParent: InodeNumber, _ newName: String,
                                           store: any FileSystemStore) throws(Errno) {
        guard store.hasUnsettledMoves, let sourcePath, let parentPath = store.path(of: newParent) else { return }
        let newPath = parentPath.isEmpty ? newName : parentPath + "/" + newName
        let crosses = source.kind == .directory ? LocalOnly.coversBelow(sourcePath) != LocalOnly.coversBelow(newPath)
            : LocalOnly.contains(sourcePath) != LocalOnly.contains(newPath)
        if crosses { try storeCall { () throws(StoreError) in try store.settleAllMoves() } }
    }

    /// After a rename: move where the histories below `id` are shown, and give files that
    /// moved between local-only and synced names a version at their new path.
    /// - Parameter oldPath: the path `id` had (nil: not known, or its history changed:
    ///   the file's version decides). A file or directory that stays as local-only or
    ///   synced as it was needs no version read: a synced file's history moves with it,
    ///   and the histories below a directory move in the background (Store+MovedTrees),
    ///   so the rename's work does not grow with what it moves.
    mutating func pathsChanged(_ id: InodeNumber, from oldPath: String?, store: any FileSystemStore) throws(Errno) {
        guard let inode = store.inode(id) else { return }
        switch inode.kind {
        case .directory:
            if let oldPath, let path = store.path(of: id), LocalOnly.coversBelow(oldPath) == LocalOnly.coversBelow(path) { return }
            for entry in store.entries(id) { try pathsChanged(entry.id, from: nil, store: store) }
        case .file:
            guard let path = store.path(of: id), let fileID = inode.fileID, let headRow = inode.head else { return }
            let local = LocalOnly.contains(path)
            if let oldPath, LocalOnly.contains(oldPath) == local {
                if !local { try storeCall { () throws(StoreError) in try store.setHistory(fileID, path: path, live: true) } }
                return
            }
            let head = try storeCall { () throws(StoreError) in try store.version(row: headRow) }
            if head?.isLocal == false && local {
                // Moved aside under a scratch name: the history stays at its old path, free
                // for the file that takes that name next; this file goes on alone.
                try storeCall { () throws(StoreError) in
                    try store.retireHistory(fileID)
                    try store.adoptHistory(id, fileID: .new(), head: headRow)
                    try store.commit(id, content: try store.chunkList(row: headRow), path: path, local: true)
                }
            } else if head?.isLocal == true && !local {
                _ = try storeCall { () throws(StoreError) in
                    try store.commit(id, content: try store.chunkList(row: headRow), path: path, local: local)
                }
            } else if !local {
                try storeCall { () throws(StoreError) in try store.setHistory(fileID, path: path, live: true) }
            }
        default: break
        }
    }
}
