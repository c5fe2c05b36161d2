import Glibc
import Synchronization
import UbiquitySystem

/// Chunks in local append-only pack files: how `ChunkStore` keeps chunks bigger than a
/// small chunk's row, without a file each (`LocalPacksModelTests` holds it against a
/// model, with crashes and torn tails).
///
/// On disk (`directory`, docs/FORMAT.md "Local packs"):
/// - `NNNNNNNN.pack`: a 16-byte header, then records appended one after another, each a
///   48-byte header (magic, length, chunk id, a check of those) and the chunk's bytes.
/// - `NNNNNNNN.idx`: a sealed pack's index (every record's id, offset and length), written
///   once the pack is full and flushed, so an open reads indexes, not every header. A
///   pack without one (the one being written, or one a crash caught before its index) is
///   scanned at open, its records' bytes hashed; nothing is appended to it after an open.
///
/// In memory, an index from chunk to (pack, offset, length, last use); lookups never touch
/// the disk. Descriptors stay open; a pack is closed when the last reader holding it is done.
///
/// gc's rule is the chunk files' (see `ChunkStore`): `put` and `claim` of a chunk that is
/// here renew its last use, and `sweep` removes only a chunk unused since its cutoff, both
/// under the index's lock. Last uses are kept in memory only: an open gives each chunk
/// its pack's mtime (when it was last appended to).
///
/// Locks: appends take `appending` (one writer at a time, the write itself inside it: a
/// record half written must never have a record after it, else a scan at open would stop
/// at the gap and lose what follows); the index and the pack table take `state`, briefly,
/// never around I/O. Flushes (`sync`) run outside both.
public final class LocalPacks: Sendable {
    /// Where a chunk's bytes are: the pack, the offset of its bytes (after the record's
    /// header) and their length; and when it was last written or claimed.
    struct Place {
        let pack: UInt32
        let offset: Int64
        let length: Int
        var used: Nanos
    }

    /// One pack file, kept open while anything holds it.
    final class Pack: Sendable {
        let number: UInt32
        let fd: Int32
        let path: String
        init(number: UInt32, fd: Int32, path: String) {
            self.number = number
            self.fd = fd
            self.path = path
        }
        deinit { close(fd) }
    }

    private struct PackState {
        let pack: Pack
        /// Its bytes: where the next record goes while it is the active pack; after an open,
        /// the file's length (what is not a record there counts as dead).
        var size: Int64
        var liveBytes: Int64 = 0
        var deadBytes: Int64 = 0
        /// Its size when it was last flushed (`sync` skips a pack with nothing new).
        var flushed: Int64 = 0
        /// Where the bytes begin whose writeback no append has started yet.
        var writebackFrom: Int64 = 0
        /// Full (or cut short by a failure) and not appended to again; `sealed` once its
        /// bytes are flushed and its index written.
        var full = false
        var sealed = false
        /// Without its header (made, and a crash came first): nothing in it, to delete.
        var headerless = false
        /// Found without its index while another process may be writing it
        /// (`othersMayWrite`): read, never flushed, indexed or compacted here.
        var foreign = false
        /// The chunks written here, in the order they lie (removed ones too: the index
        /// says which still live here), so a pack's work costs its own records.
        var records: [ChunkID] = []
        /// The bytes of records removed since the last `punchRemoved`, to become holes.
        var toPunch: [Range<Int64>] = []
        /// Bytes made holes by this process (the file's length and `deadBytes` still count
        /// them).
        var punched: Int64 = 0
    }

    /// A pack's chunks that still live there, with their places, in the order they lie.
    private static func live(in number: UInt32, _ s: State) -> [(ChunkID, Place)] {
        guard let pack = s.packs[number] else { return [] }
        var seen: Set<ChunkID> = []
        return pack.records.compactMap { id in
            guard let place = s.index[id], place.pack == number, seen.insert(id).inserted else { return nil }
            return (id, place)
        }
    }

    private struct State {
        var index: [ChunkID: Place] = [:]
        var packs: [UInt32: PackState] = [:]
        var active: UInt32 = 0
        var nextNumber: UInt32 = 1
        /// A pack was made or deleted, or an index written, since the directory's last
        /// fsync.
        var directoryChanged = false
    }

    public let directory: String
    /// A pack takes records until it holds this many bytes (one record may pass it).
    public let packLimit: Int64
    /// Opened to read only (fsck, status): nothing is made, written or deleted.
    public let readOnly: Bool
    private let state = Locked(State(), rank: .leaf)
    /// Reads of records from disk, one per `preadv` or `pread` (tests count them).
    let diskReads = Atomic<Int>(0)
    /// Writebacks started by appends, one sync_file_range each, and their bytes (tests
    /// count them).
    let writebacksStarted = Atomic<Int>(0)
    let writebackBytes = Atomic<Int64>(0)
    private let appending = Locked((), rank: .packAppend)
    /// Held by a compaction or a punch: one at a time, so neither rewrites the index of a
    /// pack the other is deleting.
    private let upkeep = Locked((), rank: .packUpkeep)

    static let fileHeader: [UInt8] = Array("UBQLPCK1".utf8) + [UInt8](repeating: 0, count: 8)
    static let recordHeaderSize = 48
    static let recordMagic: [UInt8] = Array("UPUR".utf8)
    static let indexMagic: [UInt8] = Array("UBQLIDX1".utf8)
    /// The longest record a scan or an index accepts (a chunk is at most 256 KiB; this
    /// bounds what a damaged length can make a reader allocate).
    static let maxChunkLength = 16 << 20

    /// `now`: the latest last use a chunk found here gets (its pack's mtime if earlier).
    /// `othersMayWrite`: opened beside the
    /// process that owns the store (`ubiquity fsck --repair` while mounted): a pack found
    /// without its index may be that process's, still being written, and is left to it.
    public init(directory: String, packLimit: Int64 = 64 << 20, readOnly: Bool = false, othersMayWrite: Bool = false,
                now: Nanos = nowNanos()) throws(StoreError) {
        self.directory = directory
        self.packLimit = max(Int64(Self.fileHeader.count + Self.recordHeaderSize + 1), packLimit)
        self.readOnly = readOnly
        if readOnly && access(directory, F_OK) != 0 { return }
        if !readOnly && mkdir(directory, 0o700) != 0 && errno != EEXIST { throw StoreError.io(errno: errno, "create \(directory)") }
        var loaded = try Self.load(directory, readOnly: readOnly, removeTemporaries: !readOnly && !othersMayWrite, now: now)
        if othersMayWrite { for (number, pack) in loaded.packs where !pack.sealed { loaded.packs[number]!.foreign = true } }
        state.withLock { $0 = loaded }
    }

    /// Packs that hold nothing and take nothing: what a store opened to read only uses
    /// when its packs cannot be read (the error was logged).
    init(noneAt directory: String) {
        self.directory = directory
        packLimit = 64 << 20
        readOnly = true
    }

    // MARK: reads

    public func contains(_ id: ChunkID) -> Bool { state.withLock { $0.index[id] != nil } }

    public var count: Int { state.withLock { $0.index.count } }

    /// The chunk's length, nil when it is not here.
    public func size(of id: ChunkID) -> Int? { state.withLock { $0.index[id]?.length } }

    /// Every chunk here.
    public func ids() -> [ChunkID] { state.withLock { Array($0.index.keys) } }

    /// Where the chunk's bytes are, for messages and tests: the pack's path and the offset
    /// and length of its bytes there.
    public func location(of id: ChunkID) -> (path: String, offset: Int64, length: Int)? {
        state.withLock { s in
            guard let place = s.index[id], let pack = s.packs[place.pack] else { return nil }
            return (pack.pack.path, place.offset, place.length)
        }
    }

    /// The chunk's bytes, verified against its id; nil when it is not here. A record whose
    /// bytes do not hash to the id throws `.corruptChunk` (never wrong bytes).
    public func read(_ id: ChunkID) throws(StoreError) -> [UInt8]? {
        guard let (bytes, place) = try readRecord(id) else { return nil }
        guard ChunkID(hashing: bytes) != id else { return bytes }
        // Removed while it was read, and its bytes punched (`punchRemoved`): as a read
        // after the removal, from where the index says it is now, if anywhere.
        guard let now = state.withLock({ $0.index[id] }), now.pack == place.pack, now.offset == place.offset else {
            guard let (again, _) = try readRecord(id) else { return nil }
            guard ChunkID(hashing: again) == id else { throw .corruptChunk(id) }
            return again
        }
        throw .corruptChunk(id)
    }

    /// The record's bytes as stored (fsck), nil when the chunk is not here; a record cut
    /// short is `.corruptChunk`.
    public func readUnverified(_ id: ChunkID) throws(StoreError) -> [UInt8]? { try readRecord(id)?.bytes }

    private func readRecord(_ id: ChunkID) throws(StoreError) -> (bytes: [UInt8], place: Place)? {
        guard let (place, pack) = state.withLock({ s -> (Place, Pack)? in
            guard let place = s.index[id], let pack = s.packs[place.pack]?.pack else { return nil }
            return (place, pack)
        }) else { return nil }
        diskReads.add(1, ordering: .relaxed)
        let bytes = try StoreError.wrap { () throws(SystemError) in
            try readBytes(pack.fd, count: place.length, at: place.offset, path: pack.path)
        }
        guard bytes.count == place.length else { throw .corruptChunk(id) }
        return (bytes, place)
    }

    /// Records that lie back to back in one pack (each one's bytes, then the next one's
    /// header), to be read with one `preadv`.
    public struct Run: Sendable {
        fileprivate let pack: Pack
        /// Where the first record's bytes start.
        fileprivate let offset: Int64
        public let ids: [ChunkID]
        public let lengths: [Int]
    }

    /// The chunks of `ids` that are here, as runs of neighbours in file order, each at most
    /// `maxBytes` (one record may pass it) and `maxRecords`; the ids not here are left out.
    public func runs(of ids: [ChunkID], maxBytes: Int = 1 << 20, maxRecords: Int = 64) -> [Run] {
        let found = state.withLock { s in
            ids.compactMap { id -> (ChunkID, Place, Pack)? in
                guard let place = s.index[id], let pack = s.packs[place.pack]?.pack else { return nil }
                return (id, place, pack)
            }
        }.sorted { ($0.1.pack, $0.1.offset) < ($1.1.pack, $1.1.offset) }
        var runs: [Run] = []
        var i = 0
        while i < found.count {
            let (firstID, first, pack) = found[i]
            var ids = [firstID], lengths = [first.length]
            var end = first.offset + Int64(first.length), bytes = first.length
            i += 1
            while i < found.count, found[i].1.pack == first.pack, found[i].1.offset == end + Int64(Self.recordHeaderSize),
                  bytes < maxBytes, ids.count < maxRecords {
                ids.append(found[i].0)
                lengths.append(found[i].1.length)
                end = found[i].1.offset + Int64(found[i].1.length)
                bytes += Self.recordHeaderSize + found[i].1.length
                i += 1
            }
            runs.append(Run(pack: pack, offset: first.offset, ids: ids, lengths: lengths))
        }
        return runs
    }

    /// The run's records as stored, not verified, in its order: one `preadv` straight into
    /// each chunk's own array (the headers between them go to a scratch buffer). A record
    /// the file ends before comes back short (the caller's length check catches it).
    public func read(_ run: Run) throws(StoreError) -> [[UInt8]] {
        diskReads.add(1, ordering: .relaxed)
        var header = [UInt8](repeating: 0, count: Self.recordHeaderSize)
        var failure: SystemError?
        var out: [[UInt8]] = []
        out.reserveCapacity(run.ids.count)
        header.withUnsafeMutableBytes { scratch in
            var iov: [iovec] = []
            iov.reserveCapacity(2 * run.ids.count)
            var got = 0
            // Each array is made inside the closure of the one before, so that all of them
            // exist, uninitialized, when the one read fills them; each then counts as
            // initialized what the read reached of it.
            // `start`: where record k's bytes begin, counted from the run's offset.
            func allocate(_ k: Int, _ start: Int) {
                guard k < run.lengths.count else {
                    do throws(SystemError) { got = try readFully(run.pack.fd, iov, at: run.offset, path: run.pack.path) } catch {
                        failure = error
                    }
                    return
                }
                let bytes = [UInt8](unsafeUninitializedCapacity: run.lengths[k]) { buffer, initialized in
                    if k > 0 { iov.append(iovec(iov_base: scratch.baseAddress, iov_len: Self.recordHeaderSize)) }
                    iov.append(iovec(iov_base: UnsafeMutableRawPointer(buffer.baseAddress), iov_len: run.lengths[k]))
                    allocate(k + 1, start + run.lengths[k] + Self.recordHeaderSize)
                    initialized = failure == nil ? min(max(got - start, 0), run.lengths[k]) : 0
                }
                out.append(bytes)
            }
            allocate(0, 0)
        }
        if let failure { throw .io(errno: failure.code, failure.context) }
        return out.reversed()
    }

    // MARK: writes

    /// Appends the chunk unless it is here already (then it is claimed). Durable after the
    /// next `sync`. Returns whether it was appended. `writeback`: start writing the record
    /// to disk at once, so that the barrier before a record leaves finds little to flush.
    @discardableResult
    public func put(_ id: ChunkID, _ bytes: UnsafeRawBufferPointer, now: Nanos = nowNanos(), writeback: Bool = false) throws(StoreError) -> Bool {
        guard !readOnly else { throw .io(errno: EROFS, "\(directory) is open to read only") }
        guard bytes.count <= Self.maxChunkLength else { throw .invalidContent("a chunk of \(bytes.count) bytes is longer than a pack record may be") }
        return try appending.withLock { (_: inout Void) throws(StoreError) -> Bool in
            if claim(id, now: now) { return false }
            try append(id, bytes, used: now, writeback: writeback)
            return true
        }
    }

    @discardableResult
    public func put(_ id: ChunkID, _ bytes: [UInt8], now: Nanos = nowNanos()) throws(StoreError) -> Bool {
        try withBytes(bytes) { (raw) throws(StoreError) in try put(id, raw, now: now) }
    }

    /// Whether the chunk is here; if so, its last use becomes `now` (gc keeps it).
    public func claim(_ id: ChunkID, now: Nanos = nowNanos()) -> Bool {
        state.withLock { s in
            guard s.index[id] != nil else { return false }
            s.index[id]!.used = max(s.index[id]!.used, now)
            return true
        }
    }

    /// Sets the chunk's last use (tests: a chunk written long ago).
    func setUsed(_ id: ChunkID, to time: Nanos) {
        state.withLock { s in if s.index[id] != nil { s.index[id]!.used = time } }
    }

    /// Under `appending`: the record goes at the active pack's end, then into the index.
    /// `moving`: a compaction's copy out of that pack, which the index takes only if the
    /// chunk still lives there (one removed meanwhile stays removed; its copy is dead).
    private func append(_ id: ChunkID, _ bytes: UnsafeRawBufferPointer, used: Nanos, writeback: Bool = false,
                        moving from: UInt32? = nil) throws(StoreError) {
        try startPackIfNeeded()
        let (pack, at) = state.withLock { s in (s.packs[s.active]!.pack, s.packs[s.active]!.size) }
        let header = Self.recordHeader(id, length: bytes.count)
        let written = Int64(header.count + bytes.count)
        do {
            try withBytes(header) { (head) throws(StoreError) in
                try StoreError.wrap { () throws(SystemError) in try writeAll(pack.fd, head, bytes, at: at, path: pack.path) }
            }
            startWritebackIfDue(pack, record: at..<(at + written), writeback: writeback)
        } catch {
            // What the failed write left is not a record: the pack is cut back to its last
            // record and takes the next append there. If it cannot be cut, nothing is
            // appended after it (a scan would stop there): the next append starts a new
            // pack. (Starting one after every failure would leave a pack per retry on a
            // full disk.)
            if ftruncate(pack.fd, off_t(at)) != 0 { state.withLock { $0.packs[pack.number]?.full = true } }
            throw error
        }
        state.withLock { s in
            s.packs[pack.number]!.size = at + written
            s.packs[pack.number]!.records.append(id)
            if let from, s.index[id]?.pack != from {
                s.packs[pack.number]!.deadBytes += written
            } else {
                s.packs[pack.number]!.liveBytes += written
                if let old = s.index[id], old.pack != pack.number {
                    let oldBytes = Int64(Self.recordHeaderSize + old.length)
                    s.packs[old.pack]?.liveBytes -= oldBytes
                    s.packs[old.pack]?.deadBytes += oldBytes
                }
                s.index[id] = Place(pack: pack.number, offset: at + Int64(Self.recordHeaderSize), length: bytes.count,
                                    used: max(used, s.index[id]?.used ?? used))
            }
            if s.packs[pack.number]!.size >= packLimit { s.packs[pack.number]!.full = true }
        }
    }

    /// Writeback of a pack's new records is started a batch at a time: the barrier before
    /// a record leaves then finds at most this much of the pack left to flush, and a burst
    /// of small files pays one sync_file_range per batch, not one per file (2 % of the
    /// daemon's CPU in an `rsync -a` of small files, and a small write to the disk each).
    static let writebackBatch: Int64 = 1 << 20

    /// Under `appending`, after `record` was written to `pack`: starts writeback up to its
    /// end once a batch waits. A record without writeback (a fetched chunk) is passed
    /// over: what waits before it starts now, so the batch never takes it in.
    private func startWritebackIfDue(_ pack: Pack, record: Range<Int64>, writeback: Bool) {
        let range = state.withLock { s -> Range<Int64>? in
            guard let p = s.packs[pack.number] else { return nil }
            let from = max(p.writebackFrom, p.flushed)
            if writeback {
                guard record.upperBound - from >= Self.writebackBatch else { return nil }
                s.packs[pack.number]!.writebackFrom = record.upperBound
                return from..<record.upperBound
            }
            s.packs[pack.number]!.writebackFrom = record.upperBound
            return from < record.lowerBound ? from..<record.lowerBound : nil
        }
        guard let range else { return }
        startWriteback(pack.fd, offset: range.lowerBound, count: range.upperBound - range.lowerBound)
        writebacksStarted.add(1, ordering: .relaxed)
        writebackBytes.add(range.upperBound - range.lowerBound, ordering: .relaxed)
    }

    /// Under `appending`: a new active pack when there is none or it is full.
    private func startPackIfNeeded() throws(StoreError) {
        if state.withLock({ s in s.packs[s.active].map { !$0.full } ?? false }) { return }
        // The next free number (a name taken by a file this process did not make, or the
        // numbers run past the last, is passed over).
        var number: UInt32 = 0, fd: Int32 = -1, path = ""
        for _ in 0..<1_000 {
            number = state.withLock { s in
                defer { s.nextNumber = s.nextNumber == .max ? 1 : s.nextNumber + 1 }
                return s.nextNumber
            }
            path = Self.path(directory, number, "pack")
            fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
            if fd >= 0 || errno != EEXIST { break }
        }
        if fd < 0 { throw .io(errno: errno, "create \(path)") }
        // An index by this number whose pack is gone (deleted by hand) would be taken for
        // this pack's at the next open, and name records that are not there.
        if unlink(Self.path(directory, number, "idx")) == 0 { state.withLock { $0.directoryChanged = true } }
        let pack = Pack(number: number, fd: fd, path: path)
        do { try Self.write(Self.fileHeader, to: pack, at: 0) } catch {
            unlink(path) // holds nothing (a full disk, say): no file to leave behind
            throw error
        }
        state.withLock { s in
            s.packs[number] = PackState(pack: pack, size: Int64(Self.fileHeader.count))
            s.active = number
            s.directoryChanged = true
        }
    }

    /// Chunks to drop whatever their last use (eviction, a damaged copy): out of the index,
    /// their bytes counted dead until `punchRemoved` makes them holes or `compact`
    /// rewrites their packs. Returns the bytes of the records removed. Not persisted until
    /// then: after a crash they are back (good copies, or damage that reads as such), and
    /// the next eviction or repair finds them again.
    @discardableResult
    public func remove(_ ids: [ChunkID]) -> Int64 {
        var held = GraceHeld()
        return sweep(ids, unusedSince: .max, held: &held).values.reduce(0, +)
    }

    /// gc: removes each chunk unless it was written or claimed at or after `cutoff`, as
    /// `remove` does. Returns the bytes of each record removed; counts the ones kept in
    /// `held`.
    public func sweep(_ ids: [ChunkID], unusedSince cutoff: Nanos, held: inout GraceHeld) -> [ChunkID: Int64] {
        state.withLock { s in
            var freed: [ChunkID: Int64] = [:]
            for id in ids {
                guard let place = s.index[id] else { continue }
                let bytes = Int64(Self.recordHeaderSize + place.length)
                guard place.used < cutoff else {
                    held.add(bytes: bytes, lastUse: place.used)
                    continue
                }
                s.index[id] = nil
                s.packs[place.pack]?.liveBytes -= bytes
                s.packs[place.pack]?.deadBytes += bytes
                s.packs[place.pack]?.toPunch.append(place.offset..<(place.offset + Int64(place.length)))
                freed[id] = bytes
            }
            return freed
        }
    }

    // MARK: durability

    /// Makes every chunk put so far durable: the packs written since the last call are
    /// flushed (no lock held), then full ones get their index and are sealed.
    public func sync() throws(StoreError) {
        guard !readOnly else { return }
        let (open, full) = state.withLock { s in
            (s.packs.values.filter { !$0.sealed && !$0.foreign && $0.flushed < $0.size }.map { ($0.pack, $0.size) },
             s.packs.values.filter { $0.full && !$0.sealed && !$0.foreign }.map { ($0.pack, $0.size) })
        }
        for (pack, size) in open {
            if fdatasync(pack.fd) != 0 { throw .io(errno: errno, "flush \(pack.path)") }
            state.withLock { s in s.packs[pack.number].map { s.packs[pack.number]!.flushed = max($0.flushed, size) } }
        }
        for (pack, size) in full {
            let entries = state.withLock { s in Self.live(in: pack.number, s) }
            try StoreError.wrap { () throws(SystemError) in
                try writeFileAtomically(Self.path(directory, pack.number, "idx"), Self.indexFile(entries, packSize: size),
                                        tempPrefix: ".tmp-idx-", durable: true)
            }
            state.withLock { $0.packs[pack.number]?.sealed = true; $0.directoryChanged = true }
        }
        try syncDirectoryIfChanged()
    }

    /// The end of this process's appends (a clean close): the active pack is flushed and
    /// gets its index, so the next open reads indexes only, not the last pack's records.
    public func seal() throws(StoreError) {
        guard !readOnly else { return }
        appending.withLock { _ in state.withLock { s in s.packs[s.active]?.full = true } }
        try sync()
    }

    /// One fsync of the directory when a pack was made or deleted or an index written
    /// since the last.
    private func syncDirectoryIfChanged() throws(StoreError) {
        guard state.withLock({ s in defer { s.directoryChanged = false }; return s.directoryChanged }) else { return }
        do throws(SystemError) { try fsyncPath(directory, directory: true) } catch {
            state.withLock { $0.directoryChanged = true }
            throw .io(errno: error.code, error.context)
        }
    }

    // MARK: punching

    /// Gives the space of removed records (an eviction, gc's sweep) back at once, where a
    /// compaction would wait until their pack is mostly dead and then copy the rest: their
    /// bytes become holes (fallocate PUNCH_HOLE; a record's header stays, so a scan still
    /// walks the pack, and a punched record's zeros do not hash to its id). A sealed pack's
    /// index names its records, so it is first written again without them, flushed with
    /// the directory, and only then are they punched: after a crash, a record an index
    /// names is whole. The pack being written has no index (what a sync seals it with
    /// is read after the removal); a full pack whose index is not written yet waits for
    /// the next call; another process's is left alone. Returns the bytes punched. Never
    /// call it under a lock: it writes and flushes.
    @discardableResult
    public func punchRemoved() throws(StoreError) -> Int64 {
        guard !readOnly else { return 0 }
        return try upkeep.withLock { (_: inout Void) throws(StoreError) -> Int64 in
            typealias Work = (pack: Pack, size: Int64, index: [(ChunkID, Place)]?, ranges: [Range<Int64>])
            var work = state.withLock { s -> [Work] in
                var work: [Work] = []
                for (number, p) in s.packs where !p.toPunch.isEmpty && !p.foreign && (p.sealed || !p.full) {
                    // The live records and the ranges in one hold: no range's record is in
                    // the index written below.
                    work.append((p.pack, p.size, p.sealed ? Self.live(in: number, s) : nil, p.toPunch))
                    s.packs[number]!.toPunch = []
                }
                return work.sorted { $0.pack.number < $1.pack.number }
            }
            // What is not punched goes back, to be punched by a later call.
            defer {
                state.withLock { s in for w in work { s.packs[w.pack.number]?.toPunch += w.ranges } }
            }
            for w in work {
                guard let entries = w.index else { continue }
                try StoreError.wrap { () throws(SystemError) in
                    try writeFileAtomically(Self.path(directory, w.pack.number, "idx"), Self.indexFile(entries, packSize: w.size),
                                            tempPrefix: ".tmp-idx-", durable: true)
                }
                state.withLock { $0.directoryChanged = true }
            }
            try syncDirectoryIfChanged()
            var total: Int64 = 0
            while let w = work.first {
                var done: Int64 = 0
                for range in w.ranges where Linux.fallocate(w.pack.fd, mode: Linux.fallocPunchHole | Linux.fallocKeepSize,
                                                                            offset: range.lowerBound, length: Int64(range.count)) == 0 {
                    done += Int64(range.count)
                }
                // A filesystem without holes (or a failure): the compaction frees them.
                work.removeFirst()
                // Still dead bytes for a compaction: a pack mostly removed is rewritten all
                // the same, which gives back the file's length and the blocks a hole
                // leaves at its records' edges.
                state.withLock { s in s.packs[w.pack.number]?.punched += done }
                total += done
            }
            return total
        }
    }

    // MARK: compaction

    /// Rewrites the packs whose dead bytes are at least `deadShare` of what they hold:
    /// their live chunks are appended to the active pack, flushed, and the old pack and
    /// its index deleted. A crash in between leaves a chunk in both places, either
    /// good. Returns the bytes freed.
    @discardableResult
    public func compact(deadShare: Double = 0.5) throws(StoreError) -> Int64 {
        guard !readOnly else { return 0 }
        return try upkeep.withLock { (_: inout Void) throws(StoreError) -> Int64 in try compactAlone(deadShare: deadShare) }
    }

    /// `compact`, under `upkeep`.
    private func compactAlone(deadShare: Double) throws(StoreError) -> Int64 {
        let worthIt = { (p: PackState) in
            p.headerless || p.deadBytes > 0 && Double(p.deadBytes) >= deadShare * Double(p.liveBytes + p.deadBytes)
        }
        // The pack being written too (a small store never fills one): it is ended first,
        // so that its copies go to a new one, and sealed by the sync.
        let endActive = appending.withLock { _ in
            state.withLock { s in
                guard let active = s.packs[s.active], !active.full, worthIt(active) else { return false }
                s.packs[s.active]!.full = true
                return true
            }
        }
        if endActive { try sync() }
        let victims = state.withLock { s in s.packs.values.filter { $0.sealed && worthIt($0) }.map(\.pack.number).sorted() }
        guard !victims.isEmpty else { return 0 }
        for number in victims {
            // In the order they lie: the copies keep their neighbours.
            let live = state.withLock { s in Self.live(in: number, s).map(\.0) }
            for id in live {
                // Read and verified outside the appends' lock (writers wait only for the
                // copy's write). One that does not read (damaged) stays, and so does its
                // pack, for fsck to repair.
                guard let bytes = try? read(id) else { continue }
                try appending.withLock { (_: inout Void) throws(StoreError) in
                    // Removed meanwhile: nothing to copy.
                    guard let used = state.withLock({ $0.index[id].flatMap { $0.pack == number ? $0.used : nil } }) else { return }
                    try withBytes(bytes) { (raw) throws(StoreError) in try append(id, raw, used: used, moving: number) }
                }
            }
        }
        // The copies flushed once for all the packs, before any old one goes.
        try sync()
        var freed: Int64 = 0
        for number in victims {
            let gone = state.withLock { s -> PackState? in
                // Only a sealed pack is compacted, and nothing is appended to a sealed
                // pack: what still lives here is what did not read.
                guard Self.live(in: number, s).isEmpty else { return nil }
                return s.packs.removeValue(forKey: number)
            }
            guard let gone else { continue }
            unlink(Self.path(directory, number, "idx"))
            unlink(gone.pack.path)
            state.withLock { $0.directoryChanged = true }
            freed += gone.size
        }
        try syncDirectoryIfChanged()
        return freed
    }

    /// The bytes of every pack (what the store's chunks outside small.sqlite take), holes
    /// left out.
    public var diskBytes: Int64 { state.withLock { s in s.packs.values.reduce(0) { $0 + $1.size - $1.punched } } }

    /// Each pack: its number, bytes (header and whole records), bytes of live records,
    /// and whether it is sealed.
    public var packs: [(number: UInt32, bytes: Int64, live: Int64, sealed: Bool)] {
        state.withLock { s in
            s.packs.values.map { ($0.pack.number, $0.size, $0.liveBytes, $0.sealed) }.sorted { $0.number < $1.number }
        }
    }

    // MARK: format

    static func path(_ directory: String, _ number: UInt32, _ suffix: String) -> String {
        let hex = String(number, radix: 16)
        return "\(directory)/\(String(repeating: "0", count: max(0, 8 - hex.count)))\(hex).\(suffix)"
    }

    static func recordHeader(_ id: ChunkID, length: Int) -> [UInt8] {
        var header: [UInt8] = []
        header.reserveCapacity(recordHeaderSize)
        header += recordMagic
        appendLE(&header, UInt64(length), bytes: 4)
        header += id.raw
        appendLE(&header, fnv1a(header), bytes: 8)
        return header
    }

    /// The record's id and length, if `header` is a whole record header.
    static func parseRecordHeader(_ header: ArraySlice<UInt8>) -> (ChunkID, Int)? {
        guard header.count == recordHeaderSize else { return nil }
        let h = Array(header)
        guard h[0..<4].elementsEqual(recordMagic), readLE(h, 40, 8) == fnv1a(h[0..<40]),
              let id = ChunkID(raw: h[8..<40]) else { return nil }
        let length = Int(readLE(h, 4, 4))
        guard length <= maxChunkLength else { return nil }
        return (id, length)
    }

    /// `entries` in the order they lie in the pack (`live(in:)`).
    static func indexFile(_ entries: [(ChunkID, Place)], packSize: Int64) -> [UInt8] {
        var out = indexMagic
        appendLE(&out, UInt64(packSize), bytes: 8)
        appendLE(&out, UInt64(entries.count), bytes: 8)
        for (id, place) in entries {
            out += id.raw
            appendLE(&out, UInt64(place.offset), bytes: 8)
            appendLE(&out, UInt64(place.length), bytes: 8)
        }
        appendLE(&out, fnv1a(out[...]), bytes: 8)
        return out
    }

    /// A sealed pack's records from its index; nil when the index is not whole and right
    /// for a pack of `fileSize` bytes (the pack is then scanned).
    static func parseIndex(_ bytes: [UInt8], pack: UInt32, fileSize: Int64, used: Nanos) -> [(ChunkID, Place)]? {
        guard bytes.count >= 32, Array(bytes[0..<8]) == indexMagic,
              readLE(bytes, bytes.count - 8, 8) == fnv1a(bytes[0..<(bytes.count - 8)]) else { return nil }
        let size = readLE(bytes, 8, 8), count = readLE(bytes, 16, 8)
        guard size <= UInt64(fileSize), count <= UInt64((bytes.count - 32) / 48), 24 + Int(count) * 48 + 8 == bytes.count else { return nil }
        var places: [(ChunkID, Place)] = []
        places.reserveCapacity(Int(count))
        for i in 0..<Int(count) {
            let at = 24 + i * 48
            guard let id = ChunkID(raw: bytes[at..<(at + 32)]) else { return nil }
            let offset = readLE(bytes, at + 32, 8), length = readLE(bytes, at + 40, 8)
            guard offset >= UInt64(fileHeader.count + recordHeaderSize), length <= UInt64(maxChunkLength),
                  offset <= size, length <= size - offset else { return nil }
            places.append((id, Place(pack: pack, offset: Int64(offset), length: Int(length), used: used)))
        }
        return places
    }

    private static func write(_ bytes: [UInt8], to pack: Pack, at offset: Int64) throws(StoreError) {
        var failure: SystemError?
        bytes.withUnsafeBytes { raw in
            do throws(SystemError) { try writeAll(pack.fd, raw, at: offset, path: pack.path) } catch { failure = error }
        }
        if let failure { throw .io(errno: failure.code, failure.context) }
    }

    // MARK: open

    private static func load(_ directory: String, readOnly: Bool, removeTemporaries: Bool, now: Nanos) throws(StoreError) -> State {
        var s = State()
        let names = try StoreError.wrap { () throws(SystemError) in try directoryEntries(directory) }
        // An index a crash caught before its rename: written again at the next sync.
        for name in names where name.hasPrefix(".tmp-idx-") && removeTemporaries { unlink(directory + "/" + name) }
        for number in packNumbers(names) {
            guard let (entry, places) = try openPack(directory, number, readOnly: readOnly, now: now, sealedOnly: false) else { continue }
            merge(entry, places, into: &s)
        }
        // Appends go to a fresh pack: the last one may be another process's half record
        // away from full, and a new file costs nothing.
        for number in s.packs.keys { s.packs[number]?.full = true }
        return s
    }

    /// Takes in the sealed packs another process added since this one opened (`ubiquity
    /// fsck --repair` while mounted writes its good copies to a pack of its own): their
    /// copies count over the ones here. One not sealed yet is left for the next open (its
    /// writer may still append to it). Returns how many were taken in.
    public func adoptSealedPacks() throws(StoreError) -> Int {
        let names = try StoreError.wrap { () throws(SystemError) in try directoryEntries(directory) }
        let known = state.withLock { Set($0.packs.keys) }
        var adopted = 0
        for number in Self.packNumbers(names) where !known.contains(number) {
            guard let (entry, places) = try Self.openPack(directory, number, readOnly: readOnly, now: nowNanos(), sealedOnly: true) else { continue }
            state.withLock { s in
                guard s.packs[number] == nil else { return }
                Self.merge(entry, places, into: &s)
                adopted += 1
            }
        }
        return adopted
    }

    /// The pack numbers among a directory's names: only the names this code gives (a
    /// stray `0000000A.pack` is not one), in order.
    private static func packNumbers(_ names: [String]) -> [UInt32] {
        names.compactMap { name -> UInt32? in
            guard name.hasSuffix(".pack"), name.utf8.count == 13, let number = UInt32(name.prefix(8), radix: 16),
                  Self.path("", number, "pack").utf8.dropFirst().elementsEqual(name.utf8) else { return nil }
            return number
        }.sorted()
    }

    /// A pack and its records, from its index or else a scan (nil: not a pack, or, with
    /// `sealedOnly`, one without a whole index).
    private static func openPack(_ directory: String, _ number: UInt32, readOnly: Bool, now: Nanos,
                                 sealedOnly: Bool) throws(StoreError) -> (PackState, [(ChunkID, Place)])? {
        let path = Self.path(directory, number, "pack")
        let fd = open(path, (readOnly ? O_RDONLY : O_RDWR) | O_CLOEXEC)
        if fd < 0 && (errno == EISDIR || sealedOnly && errno == ENOENT) { return nil } // not a pack; or gone since the listing
        if fd < 0 { throw .io(errno: errno, "open \(path)") }
        let pack = Pack(number: number, fd: fd, path: path)
        var st = stat()
        guard fstat(fd, &st) == 0 else { throw .io(errno: errno, "stat \(path)") }
        // Its records were last used when it was last written, as far as an open knows.
        // Claims of an earlier process are not kept, and need not be: a claim keeps a
        // chunk for a save in progress, and a new process has none from before.
        let (seconds, overflow) = Nanos(st.st_mtim.tv_sec).multipliedReportingOverflow(by: 1_000_000_000)
        let now = overflow || seconds < 0 ? now : min(now, seconds.addingClamped(Nanos(st.st_mtim.tv_nsec)))
        let indexBytes = try StoreError.wrap { () throws(SystemError) in
            // A pack of 64 MiB has an index of a few MiB; a larger one is not an index.
            try readFile(Self.path(directory, number, "idx"), limit: 1 << 28)
        }
        // The whole file counts, not only its records: nothing is appended to a pack
        // after an open, and what is not a record (a torn tail, stray bytes) is dead
        // until a compaction rewrites the pack.
        var entry = PackState(pack: pack, size: Int64(st.st_size))
        let places: [(ChunkID, Place)]
        let hasHeader = try Self.hasHeader(pack)
        if let indexBytes, let parsed = parseIndex(indexBytes, pack: number, fileSize: Int64(st.st_size), used: now) {
            entry.full = true
            entry.sealed = true
            entry.flushed = entry.size
            places = parsed
        } else {
            if sealedOnly { return nil }
            places = hasHeader ? try scan(pack, fileSize: Int64(st.st_size), used: now) : []
        }
        entry.headerless = !hasHeader
        return (entry, places)
    }

    /// A pack opened into the state: a chunk it holds that is already here counts from
    /// this pack (a later copy: a compaction a crash cut short, a chunk put again after gc
    /// removed it, a repair's copy).
    private static func merge(_ pack: PackState, _ places: [(ChunkID, Place)], into s: inout State) {
        var entry = pack
        let number = entry.pack.number
        for (id, place) in places {
            let bytes = Int64(recordHeaderSize + place.length)
            if let old = s.index[id] {
                let oldBytes = Int64(recordHeaderSize + old.length)
                if old.pack == number {
                    entry.liveBytes -= oldBytes
                } else {
                    s.packs[old.pack]?.liveBytes -= oldBytes
                    s.packs[old.pack]?.deadBytes += oldBytes
                }
            }
            s.index[id] = place
            entry.liveBytes += bytes
            entry.records.append(id)
        }
        entry.deadBytes = max(0, entry.size - (entry.headerless ? 0 : Int64(fileHeader.count)) - entry.liveBytes)
        s.packs[number] = entry
        s.nextNumber = max(s.nextNumber, number == .max ? 1 : number + 1)
    }

    /// Whether the pack begins with its header. One that does not was made, and a crash
    /// came before its header was whole: nothing in it was ever flushed, and all of it
    /// counts as dead, for a compaction to delete. (A later format of packs comes with a
    /// later format of the store, which this one refuses first.)
    private static func hasHeader(_ pack: Pack) throws(StoreError) -> Bool {
        let header = try StoreError.wrap { () throws(SystemError) in
            try readBytes(pack.fd, count: fileHeader.count, at: 0, path: pack.path)
        }
        return header.count == fileHeader.count && header.starts(with: fileHeader.prefix(8))
    }

    /// The whole records of a pack without an index. Past a record that is not whole (a
    /// torn tail after a crash, or a damaged header) the scan looks for the next record
    /// header, so damage in the middle costs only its record.
    private static func scan(_ pack: Pack, fileSize: Int64, used: Nanos) throws(StoreError) -> [(ChunkID, Place)] {
        var at = Int64(fileHeader.count)
        var places: [(ChunkID, Place)] = []
        while at + Int64(recordHeaderSize) <= fileSize {
            let bytes = try StoreError.wrap { () throws(SystemError) in
                try readBytes(pack.fd, count: recordHeaderSize, at: at, path: pack.path)
            }
            if let (id, length) = parseRecordHeader(bytes[...]), at + Int64(recordHeaderSize) + Int64(length) <= fileSize {
                // A pack without an index was not all flushed: a power loss can keep a
                // record's header and not its bytes. Such a record is not the chunk (else a
                // later put of it would find it here and keep the damaged copy).
                let data = try StoreError.wrap { () throws(SystemError) in
                    try readBytes(pack.fd, count: length, at: at + Int64(recordHeaderSize), path: pack.path)
                }
                if data.count == length && ChunkID(hashing: data) == id {
                    places.append((id, Place(pack: pack.number, offset: at + Int64(recordHeaderSize), length: length, used: used)))
                }
                at += Int64(recordHeaderSize + length)
                continue
            }
            guard let next = try nextRecord(in: pack, from: at + 1, fileSize: fileSize) else { break }
            at = next
        }
        return places
    }

    /// The offset of the next whole record header at or after `from`, read a window at a
    /// time (a damaged pack is never read into memory whole).
    private static func nextRecord(in pack: Pack, from: Int64, fileSize: Int64) throws(StoreError) -> Int64? {
        let window = 1 << 20
        var start = from
        while start + Int64(recordHeaderSize) <= fileSize {
            let bytes = try StoreError.wrap { () throws(SystemError) in
                try readBytes(pack.fd, count: Int(min(Int64(window + recordHeaderSize), fileSize - start)), at: start, path: pack.path)
            }
            var i = 0
            while i + recordHeaderSize <= bytes.count {
                if bytes[i..<(i + 4)].elementsEqual(recordMagic),
                   let (_, length) = parseRecordHeader(bytes[i..<(i + recordHeaderSize)]),
                   start + Int64(i + recordHeaderSize + length) <= fileSize {
                    return start + Int64(i)
                }
                i += 1
            }
            start += Int64(window)
        }
        return nil
    }
}

/// FNV-1a, 64 bits: a check against torn and stray bytes in local pack headers (the
/// chunks themselves are checked by their SHA-256).
func fnv1a(_ bytes: some Collection<UInt8>) -> UInt64 {
    var hash: UInt64 = 0xcbf2_9ce4_8422_2325
    for b in bytes { hash = (hash ^ UInt64(b)) &* 0x0000_0100_0000_01b3 }
    return hash
}

private func appendLE(_ out: inout [UInt8], _ value: UInt64, bytes: Int) {
    for i in 0..<bytes { out.append(UInt8(truncatingIfNeeded: value >> (8 * i))) }
}

private func readLE(_ bytes: [UInt8], _ at: Int, _ count: Int) -> UInt64 {
    var value: UInt64 = 0
    for i in (0..<count).reversed() { value = value << 8 | UInt64(bytes[at + i]) }
    return value
}
