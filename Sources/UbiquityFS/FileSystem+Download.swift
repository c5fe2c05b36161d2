import Glibc
import UbiquityStore
import UbiquitySystem

/// `ubiquity download`, `evict`, `pin` and `unpin` (files on demand), one file at a time:
/// what the store says is read and written under the metadata lock, every request to the
/// backing store (fetches, the check of the packs an eviction relies on) outside it.
extension FileSystem {
    /// What became of one file.
    public enum KeepOutcome: Sendable, Equatable {
        /// Done; `bytes` fetched (download) or freed (evict).
        case done(bytes: Int64)
        /// Not done, and why (a file open for writing, not uploaded yet, ...).
        case refused(String)
        /// Tried, and failed (the backing store could not be reached, ...).
        case failed(String)
    }

    /// The regular files at `path` (a file, or a directory and everything below it), with
    /// their paths and the bytes of each not here. Reads a directory per hold of the lock.
    public func keepTargets(at path: String) throws(Errno) -> [(ino: InodeNumber, path: String, absent: Int64)] {
        let clean = path.split(separator: "/").joined(separator: "/")
        let start = try withMeta { (_, store) throws(StoreError) -> (InodeNumber, NodeKind)? in
            guard let ino = clean.isEmpty ? Store.rootInode : store.locate(clean)?.2, let inode = store.inode(ino) else { return nil }
            return (ino, inode.kind)
        }
        guard let (root, kind) = start else { throw .notFound }
        if kind == .file {
            let absent = try withMeta { (_, store) throws(StoreError) in store.inode(root)?.absent ?? 0 }
            return [(root, clean, absent)]
        }
        guard kind == .directory else { return [] }
        var result: [(ino: InodeNumber, path: String, absent: Int64)] = []
        var pending: [(InodeNumber, String)] = [(root, clean)]
        while let (dir, prefix) = pending.popLast() {
            let entries = try withMetaSlice { (_, store) throws(StoreError) in store.entriesWithInodes(dir) }
            for entry in entries {
                // The hidden views and the key-value door are not files of the tree.
                if dir == Store.rootInode && (VirtualViews.rootNames.contains(entry.name) || entry.name == KeyValueDoor.name) { continue }
                let child = prefix.isEmpty ? entry.name : prefix + "/" + entry.name
                switch entry.inode.kind {
                case .file: result.append((entry.inode.id, child, entry.inode.absent))
                case .directory: pending.append((entry.inode.id, child))
                default: break
                }
            }
        }
        return result.sorted { $0.path < $1.path }
    }

    /// Makes file `ino`'s current content local; `progress` hears of the bytes as they
    /// arrive (in pieces of at most 8 MiB).
    public func download(_ ino: InodeNumber, progress: (Int64) -> Void = { _ in }) -> KeepOutcome {
        do {
            let wants = try withMeta { (_, store) throws(StoreError) in try store.missingChunks(of: ino) }
            var fetched: Int64 = 0
            var start = 0
            while start < wants.count {
                var end = start, bytes = 0
                while end < wants.count && (end == start || bytes + wants[end].size <= 8 << 20) {
                    bytes += wants[end].size
                    end += 1
                }
                try storeCall { () throws(StoreError) in try chunks.download(Array(wants[start..<end])) }
                fetched += Int64(bytes)
                progress(Int64(bytes))
                start = end
            }
            try refreshDownloadState(ino)
            return .done(bytes: fetched)
        } catch {
            return .failed(chunks.fetchStatistics.lastFailure ?? "\(error)")
        }
    }

    /// `ubiquity pin` / `unpin`: what this device keeps of the file (pinning does not
    /// download by itself: the caller downloads, and the background download keeps it).
    public func setKeep(_ ino: InodeNumber, _ keep: KeepPolicy) throws(Errno) {
        try withMeta { (_, store) throws(StoreError) in try store.setKeep(ino, keep) }
    }

    /// `ubiquity evict`: drops the local copies of file `ino`'s content, which its packs
    /// in the backing store hold (checked first: present, and no fossil marker). Refused
    /// for a file open for writing or with unsaved changes, one whose current version is
    /// not uploaded, a local-only file, and a pinned one. Small chunks (at most 1 KiB,
    /// carried in records) stay, and so do chunks a pinned or open file also uses
    /// (`keeping`: `chunksInUse()`, worked out once by a caller that evicts many). The
    /// file is then not downloaded again in the background (a read still fetches it).
    /// `closedOnly` (the cache limit) also passes over a file that is open at all.
    public func evict(_ ino: InodeNumber, closedOnly: Bool = false, keeping: ChunksInUse? = nil) -> KeepOutcome {
        enum Plan { case evict(head: Int64?, [ChunkID: ChunkPlace]), refuse(String) }
        let plan: Plan
        do {
            plan = try meta.withLock { (m, store) throws(StoreError) -> Plan in
                if let why = m.evictRefusal(ino, closedOnly: closedOnly, store: store) { return .refuse(why) }
                guard let head = store.inode(ino)?.head else { return .evict(head: nil, [:]) }
                guard try store.isUploaded(row: head) else { return .refuse("its current version is not uploaded yet (`ubiquity sync` uploads it)") }
                let ids = Set(try store.chunkList(row: head).chunks.filter { $0.size > Store.inlineChunkLimit && chunks.isLocal($0.id) }.map(\.id))
                let places = try store.chunkPlaces(ids)
                if let unplaced = ids.first(where: { places[$0] == nil }) {
                    return .refuse("chunk \(unplaced.hex) has no known place in the backing store")
                }
                return .evict(head: head, places)
            }
        } catch {
            return .failed("\(error)")
        }
        let places: [ChunkID: ChunkPlace], head: Int64?
        switch plan {
        case .refuse(let why): return .refused(why)
        case .evict(let h, let p): (head, places) = (h, p)
        }
        guard let sync = hooks.withLock({ $0.sync }) else { return .refused("no backing store (sync is not running)") }
        let packs = Set(places.values.map(\.pack))
        do {
            let present = try sync.packsPresent(packs)
            if let missing = packs.subtracting(present).sorted().first {
                return .refused("pack \(missing) is not in the backing store (or is being collected): its chunks stay here")
            }
        } catch {
            return .failed("checking the backing store: \(error)")
        }
        // Looked at again where the chunks go (local unlinks only): while the backing
        // store answered, the file may have been pinned, opened, written or replaced.
        let outcome: KeepOutcome
        do {
            outcome = try meta.withLock { (m, store) throws(StoreError) -> KeepOutcome in
                if let why = m.evictRefusal(ino, closedOnly: closedOnly, store: store) { return .refused(why) }
                guard store.inode(ino)?.head == head else { return .refused("it changed while the backing store was asked") }
                var inUse = keeping ?? ChunksInUse()
                if keeping == nil { inUse = try m.chunksInUse(store: store) }
                let freed = chunks.evict(places.keys.filter { !inUse.contains($0, besides: ino) })
                try store.setKeep(ino, .evicted)
                return .done(bytes: freed)
            }
            if case .done = outcome {
                try refreshDownloadState(ino)
                // The evicted records' space: holes now, packs mostly freed rewritten.
                try storeCall { () throws(StoreError) in try chunks.compactPacks() }
            }
        } catch {
            return .failed("\(error)")
        }
        return outcome
    }

    /// The chunks of pinned files and of open ones (worked out once by a caller that
    /// evicts many files): an eviction leaves them, whatever other file it is for.
    public func chunksInUse() throws(Errno) -> ChunksInUse {
        try withMeta { (m, store) throws(StoreError) in try m.chunksInUse(store: store) }
    }

    /// What pinned and open files use, each open file's apart (a file evicted while it
    /// is open for reading gives its own chunks back: the reader fetches what it needs).
    public struct ChunksInUse: Sendable {
        var pinned: Set<ChunkID> = []
        var open: [InodeNumber: Set<ChunkID>] = [:]

        func contains(_ id: ChunkID, besides ino: InodeNumber) -> Bool {
            pinned.contains(id) || open.contains { $0.key != ino && $0.value.contains(id) }
        }
    }

    /// Counts again what of file `ino` is here, after content arrived or went: watchers
    /// hear when its download state changed, and the kernel forgets its attributes
    /// (st_blocks; outside every lock).
    func refreshDownloadState(_ ino: InodeNumber) throws(Errno) {
        var changes = TreeChanges()
        changes.downloads.insert(ino)
        let changed = try withMeta { (_, store) throws(StoreError) -> Bool in
            let before = store.inode(ino)?.absent
            let refreshed = try store.refreshAbsent(ino)
            if refreshed.stateChanged { publishSyncEvents(store, changes) }
            return refreshed.absent != before
        }
        // Nothing came or went (a download of a file all here): the kernel keeps its view.
        if changed { hooks.withLock { $0.treeChanged }?(changes) }
    }
}

extension FileSystem.Meta {
    /// Why file `ino` may not be evicted now (nil: it may).
    func evictRefusal(_ ino: InodeNumber, closedOnly: Bool, store: any FileSystemStore) -> String? {
        guard let inode = store.inode(ino), inode.kind == .file else { return "not a regular file" }
        if LocalOnly.contains(store.path(of: ino) ?? "") { return "a local-only file: it is never uploaded" }
        if inode.keep == .pinned { return "pinned (`ubiquity unpin` it first)" }
        if busyFiles().contains(ino) { return "open for writing, or it has unsaved changes" }
        if closedOnly && openFiles[ino] != nil { return "open" }
        return nil
    }

    /// The chunks of the current contents of pinned files and of open files.
    func chunksInUse(store: any FileSystemStore) throws(StoreError) -> FileSystem.ChunksInUse {
        var inUse = FileSystem.ChunksInUse()
        for ino in try store.pinnedFiles() {
            if let head = store.inode(ino)?.head { inUse.pinned.formUnion(try store.chunkList(row: head).ids) }
        }
        for (ino, _) in openFiles.all {
            if let head = store.inode(ino)?.head { inUse.open[ino] = Set(try store.chunkList(row: head).ids) }
        }
        return inUse
    }
}
