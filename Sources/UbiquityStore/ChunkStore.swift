import Dispatch
import Glibc
import Synchronization
import UbiquitySystem

/// Immutable chunks named by their SHA-256: chunks of at most `SmallChunks.limit` bytes as
/// rows of `chunks/small.sqlite` (`SmallChunks`), bigger ones as records of append-only
/// packs in `chunks/packs/` (`LocalPacks`, store format 18). A store from before format 18
/// also has chunk files under `chunks/xx/` (256-way fan-out; before format 5 small chunks
/// too): they stay readable and are collected as usual, and a store made at format 18 or
/// later has no such directories, so nothing looks for files there.
///
/// Contract:
/// - `put` is idempotent: a chunk that exists is not written again (same name, same bytes).
/// - A chunk appears only complete: a row in one statement, a pack record in one write
///   that an open checks (header and hash) before it believes it.
/// - `put` does not flush; `sync()` is the durability barrier for all chunks written so
///   far (the small chunks' WAL and the packs written since the last) and callers run it
///   before recording a durable version that names them.
/// - `read` re-hashes every chunk it returns and throws `.corruptChunk` on a mismatch, so
///   wrong bytes are never served. Verified chunks are kept in a small cache.
/// - Garbage collection (`sweep`) deletes only a chunk no version named when its mark
///   began and that nobody wrote or claimed since: `put` and `contains` of a chunk that is
///   already there renew its last use (a row's `used`, a pack record's time in memory, a
///   file's mtime), and they and `sweep` decide under one lock, so a commit that reuses an
///   old chunk never loses it to a concurrent gc. Packs give swept space back when gc
///   compacts them (`compact`).
public final class ChunkStore: Sendable {
    public let directory: String
    private let dirFD: Int32
    private let cache = Locked(ChunkCache(capacityBytes: ChunkCache.defaultCapacity))
    /// Reads from disk in progress, one per chunk: a second reader of the chunk (the
    /// foreground read behind a read-ahead of it) waits for the first and takes its bytes
    /// from the cache, instead of reading and hashing the chunk again. Read-aheads lead
    /// the flights of many chunks at once (`readRuns`).
    private let flights = Locked<[ChunkID: DispatchGroup]>([:], rank: .leaf)
    /// Chunks read from disk and hashed (tests count them).
    let readsFromDisk = Atomic<Int>(0)
    /// Chunks bigger than a row: opened with the store when it may be written (a mount:
    /// what is wrong with them shows at the open). A store opened to read only (`ubiquity
    /// status`, each `ubiquity query`'s snapshot, fsck) opens them at first use: most such
    /// opens never read a chunk, and an open reads every pack's index.
    private let writablePacks: LocalPacks?
    private let readOnlyPacks = Locked<LocalPacks?>(nil)
    var packs: LocalPacks {
        if let writablePacks { return writablePacks }
        return readOnlyPacks.withLock { p in
            if let p { return p }
            let opened: LocalPacks
            do { opened = try LocalPacks(directory: directory + "/packs", readOnly: true) } catch {
                log("ubiquity: the local packs of \(directory) cannot be read: \(error)")
                opened = LocalPacks(noneAt: directory + "/packs")
            }
            p = opened
            return opened
        }
    }
    /// Whether this store has the chunk files of a format before 18 (`chunks/00` exists):
    /// only then are files looked for. `moveChunkFilesIntoPacks` removes `00` last.
    let legacyFilesFlag: Atomic<Bool>
    public var legacyFiles: Bool { legacyFilesFlag.load(ordering: .acquiring) }
    /// What a crashed process wrote may be in the page cache only (`leaveDeadProcessWritesToNextBarrier`).
    private let deadProcessWrites = Locked(false)
    private let flushCount = Locked(0)
    /// Held for a whole barrier (`sync`).
    private let barrier = Locked(())
    /// Orders "is it there? keep it" (`put`, `contains`) against gc's "unused? delete" for
    /// chunk files (rows and pack records have their own locks for it).
    let claims = Locked(())
    /// Bytes of chunks this process added to packs, less those it evicted (space pressure
    /// estimates the store's size from the last gc's measure plus these).
    private let filesPut = Locked<Int64>(0)
    public var fileBytesPut: Int64 { filesPut.withLock { $0 } }
    /// Small chunks; their `used` times are the wall clock, as the files' mtimes are.
    private let small: SmallChunks
    /// Told of each new chunk this device's writes made (`putWritten`): the sync engine
    /// uploads them while the file is still being written.
    public typealias WrittenObserver = @Sendable (ChunkID, UnsafeRawBufferPointer) -> Void
    /// Boxed: a closure kept in a generic `Locked` is wrapped in a new reabstraction
    /// thunk at every read, and chains of them cost more than the copy.
    private final class ObserverBox: Sendable {
        let call: WrittenObserver
        init(_ call: @escaping WrittenObserver) { self.call = call }
    }
    private let writtenObserver = Locked<ObserverBox?>(nil)
    /// Fetches of chunks that are not here (files on demand; ChunkFetcher).
    private let fetcher = ChunkFetcher()

    /// Where this store's files are cut into chunks (FileContent, SequentialStream).
    public let chunker: Chunker

    /// `othersMayWrite`: opened beside the process that owns the store (`LocalPacks`).
    public init(directory: String, readOnly: Bool = false, othersMayWrite: Bool = false, chunker: Chunker = .standard) throws(StoreError) {
        self.directory = directory
        self.chunker = chunker
        try StoreError.wrap { () throws(SystemError) in try makeDirectory(directory) }
        legacyFilesFlag = Atomic(access(directory + "/00", F_OK) == 0)
        small = try SmallChunks(directory: directory, readOnly: readOnly)
        writablePacks = readOnly ? nil : try LocalPacks(directory: directory + "/packs", othersMayWrite: othersMayWrite)
        dirFD = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if dirFD < 0 { throw .io(errno: errno, "open \(directory)") }
    }

    deinit {
        seal()
        close(dirFD)
    }

    /// The end of this process's writes (unmount, close): the pack being written gets its
    /// index, so the next open reads indexes only. A put after it begins a new pack.
    public func seal() {
        do { try writablePacks?.seal() } catch { log("ubiquity: sealing the local packs: \(error)") }
    }

    /// Where the chunk is kept, for messages: its pack record, its row, or its file.
    public func location(of id: ChunkID) -> String {
        if let (path, offset, length) = packs.location(of: id) { return "\(path), \(length) bytes at \(offset)" }
        return small.size(of: id) != nil ? "\(small.path), row \(id.hex)" : path(of: id)
    }

    /// The chunk file a store from before format 18 keeps the chunk in.
    public func path(of id: ChunkID) -> String {
        let hex = id.hex
        return "\(directory)/\(hex.prefix(2))/\(hex)"
    }

    /// Whether the chunk is here; if so, it is claimed (kept from gc) as `put` does.
    public func contains(_ id: ChunkID) -> Bool {
        let now = nowNanos()
        return packs.claim(id, now: now) || small.claim(id, now: now) || claimFile(id)
    }

    /// The size of the chunk as stored, nil when it is not here (not verified).
    public func size(of id: ChunkID) -> Int? {
        if let size = packs.size(of: id) ?? small.size(of: id) { return size }
        guard legacyFiles else { return nil }
        var st = stat()
        return stat(path(of: id), &st) == 0 ? Int(st.st_size) : nil
    }

    /// Disk space of the chunks that are not rows (those are in `smallChunkBytes`): the
    /// packs, and a walk of the chunk files of a store from before format 18, for gc's
    /// measure.
    public func chunkFileBytes() -> Int64 {
        var total = packs.diskBytes
        for i in 0..<256 where legacyFiles {
            let dir = directory + "/" + Hex.byte(i)
            guard let d = opendir(dir) else { continue }
            while let entry = readdir(d) {
                var st = stat()
                let found = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                    fstatat(dirfd(d), raw.baseAddress!.assumingMemoryBound(to: CChar.self), &st, AT_SYMLINK_NOFOLLOW) == 0
                }
                if found && st.st_mode & S_IFMT == S_IFREG { total = total.addingClamped(Int64(st.st_blocks).multipliedClamped(by: 512)) }
            }
            closedir(d)
        }
        return total
    }

    /// Renews the chunk file's mtime if it exists: gc keeps it (see the contract above).
    private func claimFile(_ id: ChunkID) -> Bool {
        guard legacyFiles else { return false }
        let p = path(of: id)
        return claims.withLock { _ in
            if utimensat(AT_FDCWD, p, nil, 0) == 0 { return true } // both times: now
            // A read-only store (or a chunk file another user made) cannot be touched:
            // it is there all the same.
            return errno != ENOENT && access(p, F_OK) == 0
        }
    }

    /// gc: deletes the chunk unless it was written or claimed at or after `cutoff` (or is
    /// gone). Returns the disk space freed, nil when it was kept. A chunk that is both a
    /// row and a file (a store from before format 5 that wrote it again) loses both.
    public func sweep(_ id: ChunkID, unusedSince cutoff: Nanos) -> Int64? {
        sweep([id], unusedSince: cutoff)[id]
    }

    /// `sweep` of many chunks: the small ones' rows go in one transaction.
    public func sweep(_ ids: [ChunkID], unusedSince cutoff: Nanos) -> [ChunkID: Int64] {
        var held = GraceHeld()
        return sweep(ids, unusedSince: cutoff, held: &held)
    }

    /// `sweep` that also counts in `held` the chunks it kept because they were written or
    /// claimed at or after `cutoff` (gc's report says what its grace holds back).
    public func sweep(_ ids: [ChunkID], unusedSince cutoff: Nanos, held: inout GraceHeld) -> [ChunkID: Int64] {
        var freed = small.sweep(ids, unusedSince: cutoff, held: &held)
        freed.merge(packs.sweep(ids, unusedSince: cutoff, held: &held), uniquingKeysWith: +)
        cache.withLock { c in for id in freed.keys { c.remove(id) } }
        for id in ids where legacyFiles {
            if let file = sweepFile(id, unusedSince: cutoff, held: &held) { freed[id, default: 0] += file }
        }
        return freed
    }

    /// Sets the time of the chunk's last write or claim (tests: a chunk written long ago;
    /// a file's time can be one that nanoseconds do not hold).
    func setLastUse(_ id: ChunkID, seconds: Int) throws(StoreError) {
        let (nanos, overflow) = Nanos(seconds).multipliedReportingOverflow(by: 1_000_000_000)
        if !overflow {
            try small.setUsed(id, to: nanos)
            packs.setUsed(id, to: nanos)
        }
        var times = [timespec(tv_sec: seconds, tv_nsec: 0), timespec(tv_sec: seconds, tv_nsec: 0)]
        _ = utimensat(AT_FDCWD, path(of: id), &times, 0)
    }

    /// Deletes a damaged copy of the chunk, whatever its time (repair, before it puts the
    /// good bytes: `put` keeps a copy that is there).
    public func discard(_ id: ChunkID) {
        _ = small.sweep([id], unusedSince: .max)
        packs.remove([id])
        claims.withLock { _ in _ = unlink(path(of: id)) }
        cache.withLock { $0.remove(id) }
    }

    /// A checkpoint of the small chunks' database from a connection of its own.
    func checkpoint() throws(StoreError) { try small.checkpointer.run() }

    /// Between two batches of a sweep: a save or a read of a small chunk that waits for
    /// their database's lock takes it before the next batch does (the lock is not fair).
    public func yieldToWaiters() { small.yieldToWaiters() }

    /// Waits until no reader waits for a fetch, or until `deadline`; returns whether none
    /// waits (background downloading lets readers have the network first).
    public func awaitNoReaders(until deadline: DispatchTime) -> Bool { fetcher.readers.wait(timeout: deadline) == .success }

    /// Gives what gc swept back to the filesystem (its last step): the pages of swept
    /// rows, and the packs mostly swept or evicted (their live records copied first).
    public func compact() throws(StoreError) {
        try small.compact()
        try compactPacks()
    }

    /// Gives removed records' space back: the packs that are at least half removed
    /// chunks are rewritten (all their space back, the blocks at the records' edges
    /// too), and in the others removed records' bytes become holes
    /// (`LocalPacks.punchRemoved`). Never call it under a lock: it writes and flushes.
    public func compactPacks() throws(StoreError) {
        try packs.compact(deadShare: 0.5)
        try packs.punchRemoved()
    }

    /// Group commit of small chunks (a mounted store; see `SmallChunks.startBatching`).
    func startBatching(opened: Doorbell?, committed: Doorbell?) { small.startBatching(opened: opened, committed: committed) }
    func commitSmallChunks() throws(StoreError) { try small.commitBatch() }
    /// Those of `ids` that are small chunks not committed yet, with their bytes.
    func uncommittedSmallChunks(_ ids: [ChunkID]) -> [ChunkID: [UInt8]] { small.uncommitted(ids) }
    /// Statements run on `small.sqlite` so far (the work tests).
    var smallStatements: Int { small.statements }

    /// Disk space of the small chunks' database (the files are counted by walking them).
    public var smallChunkBytes: Int64 { small.diskBytes }

    private func sweepFile(_ id: ChunkID, unusedSince cutoff: Nanos, held: inout GraceHeld) -> Int64? {
        let p = path(of: id)
        return claims.withLock { _ -> Int64? in
            var st = stat()
            guard stat(p, &st) == 0 else { return nil }
            // A file's time can be anything (a clock gone wrong, a restored backup): one
            // that does not fit in nanoseconds counts as recent, so it is kept.
            let (seconds, overflow) = Nanos(st.st_mtim.tv_sec).multipliedReportingOverflow(by: 1_000_000_000)
            let (mtime, overflow2) = seconds.addingReportingOverflow(Nanos(st.st_mtim.tv_nsec))
            let bytes = Int64(st.st_blocks).multipliedClamped(by: 512)
            guard !overflow, !overflow2, mtime < cutoff else {
                held.add(bytes: bytes, lastUse: overflow || overflow2 ? .max : mtime)
                return nil
            }
            guard unlink(p) == 0 else { return nil }
            cache.withLock { $0.remove(id) }
            return bytes
        }
    }

    /// Stores `bytes` (whose hash is `id`) unless the chunk is already there.
    public func put(_ id: ChunkID, _ bytes: UnsafeRawBufferPointer) throws(StoreError) {
        _ = try store(id, bytes)
    }

    /// `put` for a chunk of this device's own writes (not one fetched from the backing
    /// store): with `announce` (a file that syncs: not local-only), a new pack record is
    /// also shown to the observer.
    public func putWritten(_ id: ChunkID, _ bytes: UnsafeRawBufferPointer, announce: Bool) throws(StoreError) {
        guard try store(id, bytes), announce, let observer = writtenObserver.withLock({ $0 }) else { return }
        observer.call(id, bytes)
    }

    public func observeWritten(_ observer: WrittenObserver?) { writtenObserver.withLock { $0 = observer.map(ObserverBox.init) } }

    /// Stores the chunk; true if it is a new pack record. `writeback`: start writing it to
    /// disk at once: the durability barrier before records leave (`sync`) then finds
    /// little left to flush, instead of every chunk of a 1 GiB copy at once.
    private func store(_ id: ChunkID, _ bytes: UnsafeRawBufferPointer, writeback: Bool = true) throws(StoreError) -> Bool {
        // Kept as a file by an older store: claiming it is enough.
        if claimFile(id) { return false }
        if bytes.count <= SmallChunks.limit {
            try small.put(id, bytes, now: nowNanos())
            return false
        }
        guard try packs.put(id, bytes, now: nowNanos(), writeback: writeback) else { return false }
        filesPut.withLock { $0 += Int64(bytes.count) }
        return true
    }

    /// Stores the chunk as a row or a record even when a chunk file holds it (moving the
    /// files into packs).
    func storeOutsideFiles(_ id: ChunkID, _ bytes: UnsafeRawBufferPointer) throws(StoreError) {
        if bytes.count <= SmallChunks.limit {
            try small.put(id, bytes, now: nowNanos())
        } else {
            try packs.put(id, bytes, now: nowNanos(), writeback: true)
        }
    }

    /// Whether the chunk is a row or a record; if so, it is claimed at `now`.
    func claimOutsideFiles(_ id: ChunkID, now: Nanos) -> Bool {
        packs.claim(id, now: now) || small.claim(id, now: now)
    }

    public func put(_ id: ChunkID, _ bytes: [UInt8]) throws(StoreError) {
        try withBytes(bytes) { (raw) throws(StoreError) in try put(id, raw) }
    }

    /// `put` of bytes the caller has just verified against `id` (a fetch): they also go
    /// in the cache of verified chunks, so the read that asked for them does not hash
    /// them a second time (hashing is much of the daemon's CPU in a cold read of a file
    /// not here). They go to its streaming part: a reader takes what it fetched once, in
    /// order, and a long read must not fill the main part (the daemon's RSS is bounded
    /// while a big file not here is read). The new record's writeback is left to the
    /// kernel: what was fetched is a copy of bytes the backing store keeps, no barrier
    /// waits for it before a record leaves, and starting it at once would write every
    /// fetched byte in the reader's way (sync_file_range costs CPU, and the writes compete
    /// with the reads of the packs when those are on the same disk).
    public func putVerified(_ id: ChunkID, _ bytes: [UInt8]) throws(StoreError) {
        _ = try withBytes(bytes) { (raw) throws(StoreError) in try store(id, raw, writeback: false) }
        cache.withLock { $0.put(id, bytes, streaming: true) }
    }

    /// Bytes of chunks the cache holds (tests).
    var cachedBytes: Int { cache.withLock { $0.bytes } }

    /// The chunk's bytes, verified against its name. `once`: a reader that takes each
    /// chunk once, in order (an upload): a chunk read from disk goes to the cache's
    /// streaming part, not among the chunks random readers keep.
    public func read(_ id: ChunkID, once: Bool = false) throws(StoreError) -> [UInt8] {
        if let hit = cache.withLock({ $0.get(id) }) { return hit }
        guard let flight = takeOff([id])[id] else {
            flights.withLock { $0[id] }?.wait()
            // Not in the cache: the first read failed (or the cache let it go at once);
            // this one tries for itself.
            if let hit = cache.withLock({ $0.get(id) }) { return hit }
            return try readFromDisk(id, once: once)
        }
        defer { land(id, flight) }
        // A flight that landed between the look into the cache and this one's take-off
        // left its chunk there (a flight lands after its put).
        if let hit = cache.withLock({ $0.get(id) }) { return hit }
        return try readFromDisk(id, once: once)
    }

    /// Opens a flight for each of `ids` that no read from disk is under way for; the
    /// caller reads those and ends each flight with `land`.
    private func takeOff(_ ids: [ChunkID]) -> [ChunkID: DispatchGroup] {
        flights.withLock { f in
            var led: [ChunkID: DispatchGroup] = [:]
            for id in ids where f[id] == nil && led[id] == nil {
                let flight = DispatchGroup()
                flight.enter()
                f[id] = flight
                led[id] = flight
            }
            return led
        }
    }

    private func land(_ id: ChunkID, _ flight: DispatchGroup) {
        flights.withLock { _ = $0.removeValue(forKey: id) }
        flight.leave()
    }

    /// Reads into the cache those of `ids` that are here and neither cached nor being
    /// read: one `preadv` per run of neighbours in a pack, each chunk hashed once, a flight
    /// per chunk so that a reader of one waits for it. `background` (a read-ahead): a job
    /// per run (the runs hash in parallel), its chunks into the cache's streaming part;
    /// else all on the calling thread. Failures are left for the reader to meet (`read`).
    private func readRuns(_ ids: [ChunkID], background: Bool) {
        let uncached = cache.withLock { c in ids.filter { !c.contains($0) } }
        guard !uncached.isEmpty else { return } // a warm read: no flights to look at
        var taken = takeOff(uncached)
        // Chunks whose flights landed since the look into the cache are there now.
        for (id, flight) in taken where cache.withLock({ $0.contains(id) }) {
            taken[id] = nil
            land(id, flight)
        }
        let led = taken
        guard !led.isEmpty else { return }
        let runs = packs.runs(of: Array(led.keys))
        var inRuns = Set<ChunkID>()
        for run in runs {
            inRuns.formUnion(run.ids)
            let work: @Sendable () -> Void = { [self] in load(run, led, streaming: background) }
            if background { DispatchQueue.global(qos: .utility).async(execute: work) } else { work() }
        }
        // Rows and old chunk files: one by one.
        for (id, flight) in led where !inRuns.contains(id) {
            let work: @Sendable () -> Void = { [self] in
                _ = try? readFromDisk(id, once: background)
                land(id, flight)
            }
            if background { DispatchQueue.global(qos: .utility).async(execute: work) } else { work() }
        }
    }

    /// The run's chunks into the cache, each flight ended as soon as its chunk is there.
    /// A record that does not verify (or that the read did not reach) is read again alone,
    /// which finds a repaired copy or logs the damage.
    private func load(_ run: LocalPacks.Run, _ led: [ChunkID: DispatchGroup], streaming: Bool) {
        let records = try? packs.read(run)
        for (k, id) in run.ids.enumerated() {
            if let bytes = records?[k], bytes.count == run.lengths[k], ChunkID(hashing: bytes) == id {
                readsFromDisk.add(1, ordering: .relaxed)
                cache.withLock { $0.put(id, bytes, streaming: streaming) }
            } else {
                _ = try? readFromDisk(id, once: streaming)
            }
            land(id, led[id]!)
        }
    }

    /// Reads and verifies `wants` (here, or fetched when not), those that lie together in
    /// a pack with one read each run.
    public func read(_ wants: [ChunkWant]) throws(StoreError) {
        readRuns(wants.map(\.id), background: false)
        for want in wants { _ = try read(want.id, size: want.size) }
    }

    /// `read` of a chunk not in the cache: read, hashed, then cached.
    private func readFromDisk(_ id: ChunkID, once: Bool = false) throws(StoreError) -> [UInt8] {
        readsFromDisk.add(1, ordering: .relaxed)
        var bytes = try readUnverified(id)
        var good = ChunkID(hashing: bytes) == id
        // Evicted while it was read, its bytes punched (`LocalPacks.punchRemoved`): read
        // again, which finds it elsewhere or says it is missing (a reader then fetches it).
        if !good, !packs.contains(id) {
            bytes = try readUnverified(id)
            good = ChunkID(hashing: bytes) == id
        }
        // A good copy may have come since, in a pack of another process's
        // (`ubiquity fsck --repair` while mounted).
        if !good, packs.contains(id), (try? packs.adoptSealedPacks()) ?? 0 > 0 {
            bytes = try readUnverified(id)
            good = ChunkID(hashing: bytes) == id
        }
        guard good else {
            log("ubiquity: chunk \(id) is corrupt: content hash mismatch (\(location(of: id))); run `ubiquity fsck`")
            throw .corruptChunk(id)
        }
        cache.withLock { $0.put(id, bytes, streaming: once) }
        return bytes
    }

    /// The list of `bytes` as one chunk (at most `maxChunkSize`; none when empty): inline
    /// when it is small enough, else stored here.
    public func listOfOneChunk(_ bytes: [UInt8]) throws(StoreError) -> ChunkList {
        precondition(bytes.count <= Self.maxChunkSize)
        var list = ChunkList()
        guard !bytes.isEmpty else { return list }
        try withBytes(bytes) { (raw) throws(StoreError) in
            try list.append(raw) { (id, chunk) throws(StoreError) in try put(id, chunk) }
        }
        return list
    }

    /// The bytes of piece `i` of `list` (not a hole), verified: from the list when it
    /// keeps them inline, else from this store; when not here, fetched (`fetching`) or
    /// `missingChunk` (a reader under the filesystem's lock). Every reader of a piece's
    /// bytes comes here.
    public func read(piece i: Int, of list: ChunkList, fetching: Bool = true) throws(StoreError) -> [UInt8] {
        if let bytes = list.inline[list.ids[i]] {
            guard Int64(bytes.count) == list.size(i) else { throw .corruptChunk(list.ids[i]) }
            return bytes
        }
        let bytes = fetching ? try read(list.ids[i], size: Int(list.size(i))) : try read(list.ids[i])
        guard Int64(bytes.count) == list.size(i) else { throw .corruptChunk(list.ids[i]) }
        return bytes
    }

    /// The whole content of a small list (holes as zeros), verified, never fetched (its
    /// callers hold the filesystem's lock: `missingChunk` instead). Lists larger than
    /// `limit` are refused: callers use this for small files only (TinyPix pictures).
    public func bytes(of list: ChunkList, limit: Int) throws(StoreError) -> [UInt8] {
        guard list.totalSize <= Int64(limit) else { throw .io(errno: EFBIG, "content of \(list.totalSize) bytes read whole") }
        var out: [UInt8] = []
        for i in 0..<list.count {
            if list.isHole(i) { out += [UInt8](repeating: 0, count: Int(list.size(i))); continue }
            out += try read(piece: i, of: list, fetching: false)
        }
        return out
    }

    /// Reads and verifies `wants` into the cache in the background. The kernel reads ahead
    /// only 128 KiB at a time, so a sequential reader otherwise waits for each chunk's
    /// disk read and hash in turn; this overlaps them with serving the current request.
    /// Chunks that are not here are fetched (no wait), once they come to `fetchAtLeast`
    /// bytes not already coming.
    public func prefetch(_ wants: [ChunkWant], fetchAtLeast: Int = 0) {
        // Chunks that are coming already need nothing (nor a look at the disk).
        let uncached = cache.withLock { c in wants.filter { !c.contains($0.id) } }
        guard !uncached.isEmpty else { return }
        let coming = fetcher.inFlight(uncached.map(\.id))
        var local: [ChunkID] = [], remote: [ChunkWant] = []
        for want in uncached where !coming.contains(want.id) {
            if isLocal(want) { local.append(want.id) } else { remote.append(want) }
        }
        readRuns(local, background: true)
        if !remote.isEmpty && fetcher.hasSource { try? fetcher.fetch(remote, into: self, waiting: 0, atLeast: fetchAtLeast) }
    }

    // MARK: files on demand

    /// Whether the chunk is here (not claimed, not verified).
    public func isLocal(_ id: ChunkID) -> Bool { size(of: id) != nil }

    /// `isLocal` for a chunk of a known size: one bigger than a row can hold is only ever
    /// a file, so the rows are not asked (a sequential reader asks this of every chunk of
    /// its read-ahead window at every request).
    private func isLocal(_ want: ChunkWant) -> Bool {
        guard want.size > SmallChunks.limit else { return isLocal(want.id) }
        if packs.contains(want.id) { return true }
        guard legacyFiles else { return false }
        var st = stat()
        return stat(path(of: want.id), &st) == 0
    }

    /// Those of `wants` that are neither verified in memory nor stored here, in order.
    /// The cache is asked once for the batch, and a chunk a flight is fetching is not
    /// looked for on disk (a stat and a SQLite query per chunk of the window at every
    /// request of a sequential reader would weigh on a cold read).
    private func notHere(_ wants: [ChunkWant]) -> [ChunkWant] {
        let uncached = cache.withLock { c in wants.filter { !c.contains($0.id) } }
        if uncached.isEmpty { return [] }
        let coming = fetcher.inFlight(uncached.map(\.id))
        return uncached.filter { coming.contains($0.id) || !isLocal($0) }
    }

    /// The chunk's bytes, verified; fetched from the source when it is not here (waiting
    /// up to the fetch timeout). Never call it under the filesystem's lock (refused).
    public func read(_ id: ChunkID, size: Int, once: Bool = false) throws(StoreError) -> [UInt8] {
        do { return try read(id, once: once) } catch {
            guard case .missingChunk = error, fetcher.hasSource else { throw error }
        }
        try fetcher.fetch([ChunkWant(id: id, size: size)], into: self, waiting: 1)
        return try read(id, once: once)
    }

    /// Makes the chunks local: those that are not are fetched, in one batch (neighbours in
    /// a pack come in one request), and waited for. Without a source, a missing chunk is
    /// `.missingChunk`. `ahead`: chunks a sequential reader wants next, fetched in the
    /// same batch when one is fetched anyway (not waited for).
    public func ensureLocal(_ wants: [ChunkWant], ahead: [ChunkWant] = []) throws(StoreError) {
        let missing = notHere(wants)
        guard let first = missing.first else { return }
        guard fetcher.hasSource else { throw .missingChunk(first.id) }
        try fetcher.fetch(missing + notHere(ahead), into: self, waiting: missing.count)
    }

    /// Deletes the local copies of chunks that are safe in the backing store (`ubiquity
    /// evict`, the cache limit; the caller checked their packs and passes only chunks
    /// bigger than records carry): pack records, rows of `small.sqlite` (1-2 KiB: a
    /// container of small files would otherwise hold its whole content here) and old
    /// chunk files. Returns the space freed: a row's, as SQLite counts it (its pages are
    /// reused, and given back by gc); a record's, which `compactPacks` gives back (the
    /// caller runs it outside its locks). A commit that
    /// reuses one of them meanwhile names it by its place: it is fetched when read.
    public func evict(_ ids: [ChunkID]) -> Int64 {
        let rows = small.sweep(ids, unusedSince: .max)
        let records = packs.remove(ids)
        var freed = rows.values.reduce(0, +) + records, filesFreed: Int64 = 0
        for id in ids {
            cache.withLock { $0.remove(id) }
            if rows[id] != nil || !legacyFiles { continue }
            let p = path(of: id)
            claims.withLock { _ in
                var st = stat()
                guard stat(p, &st) == 0, unlink(p) == 0 else { return }
                filesFreed += Int64(st.st_blocks) * 512
            }
        }
        freed += filesFreed
        filesPut.withLock { $0 -= records + filesFreed }
        return freed
    }

    /// Fetches the chunks for background downloading: waits for them, as a reader does.
    public func download(_ wants: [ChunkWant]) throws(StoreError) { try ensureLocal(wants) }

    /// Where chunks that are not here come from (nil: nowhere; a missing chunk is an error).
    public func setSource(_ source: (any ChunkSource)?) { fetcher.setSource(source) }
    /// How long a reader waits for a fetch before it fails with EIO (default 30 s).
    public func setFetchTimeout(seconds: Double) { fetcher.setTimeout(seconds: seconds) }
    /// A fetch asked for while `held()` is true (the filesystem's lock is held by this
    /// thread) is refused and counted: nothing network-bound runs under it.
    public func refuseFetches(when held: (@Sendable () -> Bool)?) { fetcher.refuseFetches(when: held) }
    /// Counts of fetches (tests, status).
    public var fetchStatistics: (chunks: Int, bytes: Int64, failed: Int, refusedUnderLock: Int, readersWaiting: Int, lastFailure: String?) {
        let s = fetcher.statistics
        return (s.fetchedChunks, s.fetchedBytes, s.failedFetches, s.refusedUnderLock, s.waiting, s.lastFailure)
    }

    /// The largest chunk a store holds: the chunker cuts at most 256 KiB, other devices'
    /// records may name chunks up to this size (docs/FORMAT.md).
    public static let maxChunkSize = 4 << 20

    /// The raw file content, for fsck and repair; not verified. A file larger than any
    /// chunk can be is damage: it is reported as corrupt, not loaded.
    public func readUnverified(_ id: ChunkID) throws(StoreError) -> [UInt8] {
        if let record = try packs.readUnverified(id) { return record }
        if let row = try small.get(id) { return row }
        guard legacyFiles else { throw .missingChunk(id) }
        let bytes: [UInt8]?
        do throws(SystemError) {
            bytes = try readFile(path(of: id), limit: Self.maxChunkSize)
        } catch {
            throw error.code == EFBIG ? .corruptChunk(id) : .io(errno: error.code, error.context)
        }
        guard let bytes else { throw .missingChunk(id) }
        return bytes
    }

    /// Every chunk id present (for fsck and gc); one kept in two ways (a row or a record,
    /// and a file) is listed twice.
    public func allChunkIDs() -> [ChunkID] {
        var ids = small.ids() + packs.ids()
        for i in 0..<256 where legacyFiles {
            guard let dir = opendir(directory + "/" + Hex.byte(i)) else { continue }
            while let entry = readdir(dir) {
                let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                    String(decoding: raw.prefix(while: { $0 != 0 }), as: UTF8.self)
                }
                if let id = ChunkID(hex: name) { ids.append(id) }
            }
            closedir(dir)
        }
        return ids
    }

    /// Durability barrier: every chunk written so far reaches the disk before this returns
    /// (the small chunks' WAL, the packs written since the last barrier).
    ///
    /// Barriers run one at a time (fsync, the periodic one, the one before an upload): a
    /// second one that found the pending set empty while the first was still flushing
    /// it would return at once and let its caller mark versions durable too early.
    public func sync() throws(StoreError) {
        try barrier.withLock { (_: inout ()) throws(StoreError) in try syncPending() }
    }

    private func syncPending() throws(StoreError) {
        let everything = deadProcessWrites.withLock { left in defer { left = false }; return left }
        do throws(StoreError) {
            try small.sync(all: everything)
            try packs.sync()
            if everything { try flushWholeStore() }
        } catch {
            // Not durable yet: the next barrier must try again.
            if everything { deadProcessWrites.withLock { $0 = true } }
            throw error
        }
    }

    /// After a crash of the process only (the machine kept running, and its page cache
    /// with what the dead process wrote): the next barrier flushes the whole store, as
    /// `syncEverything` would now, so the open need not wait for that flush.
    func leaveDeadProcessWritesToNextBarrier() {
        deadProcessWrites.withLock { $0 = true }
    }

    /// Durability barrier for every chunk in the store, whoever wrote it: after a crash,
    /// what the dead process wrote is made durable before its versions are (recovery).
    func syncEverything() throws(StoreError) {
        try small.sync(all: true)
        try packs.sync()
        try flushWholeStore()
    }

    /// One syncfs of the filesystem the store is on.
    private func flushWholeStore() throws(StoreError) {
        try StoreError.wrap { () throws(SystemError) in try syncFilesystem(dirFD, path: directory) }
        flushCount.withLock { $0 += 1 }
    }

    /// How many times the whole store was flushed (tests).
    var wholeStoreFlushes: Int { flushCount.withLock { $0 } }

    public func dropCache() { cache.withLock { $0.removeAll() } }
}

/// Verified chunks kept in memory, so a sequential read hashes each chunk once and
/// small random reads do not re-hash a whole chunk each time. Chunks read once, in order
/// (read ahead for a sequential reader, or read for an upload), go to a small part of
/// their own (`streaming`): nobody asks for them again soon (the kernel's page cache keeps
/// what a reader read), so a long read or upload neither holds more than that part nor
/// pushes out the chunks of random readers.
struct ChunkCache {
    private var main: Generations
    private var streaming: Generations

    init(capacityBytes: Int, streamingBytes: Int = 32 << 20) {
        main = Generations(capacityBytes: capacityBytes)
        streaming = Generations(capacityBytes: streamingBytes)
    }

    /// A sixty-fourth of the machine's memory, at least 64 MiB and at most 512 MiB (384
    /// MiB on a 24 GiB machine): a file read at random then hashes each chunk once, not
    /// once per read (a 128 MiB file read in 4 KiB pieces against a 64 MiB cache hashes
    /// 64 KiB for half of its reads).
    static var defaultCapacity: Int {
        let pages = sysconf(Int32(_SC_PHYS_PAGES)), size = sysconf(Int32(_SC_PAGESIZE))
        guard pages > 0, size > 0 else { return 64 << 20 }
        let (total, overflow) = pages.multipliedReportingOverflow(by: size)
        return overflow ? 512 << 20 : min(max(total / 64, 64 << 20), 512 << 20)
    }

    func contains(_ id: ChunkID) -> Bool { main.contains(id) || streaming.contains(id) }

    var bytes: Int { main.bytes + streaming.bytes }

    mutating func get(_ id: ChunkID) -> [UInt8]? { main.get(id) ?? streaming.get(id) }

    mutating func put(_ id: ChunkID, _ value: [UInt8], streaming toStreaming: Bool = false) {
        if toStreaming { streaming.put(id, value) } else { main.put(id, value) }
    }

    mutating func remove(_ id: ChunkID) {
        main.remove(id)
        streaming.remove(id)
    }

    mutating func removeAll() {
        main.removeAll()
        streaming.removeAll()
    }

    /// Two generations give an approximate LRU in O(1): new entries go to `young`; when it
    /// holds half the budget it becomes `old` (dropping the previous old generation); a
    /// hit in `old` moves up.
    struct Generations {
        let capacityBytes: Int
        private var young: [ChunkID: [UInt8]] = [:]
        private var old: [ChunkID: [UInt8]] = [:]
        private var youngBytes = 0
        private var oldBytes = 0

        init(capacityBytes: Int) { self.capacityBytes = capacityBytes }

        var bytes: Int { youngBytes + oldBytes }

        func contains(_ id: ChunkID) -> Bool { young[id] != nil || old[id] != nil }

        mutating func get(_ id: ChunkID) -> [UInt8]? {
            if let hit = young[id] { return hit }
            guard let hit = old.removeValue(forKey: id) else { return nil }
            oldBytes -= hit.count
            put(id, hit)
            return hit
        }

        mutating func put(_ id: ChunkID, _ value: [UInt8]) {
            guard young[id] == nil else { return }
            if youngBytes + value.count > capacityBytes / 2 {
                old = young
                oldBytes = youngBytes
                young = [:]
                youngBytes = 0
            }
            young[id] = value
            youngBytes += value.count
        }

        mutating func remove(_ id: ChunkID) {
            if let v = young.removeValue(forKey: id) { youngBytes -= v.count }
            if let v = old.removeValue(forKey: id) { oldBytes -= v.count }
        }

        mutating func removeAll() { young = [:]; old = [:]; youngBytes = 0; oldBytes = 0 }
    }
}

/// `withUnsafeBytes` for typed throws (the standard one rethrows `any Error`).
func withBytes<R>(_ bytes: [UInt8], _ body: (UnsafeRawBufferPointer) throws(StoreError) -> R) throws(StoreError) -> R {
    var result: Result<R, StoreError>!
    bytes.withUnsafeBytes { raw in
        do throws(StoreError) { result = .success(try body(raw)) } catch { result = .failure(error) }
    }
    return try result.get()
}

/// Chunks a sweep kept although no version names them, because they were written or
/// claimed within gc's grace (a save in progress may be about to name them).
public struct GraceHeld: Sendable, Equatable {
    public var chunks = 0
    public var bytes: Int64 = 0
    /// The latest write or claim among them: a gc with the same grace after this time
    /// plus the grace frees them all (unless they are used again).
    public var lastUse: Nanos = 0

    public init() {}

    mutating func add(bytes: Int64, lastUse: Nanos) {
        chunks += 1
        self.bytes = self.bytes.addingClamped(max(bytes, 0))
        self.lastUse = max(self.lastUse, lastUse)
    }
}
