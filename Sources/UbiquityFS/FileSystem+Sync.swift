import Glibc
import UbiquityStore
import UbiquitySystem

/// The filesystem's side of sync: it tells the store which files sync must leave alone
/// (`BusyFiles`), hears what sync changed (`storeChanged`: open readers move to the
/// current version, the kernel and watchers are told), and serves the sync control and
/// status attributes on the mount root.
extension FileSystem {
    static let controlAttribute = "user.ubiquity.control"
    static let syncStatusAttribute = "user.ubiquity.sync"

    /// Connects the sync engine (the control and status attributes of the root).
    public func attach(sync: SyncControl) { hooks.withLock { $0.sync = sync } }

    static let socketAttribute = "user.ubiquity.socket"

    /// Names the control socket on the mount root (`user.ubiquity.socket`), so the CLI
    /// finds it from the mount whatever the store's path.
    public func announce(controlSocket path: String) { hooks.withLock { $0.controlSocket = path } }

    func socketAttribute(_ ino: InodeNumber, name: String) -> [UInt8]? {
        guard ino == Store.rootInode, name == Self.socketAttribute, let path = hooks.withLock({ $0.controlSocket }) else { return nil }
        return Array(path.utf8)
    }

    /// Called (outside every lock) with what sync changed in the tree: the FUSE layer
    /// invalidates the kernel's caches there.
    public func onTreeChange(_ body: @escaping @Sendable (TreeChanges) -> Void) { hooks.withLock { $0.treeChanged = body } }

    /// What a change from elsewhere (a sync step, the downloader) did to the tree, heard
    /// from the store once its lock is released (`SharedStore.change`): open readers move
    /// to the new current versions and watchers hear of it; then, outside every lock, the
    /// kernel forgets what it cached there.
    func storeChanged(_ changes: TreeChanges) {
        var cached = changes
        do {
            try meta.withLock { (m, store) throws(StoreError) in
                cached = m.cachedByKernel(changes)
                try m.treeChanged(changes, store: store)
                if feed.isWatched { publishSyncEvents(store, changes) }
            }
        } catch {
            log("ubiquity: after a sync step: \(error)")
        }
        hooks.withLock { $0.treeChanged }?(cached)
    }

    /// A query's snapshot: `body` runs where a second connection sees every change made
    /// so far (`SharedStore.withCommittedBatch`).
    public func withStoreSnapshot<T>(_ body: () throws(StoreError) -> T) throws(StoreError) -> T {
        try store.withCommittedBatch(body)
    }

    public static let committedAttribute = "user.ubiquity.committed"

    /// A read of the root's `user.ubiquity.committed` commits the group-commit batch and
    /// answers the time: a process that reads the store's database after it (`ubiquity
    /// status`) sees every change the mount made before the read. EIO if the commit fails.
    func committedAttribute(_ ino: InodeNumber, name: String) throws(Errno) -> [UInt8]? {
        guard ino == Store.rootInode, name == Self.committedAttribute else { return nil }
        try storeCall { () throws(StoreError) in try withStoreSnapshot { () throws(StoreError) in } }
        return Array(isoTime(nowNanos()).utf8)
    }

    /// Reads of the root's sync status attribute, answered without the metadata lock (the
    /// engine takes it during a cycle).
    func syncStatus(_ ino: InodeNumber, name: String) -> [UInt8]? {
        guard ino == Store.rootInode, name == Self.syncStatusAttribute, let sync = hooks.withLock({ $0.sync }) else { return nil }
        return Array(sync.statusText().utf8)
    }

    /// `setfattr -n user.ubiquity.control -v sync|pause|resume MOUNTPOINT`, and the
    /// maintenance commands (`prune ...`, `gc ...`: FileSystem+Maintenance).
    func control(_ ino: InodeNumber, name: String, value: [UInt8]) throws(Errno) -> Bool {
        guard name == Self.controlAttribute else { return false }
        guard ino == Store.rootInode else { throw .notPermitted }
        let text = String(decoding: value, as: UTF8.self).trimmingWhitespace
        if try maintenanceControl(text) { return true }
        guard let sync = hooks.withLock({ $0.sync }) else { throw .notSupported }
        switch text {
        case "sync": try storeCall { () throws(StoreError) in try sync.requestSync() }
        case "pause": sync.pause()
        case "resume": sync.resume()
        default: throw .invalid
        }
        return true
    }

    var hasSync: Bool { hooks.withLock { $0.sync != nil } }

    // MARK: conflicts through plain tools

    /// `rm .conflicts/<path>/<name>`: discards that conflict version.
    func discardConflict(parent: InodeNumber, name: String) throws(Errno) {
        try meta.withLock { (m, store) throws(Errno) in
            guard let (path, version) = try m.views.conflictVersion(parent: parent, name: name, store: store) else { throw .readOnly }
            try storeCall { () throws(StoreError) in try store.discardConflict(version.id) }
            publishFileEvents(store, [(.changed, path)]) // its state, once no conflict is left
        }
    }

    /// `mv .conflicts/<path>/<name> <path>`: makes that version the file's current one.
    /// Moving it anywhere else is EXDEV, so `mv` copies it there and then discards it.
    func takeConflict(parent: InodeNumber, name: String, newParent: InodeNumber, newName: String) throws(Errno) {
        let changes = try meta.withLock { (m, store) throws(Errno) -> TreeChanges in
            guard let (path, version) = try m.views.conflictVersion(parent: parent, name: name, store: store) else { throw .readOnly }
            guard !VirtualViews.isVirtual(newParent), let dir = store.path(of: newParent) else { throw Errno(EXDEV) }
            let target = dir.isEmpty ? newName : dir + "/" + newName
            guard target.utf8.elementsEqual(path.utf8) else { throw Errno(EXDEV) }
            guard let ino = store.child(newParent, newName) else { throw Errno(EXDEV) }
            if m.busyFiles().contains(ino) { throw .busy }
            try storeCall { () throws(StoreError) in try store.takeConflict(version.id, path: path) }
            var changes = TreeChanges()
            changes.inodes.insert(ino)
            try storeCall { () throws(StoreError) in try m.treeChanged(changes, store: store) }
            publishFileEvents(store, [(.changed, path)])
            return changes
        }
        if let notify = hooks.withLock({ $0.treeChanged }) { notify(changes) }
    }
}

/// What the FUSE layer and the CLI plug into the filesystem.
struct Hooks {
    var sync: SyncControl?
    var treeChanged: (@Sendable (TreeChanges) -> Void)?
    /// The daemon's control socket (watchers and queries connect there).
    var controlSocket: String?
}

extension FileSystem.Meta {
    /// Files sync must not change now: open for writing, or with unsaved writes.
    func busyFiles() -> Set<InodeNumber> { busy.current() }

    /// What of `changes` the kernel may hold in its caches. It holds nothing of an inode
    /// it was never given or has forgotten (no lookup count), nor any name in such a
    /// directory: a device joining a container makes whole directories the kernel has
    /// never seen, and needs no notice for each of their names. A lookup counts its
    /// reference before its reply, under the lock the change was made under (the working
    /// set's, or the store's when it missed), so one that races with this change either
    /// counts first (and its names are told) or finds the change made.
    func cachedByKernel(_ changes: TreeChanges) -> TreeChanges {
        let known = references.known(changes.inodes.union(changes.downloads).union(changes.entries.map(\.parent)))
        var cached = changes
        cached.inodes = changes.inodes.filter(known.contains)
        cached.downloads = changes.downloads.filter(known.contains)
        cached.entries = changes.entries.filter { known.contains($0.parent) }
        return cached
    }

    /// After sync changed the tree: open readers move to the new current version, the
    /// hidden views are rebuilt, unlinked inodes go once unused.
    mutating func treeChanged(_ changes: TreeChanges, store: any FileSystemStore) throws(StoreError) {
        for ino in changes.inodes {
            guard let old = openFiles[ino], !old.content.isChanged else { continue }
            openFiles[ino] = nil
            let fresh: OpenFile
            do { fresh = try openFile(ino, store: store) } catch {
                openFiles[ino] = old
                busy.open(ino, old.content)
                continue
            }
            fresh.handles = old.handles
            handles.replace(old, with: fresh)
        }
        for ino in changes.unlinked { noteUnlinked(ino, store: store) }
    }
}

extension String {
    var trimmingWhitespace: String {
        String(drop { $0.isWhitespace }.reversed().drop { $0.isWhitespace }.reversed())
    }
}
