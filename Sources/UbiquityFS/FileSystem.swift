import Glibc
import Synchronization
import UbiquityStore
import UbiquitySystem

/// POSIX semantics over the store, without any FUSE knowledge: the FUSE layer makes one
/// call per operation and replies with the result or the thrown `Errno`.
///
/// Locks, always taken in this order (`LockRank`, checked in debug builds), never while
/// replying to the kernel:
///   1. a `FileContent`'s lock (per open file: its data and commits)
///   2. `state`: the filesystem's own state (handles' listings, views, key-value door)
///   3. the store's lock (`SharedStore`: the tree and everything in SQLite; the sync
///      engine takes only this one)
///   4. the index's lock (`Index`: the SQLite connection; the group commit's folder
///      holds it while it writes outside 3)
///   5. the tree's working set (`TreeCache`): lookup and getattr of what it holds take
///      it alone, so they never wait for 2 or 3
///   5a. the key-value store's (`.kv/`) and the versions' reader (`.versions/`), each
///      taken under 2 without 3
///   6. leaves: the kernel's references (lookup counts), the open files, the busy
///      files, the handle table, the chunk cache's lock (inside ChunkStore)
///   7. a `FileContent`'s summary (size, isChanged: readable under any of the above)
/// `meta` takes 2 then 3 (most operations need both); `state` alone serves what needs no
/// store. Code holding `meta` must never call a FileContent data method (read, write,
/// truncate, commit): a commit holds the content lock and waits for `meta`. Reads and
/// writes of file data take neither 2 nor 3: their handle from the handle table, then
/// only their file's content lock, so they run in parallel across files and never wait
/// behind a metadata operation or a sync step.
///
/// No request to the backing store runs under 2 or 3: a fetch asked for there is refused
/// (`ChunkStore.refuseFetches`). Only a file's content lock (1) may be held across a
/// fetch, by that file's own reader or writer.
public final class FileSystem: Sendable {
    /// The filesystem's own state, under its own lock.
    let state: Locked<Meta>
    /// The store, shared with the sync engine; it owns its lock.
    public let store: SharedStore
    /// Both locks, in order: what most operations take.
    let meta: MetaLock
    /// Files sync must leave alone now (a leaf: the store's lock holder asks).
    let busy = BusyFiles()
    /// Open handles (a leaf): reads and writes find theirs without `state`.
    let handles = HandleTable()
    /// The kernel's lookup counts and the unlinked inodes they keep (a leaf).
    let references = KernelReferences()
    /// Open files by inode (a leaf): getattr reads their live size without `state`.
    let openFiles = OpenFileTable()
    let chunks: ChunkStore
    public let options: Options
    let hooks = Locked(Hooks())
    /// The last prune and gc reports (FileSystem+Maintenance).
    let reports = Locked(MaintenanceReports())
    /// Space pressure's measures (FileSystem+Space).
    let space = Locked(SpaceState())
    /// The move of an older store's chunk files into packs (FileSystem+ChunkFiles).
    let chunkFileMover = Locked(ChunkFileMover())
    /// Held around `relieveSpacePressure` only, before any other lock (so unranked).
    let relief = Locked(())
    /// When files were opened, since the cache keeper last wrote them (`Store.noteUses`):
    /// an open costs a dictionary entry, not a database write.
    let uses = Locked<[InodeNumber: Nanos]>([:])
    /// What watchers are told (ChangeFeed); a leaf lock.
    public let feed = ChangeFeed()
    /// What wakes the mount's background loops (FUSESession), which sleep while they have
    /// nothing to do: a batch of metadata opened (group commit), a commit made (WAL
    /// checkpoint), bytes of an open file changed (autosave).
    public let commitDue = Doorbell()
    /// When the last request came (`monotonicNanos`): the group commit folds a burst once
    /// requests pause, reads too (a fold takes CPU time that requests would use).
    let lastRequest = Atomic<Int64>(0)
    public let checkpointDue = Doorbell()
    public let autosaveDue = Doorbell()

    public struct Options: Sendable {
        /// Commit a file held open and dirty after this long without writes (DESIGN: ~10 s).
        public var idleCommitSeconds: Double = 10
        /// List `.versions` in the root directory (it always works when named).
        public var showVersions = false
        /// What prune keeps (the daemon prunes daily; `ubiquity prune` starts from it).
        public var retention = RetentionPolicy.standard
        /// How often the daemon prunes and collects garbage (0: never on its own).
        public var maintenanceInterval: Nanos = RetentionPolicy.day
        /// The key-value store's limits (`.kv/`, `ubiquity kv`).
        public var kvLimits = KVLimits()
        /// `--cache-size`: past this many bytes of current contents here, the least
        /// recently used files that are safe in the backing store go (nil: no limit).
        public var cacheSize: Int64?
        /// gc's grace under space pressure: short, since the space is needed now; a commit
        /// renews the chunks it reuses, so it never loses one however short the grace.
        public var pressureGrace: Nanos = 60 * 1_000_000_000
        public init() {}
    }

    /// The filesystem's own state (`state`). The store is not here: `meta` hands it to
    /// its body beside this, under the store's lock (`MetaLock.withLock`).
    struct Meta {
        let busy: BusyFiles
        /// The kernel's lookup counts and unlinked inodes, under their own (leaf) lock:
        /// `FileSystem.references`.
        let references: KernelReferences
        /// Open files by inode, under their own (leaf) lock: `FileSystem.openFiles`.
        let openFiles: OpenFileTable
        /// The handles, under their own (leaf) lock: `FileSystem.handles`.
        let handles: HandleTable
        var views = VirtualViews()
        var kv = KeyValueDoor()

        init(busy: BusyFiles, handles: HandleTable, references: KernelReferences, openFiles: OpenFileTable) {
            self.busy = busy
            self.handles = handles
            self.references = references
            self.openFiles = openFiles
        }
    }

    /// - Parameter store: the filesystem turns on its group commit; call `commitMetadata()`
    ///   100 ms after `commitDue` rings (the FUSE session does) and `drain()` at the end.
    public init(store: Store, options: Options = Options()) {
        store.startBatching(opened: commitDue, committed: checkpointDue)
        chunks = store.chunks
        let shared = SharedStore(store)
        self.store = shared
        let state = Locked(Meta(busy: busy, handles: handles, references: references, openFiles: openFiles), rank: .filesystem)
        self.state = state
        meta = MetaLock(state: state, store: shared)
        self.options = options
        // Nothing network-bound under the filesystem's lock or the store's: a fetch asked
        // for there is refused (and counted), never a stall of every other request.
        chunks.refuseFetches { [weak state, weak shared] in
            (state?.isHeldByCurrentThread ?? false) || (shared?.isHeldByCurrentThread ?? false)
        }
        shared.provideBusyFiles { [busy] in busy.current() }
        shared.observeTreeChanges { [weak self] changes in self?.storeChanged(changes) }
    }

    /// One slice of long work (prune, gc, space pressure, uses) under the metadata lock,
    /// then the locks handed to the requests that waited meanwhile (`MetaLock.yieldToWaiters`):
    /// a pthread mutex is not fair, and a loop that takes it again at once can keep a
    /// waiting FUSE request out for the whole loop (seconds, for a gc of many chunks).
    func withMetaSlice<T>(_ body: (inout Meta, any FileSystemStore) throws(StoreError) -> T) throws(Errno) -> T {
        defer { meta.yieldToWaiters() }
        return try withMeta(body)
    }

    /// Runs `body` under the metadata lock, with store errors mapped to errno.
    func withMeta<T>(_ body: (inout Meta, any FileSystemStore) throws(StoreError) -> T) throws(Errno) -> T {
        try storeCall { () throws(StoreError) -> T in try meta.withLock { (m, store) throws(StoreError) -> T in try body(&m, store) } }
    }

    // MARK: lookup, forget, getattr

    public func lookup(parent: InodeNumber, name: String) throws(Errno) -> Attributes {
        guard let attributes = try lookupOrAbsence(parent: parent, name: name) else { throw .notFound }
        return attributes
    }

    /// A lookup that returns nil when the name is not there and the kernel may remember
    /// that (a negative entry): in the tree, whose names appear only through the kernel or
    /// through sync, which tells the kernel of each. Elsewhere an absent name is ENOENT:
    /// in the virtual views and the key-value door, whose names come and go with
    /// versions, conflicts and keys; and while the operation log is given up (a full
    /// disk), when a batch that fails to commit can bring back a removed name.
    public func lookupOrAbsence(parent: InodeNumber, name: String) throws(Errno) -> Attributes? {
        try lookUp(parent: parent, name: name, counting: true)
    }

    /// What a lookup would answer, without the reference a lookup gives the kernel: for a
    /// permission check on a node the request names by its parent (a rename's source).
    public func attributes(parent: InodeNumber, name: String) throws(Errno) -> Attributes? {
        try lookUp(parent: parent, name: name, counting: false)
    }

    private func lookUp(parent: InodeNumber, name: String, counting: Bool) throws(Errno) -> Attributes? {
        if parent == KeyValueDoor.root || (parent == Store.rootInode && name == KeyValueDoor.name) {
            return try kvLookup(parent: parent, name: name, counting: counting)
        }
        let virtual = VirtualViews.isVirtual(parent) || (parent == Store.rootInode && VirtualViews.rootNames.contains(name))
        // The working set answers without the filesystem's or the store's lock; the
        // reference is counted under its lock (`TreeCache.lookUp`).
        if !virtual, let found = store.tree.lookUp(parent, name, holding: { [references, openFiles] id in
            if counting { references.add(id) }
            return openFiles[id]
        }) {
            switch found {
            case .found(let inode, let primaryName, let open): return Self.attributes(inode, primaryName: primaryName, open: open)
            case .absent(let remembered):
                if remembered { return nil }
                throw .notFound
            }
        }
        if virtual {
            return try withViews(about: parent) { (m, source) throws(Errno) -> Attributes in
                m.pruneViews()
                let attributes = try m.views.lookup(parent: parent, name: name, from: source)
                if counting { m.views.referenced(attributes.ino) }
                return attributes
            }
        }
        return try meta.withLock { (m, store) throws(Errno) -> Attributes? in
            // A failing database is EIO, not "no such name" (which the kernel would keep).
            guard let dir = try storeCall({ () throws(StoreError) in try store.lookUp(parent) }) else { throw .notFound }
            guard dir.kind == .directory else { throw .notDirectory }
            guard let inode = try storeCall({ () throws(StoreError) in try store.lookUp(parent, name) }) else {
                if !store.writesAhead { throw .notFound }
                return nil
            }
            if counting { references.add(inode.id) }
            return m.attributes(inode, store: store)
        }
    }

    /// The kernel dropped `count` references to `ino`. An inode that no name and no open
    /// handle refers to any more is removed from the store.
    /// The count is the filesystem's own state: only an unlinked inode the kernel no
    /// longer knows needs the store (to drop it), so a forget of any other waits for no
    /// store work (a fold, a sync step).
    public func forget(_ ino: InodeNumber, count: UInt64) {
        if KeyValueDoor.owns(ino) || VirtualViews.isVirtual(ino) {
            return state.withLock { m in
                if KeyValueDoor.owns(ino) { m.kv.forget(ino, count: count) } else { m.views.forget(ino, count: count) }
            }
        }
        // It checks again under both locks.
        if references.forget(ino, count: count) { meta.withLock { m, store in m.dropIfUnreferenced(ino, store: store) } }
    }

    public func getattr(_ ino: InodeNumber) throws(Errno) -> Attributes {
        // The working set answers without the filesystem's or the store's lock.
        if Self.isTreeNode(ino), let (inode, primaryName, open) = store.tree.inode(ino, holding: { [openFiles] in openFiles[$0] }) {
            return Self.attributes(inode, primaryName: primaryName, open: open)
        }
        if KeyValueDoor.owns(ino) { return try kvGetattr(ino) }
        if VirtualViews.isVirtual(ino) {
            let root = try rootInode()
            return try state.withLock { (m) throws(Errno) -> Attributes in try m.views.attributes(ino, root: root) }
        }
        return try meta.withLock { (m, store) throws(Errno) -> Attributes in
            guard let inode = store.inode(ino) else { throw .notFound }
            return m.attributes(inode, store: store)
        }
    }

    /// Attribute changes requested by setattr; nil fields stay as they are.
    public struct AttributeChanges: Sendable {
        public var mode: UInt32?
        public var uid: UInt32?
        public var gid: UInt32?
        public var size: Int64?
        public var atime: TimeChange?
        public var mtime: TimeChange?
        /// The kernel asks that set-id bits go (a chown; a truncation by a caller without
        /// CAP_FSETID): with a size, as `dropSetID` clears them.
        public var dropsSetID = false
        public init() {}

        /// An owner change, or no change at all (what `chown(f, -1, -1)` sends).
        var isChown: Bool {
            uid != nil || gid != nil || (mode == nil && size == nil && atime == nil && mtime == nil)
        }
    }

    public enum TimeChange: Sendable { case now, at(Nanos) }

    public func setattr(_ ino: InodeNumber, _ changes: AttributeChanges) throws(Errno) -> Attributes {
        if KeyValueDoor.owns(ino) {
            // Modes, owners and times of key files are fixed; only the size changes.
            if let size = changes.size { try kvTruncate(ino, to: size) }
            return try getattr(ino)
        }
        if VirtualViews.isVirtual(ino) { throw .readOnly }
        if let size = changes.size {
            try truncate(ino, to: size)
        }
        return try withMeta { (m, store) throws(StoreError) -> Attributes in
            guard var inode = store.inode(ino) else { throw .io(errno: ENOENT, "setattr") }
            let now = store.clock()
            if let mode = changes.mode { inode.mode = mode & 0o7777 }
            if let uid = changes.uid { inode.uid = uid }
            if let gid = changes.gid { inode.gid = gid }
            // A chown of a non-directory clears set-id bits, as the kernel leaves to a
            // filesystem that handles killpriv (ext4 does the same by the same rule for
            // root). `chown(f, -1, -1)` reaches us as a SETATTR that sets nothing: the kernel
            // turned its "kill set-id" into a mode change and then dropped that change.
            if inode.kind != .directory && changes.mode == nil && (changes.isChown || changes.dropsSetID) {
                inode.mode = Self.withoutSetID(inode.mode)
            }
            switch changes.atime { case .now: inode.atime = now; case .at(let t): inode.atime = t; case nil: break }
            switch changes.mtime { case .now: inode.mtime = now; case .at(let t): inode.mtime = t; case nil: break }
            // An explicit mtime wins over the one the last write() left pending.
            if changes.mtime != nil { m.openFiles[ino]?.pendingMTime = nil }
            if changes.size != nil && changes.mtime == nil { inode.mtime = now }
            inode.ctime = now
            try store.update(inode)
            return m.attributes(inode, store: store)
        }
    }

    /// Set-user-ID goes, and set-group-ID when the group may execute (without that bit it
    /// marks mandatory locking, which a write keeps): the kernel's rule for a write or a
    /// truncation by a caller without CAP_FSETID.
    static func withoutSetID(_ mode: UInt32) -> UInt32 {
        mode & UInt32(S_IXGRP) != 0 ? mode & ~UInt32(S_ISUID | S_ISGID) : mode & ~UInt32(S_ISUID)
    }

    /// Clears set-id bits as `withoutSetID` says, when the kernel asks (FUSE_HANDLE_KILLPRIV_V2:
    /// it no longer does so itself). A file without them, nearly every one, costs a look
    /// at the working set without a lock. The kernel refetches a written file's size and
    /// times but not its mode, so it is told.
    func dropSetID(_ ino: InodeNumber) throws(Errno) {
        if Self.isTreeNode(ino), let (inode, _, _) = store.tree.inode(ino, holding: { _ in () }),
           Self.withoutSetID(inode.mode) == inode.mode { return }
        let dropped = try withMeta { (_, store) throws(StoreError) -> Bool in
            guard var inode = store.inode(ino), Self.withoutSetID(inode.mode) != inode.mode else { return false }
            inode.mode = Self.withoutSetID(inode.mode)
            inode.ctime = store.clock()
            try store.update(inode)
            return true
        }
        if dropped {
            var changes = TreeChanges()
            changes.attributes = [ino]
            hooks.withLock { $0.treeChanged }?(changes)
        }
    }

    public func readlink(_ ino: InodeNumber) throws(Errno) -> String {
        if Self.isTreeNode(ino), let (inode, _, _) = store.tree.inode(ino, holding: { _ in () }) {
            guard inode.kind == .symlink, let target = inode.target else { throw .invalid }
            return target
        }
        return try meta.withLock { (_, store) throws(Errno) -> String in
            guard let inode = store.inode(ino) else { throw .notFound }
            guard inode.kind == .symlink, let target = inode.target else { throw .invalid }
            return target
        }
    }

    public struct FilesystemStats: Sendable {
        public var blockSize: UInt64, blocks: UInt64, blocksFree: UInt64, blocksAvailable: UInt64
        public var files: UInt64, filesFree: UInt64, nameMax: UInt64
    }

    /// Space is the store's filesystem's, with what writes may use as available (min-free,
    /// the reserve and size-limit left out: `writableBytes`); inode counts are ours.
    public func statfs() throws(Errno) -> FilesystemStats {
        let directory = store.directory
        let count = store.tree.inodeTotal ?? store.inodeCount
        var st = statvfs()
        if statvfs(directory, &st) != 0 { throw Errno(errno) }
        // Counts come in f_frsize units; report them in f_bsize units without overflowing.
        let (fragment, block) = (UInt64(st.f_frsize), max(UInt64(st.f_bsize), 1))
        func blocks(_ count: UInt64) -> UInt64 {
            let (bytes, overflow) = count.multipliedReportingOverflow(by: fragment)
            return overflow ? count / max(block / max(fragment, 1), 1) : bytes / block
        }
        let available = UInt64(writableBytes(st)) / block
        return FilesystemStats(blockSize: block, blocks: blocks(UInt64(st.f_blocks)),
                               blocksFree: blocks(UInt64(st.f_bfree)), blocksAvailable: available,
                               files: UInt64(count) + UInt64(st.f_ffree), filesFree: UInt64(st.f_ffree), nameMax: 255)
    }
}

extension FileSystem {
    /// Whether `ino` is a node of the tree, which the working set may hold: not one of the
    /// history views' nodes or of the key-value door's, numbered apart (`NodeNumbering`).
    static func isTreeNode(_ ino: InodeNumber) -> Bool { !VirtualViews.isVirtual(ino) && !KeyValueDoor.owns(ino) }

    /// Attributes with the live size and mtime of `open`, the file open at `inode`, if any.
    /// `primaryName`: the inode's own (a TinyPix file shows its view's size).
    static func attributes(_ inode: Inode, primaryName: String?, open: OpenFile?) -> Attributes {
        if let open {
            let absent = open.content.isChanged ? 0 : inode.absent
            var a = Attributes(inode, size: open.content.size, allocated: open.content.allocatedBytes - absent)
            // A write since the last save stamps mtime and ctime; a later change of status
            // (chmod, xattr, link) keeps its own, later ctime.
            if let t = open.pendingMTime { a.mtime = t; a.ctime = max(inode.ctime, t) }
            return a
        }
        if inode.kind == .file, let name = primaryName, TinyPixView.applies(to: name) {
            let size = TinyPixView.viewSize(storedSize: inode.size)
            return Attributes(inode, size: size, allocated: size)
        }
        return Attributes(inode)
    }
}

extension FileSystem.Meta {
    /// Attributes with the live size and mtime of an open file.
    func attributes(_ inode: Inode, store: any FileSystemStore) -> Attributes {
        attributes(inode, primaryName: inode.kind == .file ? store.name(of: inode.id) : nil)
    }

    /// Attributes when the inode's primary name is known (a listing read it already).
    func attributes(_ inode: Inode, primaryName: String?) -> Attributes {
        FileSystem.attributes(inode, primaryName: primaryName, open: openFiles[inode.id])
    }

    /// `ino` lost its last name: it goes once nothing has it open and the kernel forgot it.
    mutating func noteUnlinked(_ ino: InodeNumber, store: any FileSystemStore) {
        references.noteUnlinked(ino)
        dropIfUnreferenced(ino, store: store)
    }

    /// Removes an unlinked inode once nothing has it open and the kernel forgot it. A set
    /// lookup for every other inode (forget of a listed file must not read the database).
    mutating func dropIfUnreferenced(_ ino: InodeNumber, store: any FileSystemStore) {
        guard openFiles[ino] == nil, references.takeUnreferenced(ino) else { return }
        guard let inode = store.inode(ino), inode.nlink == 0 else { return }
        do { try store.forget(ino) } catch { log("ubiquity: dropping inode \(ino): \(error)") }
    }
}
