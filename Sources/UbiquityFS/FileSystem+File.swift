import Glibc
import Synchronization
import UbiquityStore
import UbiquitySystem

/// A file some process has open: one content shared by all its handles.
/// Fields other than `content` and `pendingMTime` are guarded by the `meta` lock.
final class OpenFile: @unchecked Sendable {
    let content: FileContent
    /// The content is a TinyPix view: commits encode it to the stored 8 bytes.
    let isTinyPix: Bool
    var handles = 0
    /// mtime of the last write, applied to the inode at the next commit (saves a database
    /// write per write() call). An atomic, not a field under `meta`: a write sets it
    /// without taking the filesystem's lock.
    var pendingMTime: Nanos? {
        get { let t = pendingTime.load(ordering: .acquiring); return t == Self.noTime ? nil : t }
        set { pendingTime.store(newValue ?? Self.noTime, ordering: .releasing) }
    }
    private let pendingTime = Atomic<Nanos>(OpenFile.noTime)
    /// Reads and clears `pendingMTime` in one step: a write's time set in between is
    /// never lost (it stays for the next commit).
    func takePendingMTime() -> Nanos? {
        let t = pendingTime.exchange(Self.noTime, ordering: .acquiringAndReleasing)
        return t == Self.noTime ? nil : t
    }
    /// Gives back a time `takePendingMTime` took (its commit failed), unless a write set
    /// one since.
    func restorePendingMTime(_ t: Nanos) {
        _ = pendingTime.compareExchange(expected: Self.noTime, desired: t, ordering: .acquiringAndReleasing)
    }
    private static let noTime = Nanos.min
    /// The chunk store's count of fetched chunks when the file was opened: at the last
    /// close, the file's count of bytes not here is looked at again only if it moved.
    var fetchMark = 0

    init(content: FileContent, isTinyPix: Bool) {
        self.content = content
        self.isTinyPix = isTinyPix
    }
}

enum Handle {
    case file(ino: InodeNumber, open: OpenFile, writable: Bool)
    /// A read-only view (a version under .versions/).
    case view(content: FileContent)
    /// An open directory: the listing snapshot of its last read from offset 0 (nil before).
    case directory(ino: InodeNumber, entries: [DirectoryEntry]?)
    /// A key file under `.kv/` (FileSystem+KeyValue).
    case keyValue(KeyValueOpen)
}

public struct OpenFlags: Sendable {
    public var raw: Int32
    /// The kernel asks that set-id bits go with the truncation (`FileSystem.dropSetID`).
    public var dropsSetID = false
    public init(_ raw: Int32) { self.raw = raw }
    var writable: Bool { raw & O_ACCMODE != O_RDONLY }
    var truncates: Bool { raw & O_TRUNC != 0 }
}

extension FileSystem {
    // MARK: create, open, release

    public func create(parent: InodeNumber, name: String, mode: UInt32, flags: OpenFlags, caller: Caller) throws(Errno) -> (Attributes, HandleID) {
        if parent == KeyValueDoor.root { return try kvCreate(parent: parent, name: name, flags: flags) }
        let (attributes, handle, open) = try meta.withLock { (m, store) throws(Errno) -> (Attributes, HandleID, OpenFile) in
            let inode = try m.makeNode(parent: parent, name: name, kind: .file, mode: mode, caller: caller, store: store)
            let open = try m.openFile(inode.id, store: store)
            open.handles = 1
            references.add(inode.id)
            let handle = m.register(.file(ino: inode.id, open: open, writable: true))
            if feed.isWatched, let path = store.path(of: inode.id) { publishFileEvents(store, [(.added, path)]) }
            return (m.attributes(inode, store: store), handle, open)
        }
        // A new file is a save even if nothing is written: its empty first version.
        try storeCall { () throws(StoreError) in try open.content.truncate(0) }
        return (attributes, handle)
    }

    /// Whether the kernel may keep a file's page cache across opens: not for TinyPix
    /// views, whose grid is normalized at each commit (what was written as `X` reads `#`).
    public func keepsCache(_ handle: HandleID) -> Bool {
        switch handles[handle] {
        case .file(_, let open, _): return !open.isTinyPix
        case .keyValue: return false // another device may have set it since
        default: return true
        }
    }

    public func open(_ ino: InodeNumber, flags: OpenFlags) throws(Errno) -> HandleID {
        if KeyValueDoor.owns(ino) { return try kvOpen(ino, flags: flags) }
        if VirtualViews.isVirtual(ino) {
            if flags.writable || flags.truncates { throw .readOnly }
            return try withViews(about: ino) { (m, source) throws(Errno) -> HandleID in
                m.register(.view(content: try m.views.content(ino, from: source)))
            }
        }
        let (handle, open, size) = try meta.withLock { (m, store) throws(Errno) -> (HandleID, OpenFile, Int64) in
            guard let inode = store.inode(ino) else { throw .notFound }
            guard inode.kind == .file else { throw inode.kind == .directory ? .isDirectory : .invalid }
            let open = try m.openFile(ino, store: store)
            open.handles += 1
            return (m.register(.file(ino: ino, open: open, writable: flags.writable)), open, inode.size)
        }
        // A writer may make a small file big; a reader of a small one leaves nothing the
        // cache limit could evict.
        if flags.writable || Store.usesMatter(size: size) { uses.withLock { $0[ino] = nowNanos() } }
        if flags.truncates && flags.writable {
            if flags.dropsSetID { try dropSetID(ino) }
            try storeCall { () throws(StoreError) in try open.content.truncate(0) }
            noteWritten(open)
        }
        return handle
    }

    /// close(2) of one descriptor. FLUSH comes for every close of a descriptor (dup'ed ones
    /// too) and synchronously, RELEASE once per open file and asynchronously. So: commit
    /// here when bytes were written (close() then reports a failure such as a full disk,
    /// and the version exists when close() returns), but not for a truncation alone —
    /// a shell's `> file` closes a dup'ed descriptor right after open(O_TRUNC), and that
    /// must not become an empty version. Release commits whatever is left.
    public func flush(_ handle: HandleID) throws(Errno) {
        if let kv = keyValueHandle(handle) { return try kvFlush(kv) }
        guard let (ino, open) = try fileHandle(handle), open.content.hasWrites,
              state.withLock({ _ in open.handles }) == 1 else { return }
        try onFullDisk { () throws(Errno) in try commit(ino, open) }
    }

    public func release(_ handle: HandleID) throws(Errno) {
        let removed = handles.removeValue(forKey: handle)
        if case .keyValue(let kv) = removed { return kvRelease(kv) }
        guard case .file(let ino, let open, let writable) = removed else { return }
        if writable { busy.writers(ino, -1) }
        let last = state.withLock { _ -> Bool in open.handles -= 1; return open.handles == 0 }
        guard last else { return }
        // A refused TinyPix write is dropped at the last close: the old picture stays.
        if open.content.isRefused { open.content.discardChanges() }
        defer {
            // Chunks a reader fetched: the file's count of bytes not here follows.
            let fetched = chunks.fetchStatistics.chunks != open.fetchMark
            meta.withLock { m, store in
                if open.handles == 0 && m.openFiles[ino] === open && !open.content.isChanged {
                    m.closeFile(ino)
                    m.dropIfUnreferenced(ino, store: store)
                }
            }
            if fetched && (try? withMeta { (_, store) throws(StoreError) in (store.inode(ino)?.absent ?? 0) > 0 }) == true {
                try? refreshDownloadState(ino)
            }
        }
        try commit(ino, open, ifClosed: true)
    }

    /// fsync(2): commit, then make the save durable: a file of up to 1 MiB by one frame of
    /// the intent log and its fdatasync (outside the metadata lock, so concurrent fsyncs
    /// share the disk flush), anything else by the durability barrier.
    public func fsync(_ handle: HandleID) throws(Errno) {
        if let kv = keyValueHandle(handle) {
            // Applied (committed), then flushed to the disk, without any lock held.
            try kvFlush(kv)
            return try storeCall { () throws(StoreError) in try keyValues.makeDurable() }
        }
        if let (ino, open) = try fileHandle(handle) {
            // The intent frame carries the save and its path (replay finds or makes the
            // file there), so the operation log needs no flush of its own here; anything
            // else takes the barrier, which folds the log into the synced database.
            let durable = try onFullDisk { () throws(Errno) -> Bool in
                try commit(ino, open)
                guard let fd = try withMeta({ (_, store) throws(StoreError) in try store.logDurably(ino) }) else { return false }
                defer { close(fd) }
                guard fdatasync(fd) == 0 else { throw Errno(errno) }
                return true
            }
            if durable { return }
        }
        try onFullDisk { () throws(Errno) in try fsyncDirectory() }
    }

    /// The durability barrier, without a lock held during its disk flushes: the chunks',
    /// and the index's (`SharedStore.markDurable`).
    public func fsyncDirectory() throws(Errno) {
        try storeCall { () throws(StoreError) in
            try store.foldAhead()
            let mark = try store.durabilityMark()
            try store.syncFiles()
            try store.markDurable(upTo: mark)
        }
    }

    // MARK: data

    public func read(_ handle: HandleID, offset: Int64, count: Int) throws(Errno) -> [UInt8] {
        let pieces = try readPieces(handle, offset: offset, count: count)
        return pieces.count == 1 ? Array(pieces[0]) : Array(pieces.joined())
    }

    /// `read` as pieces for the reply to send in order (`FileContent.readPieces`).
    public func readPieces(_ handle: HandleID, offset: Int64, count: Int) throws(Errno) -> [ArraySlice<UInt8>] {
        let content: FileContent
        switch handles[handle] {
        case .file(_, let open, _): content = open.content
        case .view(let view): content = view
        case .keyValue(let kv): return [kvRead(kv, offset: offset, count: count)[...]]
        case .directory, nil: throw .badHandle
        }
        return try storeCall { () throws(StoreError) in try content.readPieces(offset: offset, count: count) }
    }

    /// `dropsSetID`: the kernel asks that set-id bits go first (`dropSetID`).
    public func write(_ handle: HandleID, offset: Int64, data: UnsafeRawBufferPointer, dropsSetID: Bool = false) throws(Errno) -> Int {
        let (ino, open): (InodeNumber, OpenFile)
        switch handles[handle] {
        case .file(let id, let file, true): (ino, open) = (id, file)
        case .keyValue(let kv): return try kvWrite(kv, offset: offset, data: data)
        case .file, .view, .directory, nil: throw .badHandle
        }
        guard offset >= 0 else { throw .invalid }
        guard offset <= maxFileSize - Int64(data.count) else { throw .fileTooBig }
        if dropsSetID { try dropSetID(ino) }
        try storeCall { () throws(StoreError) in try open.content.write(offset: offset, data) }
        noteWritten(open)
        return data.count
    }

    /// fallocate(2), as Linux means it:
    /// - mode 0 and KEEP_SIZE reserve the range: the space a write of its holes needs is
    ///   set aside now in the store's reservation file (`SpaceReservation`; ENOSPC when
    ///   the store's filesystem, its min-free or its size-limit cannot take it), so later
    ///   writes into the range find room whoever filled the disk since; the holes count
    ///   in st_blocks. Mode 0 extends the size.
    /// - PUNCH_HOLE (always with KEEP_SIZE) makes the range a hole: zeros, no blocks.
    /// - ZERO_RANGE makes it zeros that stay reserved; without KEEP_SIZE it may extend.
    /// - COLLAPSE_RANGE, INSERT_RANGE, UNSHARE_RANGE, WRITE_ZEROES and anything unknown:
    ///   EOPNOTSUPP (callers fall back to writing).
    /// ctime changes, and mtime whenever the content or the size does (as ext4).
    public func fallocate(_ handle: HandleID, mode: Int32, offset: Int64, length: Int64) throws(Errno) {
        let keepSize = mode & Linux.fallocKeepSize != 0
        let kind = mode & ~Linux.fallocKeepSize
        guard kind == 0 || kind == Linux.fallocPunchHole || kind == Linux.fallocZeroRange else { throw .notSupported }
        if kind == Linux.fallocPunchHole && !keepSize { throw .notSupported } // as the kernel requires
        guard let (ino, open) = try fileHandle(handle, forWriting: true) else { throw .badHandle }
        guard offset >= 0, length > 0 else { throw .invalid }
        guard offset <= maxFileSize - length else { throw .fileTooBig }
        let range = offset..<offset + length
        let sizeBefore = open.content.size
        if kind != Linux.fallocPunchHole {
            let added = open.content.addedReserve(in: range, zeroing: kind == Linux.fallocZeroRange)
            try checkSpace(for: added)
            try storeCall { () throws(StoreError) in try store.reservation.setAside(ino, added) }
        }
        do throws(Errno) {
            try storeCall { () throws(StoreError) in
                if kind == 0 {
                    try open.content.reserve(range, keepSize: keepSize)
                } else {
                    try open.content.zero(range, keepSize: keepSize, keepAllocated: kind == Linux.fallocZeroRange)
                }
            }
        } catch {
            // What was set aside for a change that did not happen goes back.
            store.reservation.settle(ino, level: open.content.reservedHoleBytes)
            throw error
        }
        let contentChanged = kind != 0 || open.content.size != sizeBefore
        try recordReserve(ino, open) { (store, inode) in
            // ctime always, mtime when the content or the size changed (at the next save).
            inode.ctime = store.clock()
            if contentChanged { open.pendingMTime = inode.ctime }
        }
        if contentChanged { autosaveDue.ring() }
    }

    /// ENOSPC unless the store can take `bytes` more: exactly what statfs reports as
    /// available (`writableBytes`), so `df` and fallocate agree.
    func checkSpace(for bytes: Int64) throws(Errno) {
        guard bytes > 0 else { return }
        var st = statvfs()
        if statvfs(store.directory, &st) == 0 {
            if bytes > writableBytes(st) { throw .noSpace }
        } else if let limit = options.retention.sizeLimit, bytes > limit.subtractingClamped(storeBytes()) {
            throw .noSpace
        }
    }

    /// lseek(2) with SEEK_DATA or SEEK_HOLE (the kernel handles the other whences):
    /// holes are the runs no write and no chunk covers. ENXIO at or past the end.
    public func seek(_ handle: HandleID, offset: Int64, data: Bool) throws(Errno) -> Int64 {
        let content: FileContent
        switch handles[handle] {
        case .file(_, let open, _): content = open.content
        case .view(let view): content = view
        default: throw .badHandle
        }
        // A negative offset is ENXIO, as on ext4 (t-hostile.py checks it).
        guard offset >= 0, let result = content.seek(data: data, from: offset) else { throw .noSuchAddress }
        return result
    }

    func truncate(_ ino: InodeNumber, to size: Int64) throws(Errno) {
        guard size >= 0 else { throw .invalid }
        guard size <= maxFileSize else { throw .fileTooBig }
        let (open, temporary) = try meta.withLock { (m, store) throws(Errno) -> (OpenFile, Bool) in
            guard let inode = store.inode(ino) else { throw .notFound }
            guard inode.kind == .file else { throw inode.kind == .directory ? .isDirectory : .invalid }
            let temporary = m.openFiles[ino] == nil
            let open = try m.openFile(ino, store: store)
            open.handles += 1
            return (open, temporary)
        }
        defer {
            meta.withLock { m, _ in
                open.handles -= 1
                if open.handles == 0 && !open.content.isChanged && m.openFiles[ino] === open { m.closeFile(ino) }
            }
        }
        try storeCall { () throws(StoreError) in try open.content.truncate(size) }
        noteWritten(open)
        // truncate(1) on a closed file is a save of its own.
        if temporary { try commit(ino, open) }
    }

    // MARK: commits

    /// Commits the open file's changes as a new version. A file unlinked meanwhile has
    /// no name to keep history under: its changes are dropped, as POSIX drops its data.
    /// - Parameter ifClosed: only while no handle has the file open (a last close): an
    ///   open that came after the close was decided, and may truncate the content before
    ///   this commit takes its lock, leaves the changes to its own last close (else a
    ///   shell's `echo a >f; echo b >f` could save an empty version between the two).
    func commit(_ ino: InodeNumber, _ open: OpenFile, ifClosed: Bool = false) throws(Errno) {
        let committed = try storeCall { () throws(StoreError) in
            try open.content.commit(proceed: { !ifClosed || state.withLock { _ in open.handles == 0 } }) { (list) throws(StoreError) -> ChunkList in
                try meta.withLock { (_, store) throws(StoreError) -> ChunkList in
                    guard let inode = store.inode(ino), inode.nlink > 0, let path = store.path(of: ino) else { return list }
                    var stored = list
                    if open.isTinyPix { stored = try TinyPixView.stored(from: list, chunks: chunks, path: path) }
                    // A saved file survives a crash of this process once this returns: the
                    // store logs the save (IntentLog) until the batch commits, so a SIGKILL
                    // right after a write does not lose the file (the systemd test checks it).
                    let written = open.takePendingMTime()
                    do throws(StoreError) {
                        try store.commit(ino, content: stored, path: path, local: LocalOnly.contains(path), written: written)
                    } catch {
                        // Kept for the next commit, unless a later write set a newer time.
                        if let written { open.restorePendingMTime(written) }
                        throw error
                    }
                    publishFileEvents(store, [(.changed, path)])
                    return open.isTinyPix ? try TinyPixView.view(of: stored, chunks: chunks) : list
                }
            }
        }
        if committed && open.content.reservation.ever { try recordReserve(ino, open) }
    }

    /// The inode's st_blocks bytes: its committed chunks and fallocate's reserved holes
    /// (the reserve is not content, so it outlives commits and reaches the inode directly).
    /// `also` changes the inode in the same hold of the lock and the same update (fallocate's
    /// ctime), so one call costs one inode write.
    private func recordReserve(_ ino: InodeNumber, _ open: OpenFile, also: (any FileSystemStore, inout Inode) -> Void = { _, _ in }) throws(Errno) {
        try withMeta { (_, store) throws(StoreError) in
            guard var inode = store.inode(ino) else { return }
            also(store, &inode)
            if !open.isTinyPix {
                inode.allocated = open.content.committedStoredBytes.addingClamped(open.content.reservedHoleBytes)
                try store.setReservedRanges(ino, open.content.reservation.ranges)
            }
            try store.update(inode)
        }
    }

    /// The group commit's loop (0.1 s after a change): `SharedStore.groupCommit`, a part
    /// of the overlay at a time, written outside the locks. Returns false when something
    /// still waits (a burst of changes not paused yet) or the commit failed: no new
    /// change may ring the doorbell, so the loop must look again by itself.
    public func groupCommit() -> Bool {
        while true {
            let step: Store.GroupCommit
            let active = lastRequest.load(ordering: .relaxed)
            do { step = try store.groupCommit(lastRequest: active) } catch {
                log("ubiquity: metadata commit failed: \(error)")
                return false
            }
            if step != .more { return step == .done }
        }
    }

    /// A request came (the FUSE layer notes each).
    public func noteRequest() { lastRequest.store(monotonicNanos(), ordering: .relaxed) }

    /// Commits every batched metadata change, the overlay folded whole (unmount, tests).
    /// Returns false when the commit failed.
    @discardableResult
    public func commitMetadata() -> Bool {
        do { try withMeta { (_, store) throws(StoreError) in try store.commitBatch() } } catch {
            log("ubiquity: metadata commit failed: \(error)")
            return false
        }
        return true
    }

    /// Commits every open file with changes (unmount, SIGTERM): nothing acknowledged is lost.
    public func drain() {
        joinMaintenanceJobs()
        stopMovingChunkFiles()
        // A full disk must not keep the last commits and the unmount from finishing.
        if let pressure = spacePressure() { releaseReserve(because: pressure.reason) }
        let open = openFiles.all
        for (ino, file) in open where file.content.isChanged {
            do { try commit(ino, file) } catch { log("ubiquity: committing inode \(ino) at unmount failed: \(error)") }
        }
        writeUses()
        commitMetadata()
        // A clean stop leaves everything durable, so the next mount has nothing to check
        // (Store+Recovery).
        do { try fsyncDirectory() } catch { log("ubiquity: durability barrier at unmount failed: \(error)") }
        chunks.seal()
        do { try withMeta { (_, store) throws(StoreError) in try store.checkpoint() } } catch { log("ubiquity: checkpoint at unmount failed: \(error)") }
    }

    /// Database checkpoints off the serving connections (the session's loop, every 5 s):
    /// see `WALCheckpointer`.
    public func checkpointInBackground() {
        do { try store.checkpointInBackground() } catch { log("ubiquity: background checkpoint failed: \(error)") }
    }

    /// A durability barrier when versions were saved since the last one (the maintenance
    /// loop, every 10 s): what a crash or a power loss leaves for the recovery at the next
    /// mount to check is then at most a few seconds of saves.
    public func barrierIfNeeded() {
        // The probe below goes through the gate: what a burst left is folded first, while
        // requests go on (`SharedStore.foldAhead`), not under the locks.
        do { try store.foldAhead() } catch { log("ubiquity: folding before the durability barrier failed: \(error)") }
        guard (try? store.needsDurableWork()) == true else { return }
        do { try fsyncDirectory() } catch { log("ubiquity: periodic durability barrier failed: \(error)") }
    }

    /// Commits files held open and dirty for longer than the idle interval (autosave).
    /// Returns whether a file with unsaved changes remains (the autosave loop looks again
    /// in a second; otherwise it sleeps until the next write rings `autosaveDue`).
    @discardableResult
    public func commitIdle(now: Nanos = nowNanos()) -> Bool {
        let idle = Nanos(options.idleCommitSeconds * 1e9)
        let open = openFiles.all
        var waiting = false
        for (ino, file) in open where file.content.isChanged {
            // One refused (logged once already) waits for the next write, which rings.
            if now - file.content.lastChange < idle { waiting = true; continue }
            if file.content.isRefused { continue }
            do { try commit(ino, file) } catch {
                log("ubiquity: autosave of inode \(ino) failed: \(error)")
                waiting = true
            }
        }
        return waiting
    }

    /// Bytes of an open file changed (write, truncate, fallocate): its mtime at the next
    /// save, and a look from the autosave loop in case it stays open.
    func noteWritten(_ open: OpenFile, at time: Nanos? = nil) {
        open.pendingMTime = time ?? store.clock()
        autosaveDue.ring()
    }

    private func keyValueHandle(_ handle: HandleID) -> KeyValueOpen? {
        if case .keyValue(let open) = handles[handle] { return open }
        return nil
    }

    private func fileHandle(_ handle: HandleID, forWriting: Bool = false) throws(Errno) -> (InodeNumber, OpenFile)? {
        switch handles[handle] {
        case .file(let ino, let open, let writable):
            if forWriting && !writable { throw .badHandle }
            return (ino, open)
        case .view: if forWriting { throw .badHandle }; return nil
        case .directory, .keyValue, nil: throw .badHandle
        }
    }
}

extension FileSystem.Meta {
    mutating func register(_ handle: Handle) -> HandleID {
        if case .file(let ino, _, true) = handle { busy.writers(ino, 1) }
        return handles.register(handle)
    }

    /// Drops `ino`'s open state (the last handle went and nothing is left to commit).
    mutating func closeFile(_ ino: InodeNumber) {
        openFiles[ino] = nil
        busy.open(ino, nil)
    }

    /// The open state of a file, created from its current version on first open.
    mutating func openFile(_ ino: InodeNumber, store: any FileSystemStore) throws(Errno) -> OpenFile {
        if let open = openFiles[ino] { return open }
        let isTinyPix = store.name(of: ino).map(TinyPixView.applies) ?? false
        let chunks = store.chunks
        let content = try storeCall { () throws(StoreError) in
            isTinyPix ? try store.openContent(ino) { (stored) throws(StoreError) in try TinyPixView.view(of: stored, chunks: chunks) }
                      : try store.openContent(ino)
        }
        let open = OpenFile(content: content, isTinyPix: isTinyPix)
        open.fetchMark = chunks.fetchStatistics.chunks
        openFiles[ino] = open
        busy.open(ino, content)
        return open
    }

}
