import Glibc
import UbiquitySystem

/// The content of one open file: its committed chunks (`base`) overlaid with the bytes
/// written since (kept in an unlinked staging file, at their own offsets).
///
/// Why an overlay and not a full copy: opening a 4 GiB file to change one byte must not copy
/// or rehash 4 GiB. A commit rechunks only around the written ranges and reuses every base
/// chunk that starts where a new cut lands (content-defined cuts resynchronize).
///
/// Thread safety: data methods take the content's own lock. Lock order: content lock, then
/// the filesystem's metadata lock (`commit`'s `record` runs under the content lock). The
/// summary properties (size, isChanged, ...) read a separate leaf lock, so code holding the
/// metadata lock may ask for them without taking the content lock (that would deadlock
/// against a commit).
public final class FileContent: @unchecked Sendable {
    struct State {
        var base: ChunkList
        /// Base bytes at or beyond this offset were truncated away (they read as zeros).
        var baseLimit: Int64
        var size: Int64
        /// The bytes written since the last commit, and where they sit in the staging file.
        var dirty = StagedExtents()
        /// Bytes of `base` held in chunks (not holes), for st_blocks: those still shown
        /// after a truncation or a punch (`visibleBaseBytes`).
        var baseStored: Int64
        /// Set by any write or truncate since the last commit.
        var changed = false
        /// Where the bytes of `dirty` are.
        let staging: StagingBuffer
        /// A file written in order from its start: its bytes are in here, cut and stored
        /// as they come, not in `dirty` (`SequentialStream`).
        var stream: SequentialStream?
        /// The committed chunk list, while `base` holds the chunks of a stream that ended
        /// before the commit (`settle`): what `discardChanges` goes back to.
        var committedBase: ChunkList?
        var lastChange: Nanos = 0
        /// `lastChange` of content whose commit was refused as invalid (`.invalidContent`).
        var refusedChange: Nanos?
        /// Where the last read ended (to recognise sequential reading).
        var lastReadEnd: Int64 = -1
        /// Ranges punched or zeroed since the last commit: they read as zeros over `base`,
        /// and writes after the punch lie over them in `dirty` (which the punch cleared).
        var zeroed = ByteRanges()
        /// Ranges fallocate reserved (kept in the store's `reserves`); their holes count
        /// in st_blocks as ext4's unwritten extents do.
        var reserved = ByteRanges()
        /// The holes of `reserved` (a write draws what it fills before its bytes land).
        var reserveHoles: Int64 = 0
        /// Whether `reserved` was ever non-empty (the store must then hear of changes).
        var hasReserve = false
    }

    private let state: Locked<State>
    private let summary: Locked<Summary>
    private let chunks: ChunkStore

    /// What others may read without the content lock; published after every change.
    struct Summary {
        var size: Int64
        var changed = false
        var hasWrites = false
        var refused = false
        var lastChange: Nanos = 0
        /// Bytes that are not holes (about: written ranges may overlap base chunks),
        /// plus the reserved holes.
        var allocated: Int64 = 0
        var reserveHoles: Int64 = 0
        /// Bytes in chunks of the committed content (what the inode's st_blocks counts
        /// besides the reserve).
        var committedStored: Int64 = 0
        var reserved: [Range<Int64>] = []
        var hasReserve = false
    }
    /// Whether new chunks are shown to the chunk store's observer, which uploads them
    /// while they are written (a file that syncs; never a local-only one).
    let announce: Bool
    /// Some base chunks may not be here (files on demand): changes fetch what their
    /// commit reads first (`fetchBaseAround`).
    let remoteBase: Bool

    /// The file's part of the space fallocate set aside: told of every change of the
    /// reserved holes, and before a write fills some (nil: nothing is set aside).
    let spaceAccount: SpaceReservation.Account?

    /// `reserved`: the ranges fallocate reserved earlier (the store keeps them).
    /// `announce`: see above.
    public init(base: ChunkList, chunks: ChunkStore, stagingDirectory: String, reserved: [Range<Int64>] = [],
                announce: Bool = false, remoteBase: Bool = false, reservation: SpaceReservation.Account? = nil) {
        self.announce = announce
        self.remoteBase = remoteBase
        spaceAccount = reservation
        var initial = State(base: base, baseLimit: base.totalSize, size: base.totalSize, baseStored: base.storedBytes,
                            staging: StagingBuffer(directory: stagingDirectory))
        // Complete before the lock is made: a file is opened under the filesystem's and the
        // store's locks, which come after a content lock in the lock order.
        if !reserved.isEmpty {
            for r in reserved { initial.reserved.insert(r) }
            initial.hasReserve = true
            initial.reserveHoles = Self.reservedHoles(initial, in: 0..<maxFileSize)
        }
        state = Locked(initial, rank: .content)
        summary = Locked(Summary(size: base.totalSize, allocated: base.storedBytes, committedStored: base.storedBytes), rank: .summary)
        self.chunks = chunks
        if !reserved.isEmpty { publish(initial) }
    }

    public var size: Int64 { summary.withLock { $0.size } }
    /// The chunks the committed content is made of (gc keeps them while the file is open).
    public var baseChunks: [ChunkID] {
        state.withLock { s in s.base.chunks.map(\.id) + (s.committedBase?.chunks.map(\.id) ?? []) + (s.stream?.storedIDs ?? []) }
    }
    public var isChanged: Bool { summary.withLock { $0.changed } }
    /// Whether bytes were written since the last commit (not just a truncation).
    public var hasWrites: Bool { summary.withLock { $0.hasWrites } }
    /// The current changes were refused by the last commit (and nothing changed since).
    public var isRefused: Bool { summary.withLock { $0.refused } }
    /// When the content last changed (for the idle autosave).
    public var lastChange: Nanos { summary.withLock { $0.lastChange } }
    /// Bytes not in holes, plus reserved holes (st_blocks).
    public var allocatedBytes: Int64 { summary.withLock { $0.allocated } }
    /// Holes fallocate reserved (they count in st_blocks beyond the chunks).
    public var reservedHoleBytes: Int64 { summary.withLock { $0.reserveHoles } }
    public var committedStoredBytes: Int64 { summary.withLock { $0.committedStored } }
    /// The reserved ranges, and whether there ever were any in this content's life.
    public var reservation: (ranges: [Range<Int64>], ever: Bool) { summary.withLock { ($0.reserved, $0.hasReserve) } }

    /// Called under the content lock after every change of `s`.
    private func publish(_ s: State) {
        summary.withLock {
            $0 = Summary(size: s.size, changed: s.changed, hasWrites: !s.dirty.isEmpty || s.stream != nil,
                         refused: s.changed && s.refusedChange == s.lastChange, lastChange: s.lastChange,
                         allocated: (s.stream.map(\.size) ?? min(s.size, s.baseStored + s.dirty.stagedBytes)).addingClamped(s.reserveHoles),
                         reserveHoles: s.reserveHoles, committedStored: (s.committedBase ?? s.base).storedBytes,
                         reserved: s.reserved.ranges, hasReserve: s.hasReserve)
        }
        if s.hasReserve { spaceAccount?.settle(s.reserveHoles) }
    }

    /// How far ahead of a sequential reader chunks are read (or fetched).
    static let readAhead: Int64 = 4 << 20

    /// A file not all here (files on demand): before a change, the base chunks its commit
    /// will read again (those the range touches, and the 1 MiB window the rechunking reads
    /// past it) are fetched, outside the content lock; a change that could not be
    /// committed fails now (EIO) rather than being acknowledged and lost at the commit.
    /// A truncation (`window` 0, an empty range) reads back only the chunk it cuts in two.
    private func fetchBaseAround(_ range: Range<Int64>, window: Int64 = (1 << 20) + Int64(Chunker.standard.maxSize)) throws(StoreError) {
        guard remoteBase else { return }
        let wants = state.withLock { s -> [ChunkWant] in
            let baseEnd = min(s.baseLimit, s.base.totalSize)
            guard range.lowerBound < baseEnd else { return [] }
            var i = s.base.index(containing: range.lowerBound)
            if range.isEmpty && s.base.offsets[i] == range.lowerBound { return [] } // cut at a chunk's edge
            let end = min(baseEnd, range.upperBound.addingClamped(window))
            var wants: [ChunkWant] = []
            repeat {
                if let want = s.base.stored(i) { wants.append(want) }
                i += 1
            } while i < s.base.count && s.base.offsets[i] < end
            return wants
        }
        try chunks.ensureLocal(wants)
    }

    /// Up to `count` bytes at `offset` (fewer at the end of the file). `count` is what
    /// one request carries; holes read as zeros without touching the chunk store.
    /// Chunks that are not here are fetched before the content lock is taken again.
    public func read(offset: Int64, count: Int) throws(StoreError) -> [UInt8] {
        try prepareRead(offset: offset, count: count)
        return try state.withLock { (s) throws(StoreError) in try readMerged(&s, offset: offset, count: count) }
    }

    /// `read` as pieces to send as they are (a reply's iovecs), in order: where verified
    /// base chunks alone cover the range (a file read as it was saved), slices of them,
    /// without copying them into one array first (a copy and, for a large reply, fresh
    /// pages to fault in: a seventh of the daemon's time in a cold read); anything else
    /// as one piece.
    public func readPieces(offset: Int64, count: Int) throws(StoreError) -> [ArraySlice<UInt8>] {
        try prepareRead(offset: offset, count: count)
        return try state.withLock { (s) throws(StoreError) -> [ArraySlice<UInt8>] in
            guard offset < s.size, count > 0 else { return [] }
            let end = offset + min(Int64(count), s.size - offset)
            var pieces: [ArraySlice<UInt8>] = []
            if end <= min(s.baseLimit, s.base.totalSize), s.dirty.pieces(in: offset..<end).isEmpty,
               !s.zeroed.ranges.contains(where: { $0.overlaps(offset..<end) }) {
                var i = s.base.index(containing: offset)
                while i < s.base.count && s.base.offsets[i] < end, !s.base.isHole(i), pieces.count < Self.maxPieces {
                    let chunk = s.base.range(i)
                    let bytes = try chunks.read(piece: i, of: s.base)
                    pieces.append(bytes[Int(max(chunk.lowerBound, offset) - chunk.lowerBound)..<Int(min(chunk.upperBound, end) - chunk.lowerBound)])
                    i += 1
                }
                if i >= s.base.count || s.base.offsets[i] >= end { return pieces }
            }
            return [try readMerged(&s, offset: offset, count: count)[...]]
        }
    }

    /// More pieces than this (chunks of a few bytes each, which another device's records
    /// may name) come as one: the FUSE layer takes each piece's address in a nested call.
    static let maxPieces = 64

    /// What a read does before it assembles its bytes: the base chunks it needs fetched
    /// (when not here) and read into the cache, each verified, outside the content lock
    /// (parallel reads, the kernel's read-ahead, hash in parallel); the chunks ahead of a
    /// sequential reader read ahead in the background.
    private func prepareRead(offset: Int64, count: Int) throws(StoreError) {
        guard offset >= 0, count >= 0 else { throw .io(errno: EINVAL, "read at \(offset)") }
        try state.withLock { (s) throws(StoreError) in try settle(&s) }
        let (needed, ahead, toEnd) = state.withLock { s -> ([ChunkWant], [ChunkWant], Bool) in
            guard offset < s.size else { return ([], [], false) }
            let end = offset + min(Int64(count), s.size - offset)
            let baseEnd = min(end, s.baseLimit, s.base.totalSize)
            guard offset < baseEnd else { return ([], [], false) }
            var wants: [ChunkWant] = []
            var i = s.base.index(containing: offset)
            while i < s.base.count && s.base.offsets[i] < baseEnd {
                // A chunk a punch or later writes hide is not needed (nor its verification).
                let part = max(s.base.offsets[i], offset)..<min(s.base.offsets[i + 1], baseEnd)
                if let want = s.base.stored(i), !Self.hidden(s, part) { wants.append(want) }
                i += 1
            }
            // Sequential reading: the next chunks (4 MiB) ahead, read and verified, or
            // fetched in pieces of at least 1 MiB when they are not here.
            var ahead: [ChunkWant] = []
            var toEnd = false
            // A first read at the start is sequential too (as the kernel's read-ahead takes
            // it): else a file read from its start asks the backing store twice, its first
            // 128 KiB and then the rest (three GETs, not one or two, when the file
            // straddles two packs; OnDemandTests checks it).
            if offset == s.lastReadEnd || (offset == 0 && s.lastReadEnd < 0) {
                let limit = min(s.baseLimit, s.base.totalSize, end + Self.readAhead)
                while i < s.base.count && ahead.count < 64 && s.base.offsets[i] < limit {
                    if let want = s.base.stored(i) { ahead.append(want) }
                    i += 1
                }
                toEnd = i >= s.base.count || s.base.offsets[i] >= min(s.baseLimit, s.base.totalSize)
            }
            s.lastReadEnd = end
            return (wants, ahead, toEnd)
        }
        // Fetched together (one request per run of neighbours in a pack) when not here,
        // with the chunks ahead; then those ahead are read (or fetched) in the background:
        // the last piece of a file whatever its size.
        // Only for a file not all here at open: every other read would pay a stat per
        // chunk for nothing (a chunk missing anyway, evicted since, is fetched alone below).
        if remoteBase { try chunks.ensureLocal(needed, ahead: ahead) }
        if !ahead.isEmpty { chunks.prefetch(ahead, fetchAtLeast: toEnd ? 0 : 1 << 20) }
        try chunks.read(needed)
    }

    /// Writes `data` at `offset`. The caller checks `offset + data.count <= maxFileSize`.
    public func write(offset: Int64, _ data: UnsafeRawBufferPointer) throws(StoreError) {
        guard offset >= 0, offset <= maxFileSize - Int64(data.count) else { throw .io(errno: EFBIG, "write at \(offset)") }
        guard data.count > 0 else { return }
        try fetchBaseAround(offset..<offset + Int64(data.count))
        try state.withLock { (s) throws(StoreError) in
            let end = offset + Int64(data.count)
            // The reserved holes this write fills stop being promised before its bytes
            // land (on a full disk, `givingBackDrawnSpace` frees them), so a disk others
            // filled still has room for them. A failed write counts them again.
            if s.hasReserve {
                let filled = Self.reservedHoles(s, in: offset..<end)
                if filled > 0 {
                    s.reserveHoles -= filled
                    spaceAccount?.settle(s.reserveHoles, drawn: true)
                }
            }
            do throws(StoreError) {
                try givingBackDrawnSpace { () throws(StoreError) in try write(&s, offset: offset, end: end, data) }
            } catch {
                if s.hasReserve {
                    s.reserveHoles = reserveHoles(s)
                    publish(s)
                }
                throw error
            }
        }
    }

    /// `write` under the content's lock.
    private func write(_ s: inout State, offset: Int64, end: Int64, _ data: UnsafeRawBufferPointer) throws(StoreError) {
        if s.stream == nil { try startStream(&s, at: offset) }
        if s.stream != nil {
            if offset == s.stream!.size {
                // Chunks the earlier writes decided first: a full disk fails this write,
                // before its bytes are taken.
                try s.stream!.cutComplete()
                s.stream!.append(data)
                s.size = max(s.size, end)
                s.changed = true
                s.lastChange = nowNanos()
                publish(s)
                return
            }
            try settle(&s)
        }
        // Bytes first, then the map: a failed write leaves the map as it was.
        let at = s.dirty.location(for: offset..<end)
        try StoreError.wrap { () throws(SystemError) in try s.staging.write(data, at: at) }
        s.dirty.place(offset..<end)
        s.size = max(s.size, end)
        s.changed = true
        s.lastChange = nowNanos()
        publish(s)
    }

    /// Runs `body`; if the disk refuses it (ENOSPC) while the reservation file still holds
    /// space that writes into reserved holes drew, gives that back
    /// (`SpaceReservation.payDebt`) and runs it again.
    private func givingBackDrawnSpace<T>(_ body: () throws(StoreError) -> T) throws(StoreError) -> T {
        do throws(StoreError) {
            return try body()
        } catch .io(errno: ENOSPC, _) where spaceAccount?.payDebt() == true {
            return try body()
        }
    }

    /// Sets the size; the caller checks `0...maxFileSize`. Growing adds a hole.
    public func truncate(_ newSize: Int64) throws(StoreError) {
        guard newSize >= 0, newSize <= maxFileSize else { throw .io(errno: EFBIG, "truncate to \(newSize)") }
        try fetchBaseAround(newSize..<newSize, window: 0)
        try state.withLock { (s) throws(StoreError) in
            if s.stream != nil && newSize != s.size { try settle(&s) }
            if newSize <= s.size {
                // What goes is counted before it goes: the cost is the truncated part's.
                let gone = newSize..<maxFileSize
                s.reserveHoles -= Self.reservedHoles(s, in: gone)
                // Shrinking (or truncating to the size) frees the blocks past the new end,
                // reserved ones too, as ext4 does.
                s.reserved.clip(to: newSize)
                if newSize < s.size {
                    s.baseStored = newSize == 0 ? 0 : s.baseStored - Self.visibleBaseBytes(s, in: gone)
                    if s.dirty.clip(to: newSize) { s.staging.removeAll() }
                    s.baseLimit = min(s.baseLimit, newSize)
                    s.zeroed.clip(to: newSize)
                }
            }
            s.size = newSize
            s.changed = true
            s.lastChange = nowNanos()
            publish(s)
        }
    }

    /// lseek(SEEK_DATA) (`data`) or lseek(SEEK_HOLE): the first offset at or after
    /// `offset` in data, or in a hole (the end of the file counts as one); nil (ENXIO)
    /// when `offset` is at or past the end, or no data follows.
    public func seek(data: Bool, from offset: Int64) -> Int64? {
        state.withLock { s -> Int64? in
            guard offset >= 0, offset < s.size else { return nil }
            if let stream = s.stream { // written from the start, then (preallocated) one hole
                if offset < stream.size { return data ? offset : stream.size }
                return data ? nil : offset
            }
            var p = offset
            while p < s.size {
                let run = Self.run(s, at: p)
                if run.data == data { return p }
                p = run.end
            }
            return data ? nil : s.size
        }
    }

    /// The run of data or zeros that starts at `p` (< size) through the overlay: staged
    /// writes over punched ranges over base chunks over zeros. `end` is where the next
    /// piece begins (the run may continue there); it is always past `p`.
    private static func run(_ s: State, at p: Int64) -> (data: Bool, end: Int64) {
        if let staged = s.dirty.extent(containing: p) { return (true, staged.upperBound) }
        let nextStaged = s.dirty.nextStart(atOrAfter: p) ?? s.size
        if let punched = s.zeroed.range(containing: p) { return (false, min(punched.upperBound, nextStaged, s.size)) }
        let nextPunched = s.zeroed.nextStart(atOrAfter: p) ?? s.size
        let baseEnd = min(s.baseLimit, s.base.totalSize)
        guard p < baseEnd else { return (false, min(nextStaged, s.size)) }
        let i = s.base.index(containing: p)
        return (!s.base.isHole(i), min(s.base.offsets[i + 1], baseEnd, nextStaged, nextPunched, s.size))
    }

    /// Bytes of `r` that read as zeros without data behind them (holes, and past the end).
    private static func holeBytes(_ s: State, in r: Range<Int64>) -> Int64 {
        var total = max(0, r.upperBound - max(r.lowerBound, s.size))
        if let stream = s.stream { return total + max(0, min(r.upperBound, s.size) - max(r.lowerBound, stream.size)) }
        var p = r.lowerBound
        let end = min(r.upperBound, s.size)
        while p < end {
            let run = Self.run(s, at: p)
            let stop = min(run.end, end)
            if !run.data { total += stop - p }
            p = stop
        }
        return total
    }

    /// Bytes of base chunks in `r` that are still shown: below the truncation limit and
    /// outside punched ranges. Linear in the base pieces within `r` (what a truncation or a
    /// punch of `r` changes), never in the whole file.
    private static func visibleBaseBytes(_ s: State, in r: Range<Int64>) -> Int64 {
        let end = min(r.upperBound, s.baseLimit, s.base.totalSize)
        guard r.lowerBound < end else { return 0 }
        var total: Int64 = 0
        var i = s.base.index(containing: r.lowerBound)
        while i < s.base.count && s.base.offsets[i] < end {
            if !s.base.isHole(i) {
                let piece = max(s.base.offsets[i], r.lowerBound)..<min(s.base.offsets[i + 1], end)
                total += piece.upperBound - piece.lowerBound
                for punched in s.zeroed.pieces(in: piece) { total -= punched.upperBound - punched.lowerBound }
            }
            i += 1
        }
        return total
    }

    /// Holes of the reserved ranges within `r` (st_blocks counts them).
    private static func reservedHoles(_ s: State, in r: Range<Int64>) -> Int64 {
        s.reserved.pieces(in: r).reduce(0) { $0.addingClamped(holeBytes(s, in: $1)) }
    }

    private func reserveHoles(_ s: State) -> Int64 { Self.reservedHoles(s, in: 0..<maxFileSize) }

    /// The reserved holes counted afresh (tests compare the kept count with it).
    var recountedReserveHoles: Int64 { state.withLock { reserveHoles($0) } }

    /// Whether the base bytes of `r` are hidden: punched, or written over since.
    private static func hidden(_ s: State, _ r: Range<Int64>) -> Bool {
        s.zeroed.gaps(in: r).allSatisfy { s.dirty.covers($0) }
    }

    /// Bytes a reservation of `r` would add (fallocate sets them aside first): its holes
    /// not reserved already; when `zeroing` (ZERO_RANGE), all of `r` that is not a
    /// reserved hole already, as all of it is one after.
    public func addedReserve(in r: Range<Int64>, zeroing: Bool) -> Int64 {
        state.withLock { s in
            if zeroing { return (r.upperBound - r.lowerBound) - Self.reservedHoles(s, in: r) }
            return s.reserved.gaps(in: r).reduce(0) { $0.addingClamped(Self.holeBytes(s, in: $1)) }
        }
    }

    /// fallocate(2) modes 0 and KEEP_SIZE: reserves `r` (its holes count in st_blocks),
    /// and without `keepSize` extends the file to its end. The caller checks the range.
    public func reserve(_ r: Range<Int64>, keepSize: Bool) throws(StoreError) {
        try state.withLock { (s) throws(StoreError) in
            try settle(&s)
            if !keepSize && r.upperBound > s.size {
                s.size = r.upperBound
                s.changed = true
                s.lastChange = nowNanos()
            }
            // Only the newly reserved parts add holes: the cost is the range's, not the file's.
            for added in s.reserved.gaps(in: r) { s.reserveHoles += Self.holeBytes(s, in: added) }
            s.reserved.insert(r)
            s.hasReserve = true
            publish(s)
        }
    }

    /// fallocate(2) PUNCH_HOLE and ZERO_RANGE: the bytes of `r` inside the file become
    /// zeros (a hole at the next commit). Punched ranges are freed; zeroed ones stay
    /// reserved (ext4's unwritten extents), and ZERO_RANGE without `keepSize` may extend
    /// the file. The caller checks the range.
    public func zero(_ r: Range<Int64>, keepSize: Bool, keepAllocated: Bool) throws(StoreError) {
        try state.withLock { (s) throws(StoreError) in
            try settle(&s)
            let inside = r.lowerBound..<max(r.lowerBound, min(r.upperBound, s.size))
            // Holes and base bytes change only within r: counted there before and after.
            s.reserveHoles -= Self.reservedHoles(s, in: r)
            if !inside.isEmpty {
                for newly in s.zeroed.gaps(in: inside) { s.baseStored -= Self.visibleBaseBytes(s, in: newly) }
                s.dirty.remove(inside)
                if s.dirty.isEmpty { s.staging.removeAll() }
                s.zeroed.insert(inside)
            }
            if !keepSize && r.upperBound > s.size { s.size = r.upperBound }
            if keepAllocated {
                s.reserved.insert(r)
                s.hasReserve = true
            } else {
                s.reserved.remove(r)
            }
            s.reserveHoles += Self.reservedHoles(s, in: r)
            s.changed = true
            s.lastChange = nowNanos()
            publish(s)
        }
    }

    /// If anything changed since the last commit: chunks the changed parts into the chunk
    /// store, calls `record` with the new chunk list (still under this content's lock, so
    /// commits of one file are recorded in order), and makes the list `record` returns
    /// (usually the same) the new base. Returns whether a commit happened.
    /// - Parameter proceed: asked under the content's lock, before anything is done: false
    ///   leaves the changes for a later commit (a last close that a new open overtook).
    @discardableResult
    public func commit(chunker: Chunker? = nil, proceed: () -> Bool = { true },
                       record: (ChunkList) throws(StoreError) -> ChunkList) throws(StoreError) -> Bool {
        let chunker = chunker ?? chunks.chunker
        return try state.withLock { (s) throws(StoreError) -> Bool in
            guard s.changed, proceed() else { return false }
            let list: ChunkList
            func store(_ s: inout State) throws(StoreError) -> ChunkList {
                if let stream = s.stream, chunker == stream.chunker {
                    var streamed = try stream.finished(into: chunks)
                    // A preallocated file's unwritten rest.
                    if s.size > streamed.totalSize { streamed.appendHole(s.size - streamed.totalSize) }
                    return try record(streamed)
                }
                try settle(&s)
                return try record(try rechunk(&s, chunker: chunker))
            }
            do throws(StoreError) {
                list = try givingBackDrawnSpace { () throws(StoreError) in try store(&s) }
            } catch {
                if case .invalidContent = error {
                    s.refusedChange = s.lastChange
                    publish(s)
                }
                throw error
            }
            s.base = list
            s.baseLimit = list.totalSize
            s.baseStored = list.storedBytes
            s.dirty.removeAll()
            s.zeroed = ByteRanges()
            s.stream = nil
            s.committedBase = nil
            s.changed = false
            s.staging.removeAll()
            s.reserveHoles = reserveHoles(s)
            publish(s)
            return true
        }
    }

    /// Drops uncommitted writes: the content is its base again.
    public func discardChanges() {
        state.withLock { s in
            let base = s.committedBase ?? s.base
            let (reserved, hasReserve) = (s.reserved, s.hasReserve)
            s = State(base: base, baseLimit: base.totalSize, size: base.totalSize, baseStored: base.storedBytes,
                      staging: s.staging, lastChange: s.lastChange)
            s.reserved = reserved
            s.hasReserve = hasReserve
            s.reserveHoles = reserveHoles(s)
            s.staging.removeAll()
            publish(s)
        }
    }

    /// Starts a stream when a write continues a file written so far only in order from
    /// its start, none of its committed bytes left, past the staging memory (smaller files
    /// stay in memory until their commit anyway): the bytes staged so far move into it.
    /// Or when the first write of a preallocated file (fallocate, then written from its
    /// start: fio's default, databases, downloaders) starts at 0 and it holds nothing but
    /// holes: the stream starts empty and the rest of the file stays a hole (staging such
    /// writes and reading them back at the commit would cost a good part of their speed).
    private func startStream(_ s: inout State, at offset: Int64) throws(StoreError) {
        if offset == 0, s.size >= Int64(StagingBuffer.memoryLimit), s.baseStored == 0, s.dirty.isEmpty, s.zeroed.isEmpty {
            s.stream = SequentialStream(startingWith: [], store: chunks, announce: announce)
            return
        }
        guard offset == s.size, s.baseLimit == 0, s.zeroed.isEmpty, s.size >= Int64(StagingBuffer.memoryLimit),
              s.dirty.extents.count == 1, s.dirty.extents[0].range == 0..<s.size, s.dirty.extents[0].staged == 0 else { return }
        var bytes = [UInt8](repeating: 0, count: Int(s.size))
        let staging = s.staging
        var failure: SystemError?
        bytes.withUnsafeMutableBytes { raw in
            do throws(SystemError) { try staging.read(into: raw, at: 0) } catch { failure = error }
        }
        if let failure { throw .io(errno: failure.code, failure.context) }
        s.stream = SequentialStream(startingWith: bytes, store: chunks, announce: announce)
        s.dirty.removeAll()
        s.staging.removeAll()
    }

    /// Ends the stream before anything but an append (a read, a write elsewhere, a
    /// truncation): its chunks become the base the overlay lies on (the committed base
    /// showed no bytes, so nothing of it is lost), its pending bytes are staged.
    private func settle(_ s: inout State) throws(StoreError) {
        guard let stream = s.stream else { return }
        let streamed = try stream.storedChunks()
        let pending = stream.pendingBytes
        let start = streamed.totalSize
        if !pending.isEmpty {
            let range = start..<start + Int64(pending.count)
            let at = s.dirty.location(for: range)
            let staging = s.staging
            try withBytes(Array(pending)) { (raw) throws(StoreError) in
                try StoreError.wrap { () throws(SystemError) in try staging.write(raw, at: at) }
            }
            s.dirty.place(range)
        }
        if s.committedBase == nil { s.committedBase = s.base }
        s.base = streamed
        s.baseLimit = start
        s.baseStored = streamed.storedBytes
        s.stream = nil
    }

    /// The new chunk list. Base pieces untouched by writes and truncation are reused as
    /// they are; zeros nobody wrote (a base hole, or past the old end) become one hole;
    /// the rest (written bytes, changed chunks) is read through the overlay and cut again.
    /// The work is proportional to the pieces and the bytes written, never to the size.
    private func rechunk(_ s: inout State, chunker: Chunker) throws(StoreError) -> ChunkList {
        let baseEnd = min(s.baseLimit, s.base.totalSize)
        var list = ChunkList()
        var window: [UInt8] = []
        var windowStart: Int64 = 0
        var pos: Int64 = 0
        while pos < s.size {
            let i = pos < baseEnd ? s.base.index(containing: pos) : -1
            if i >= 0 && s.base.offsets[i] == pos {
                let range = s.base.range(i)
                if range.upperBound <= baseEnd && range.upperBound <= s.size && !s.dirty.overlaps(range) && !s.zeroed.overlaps(range) {
                    list.append(pieceOf: s.base, at: i)
                    pos = range.upperBound
                    continue
                }
            }
            let staged = s.dirty.extent(containing: pos)
            let punched = s.zeroed.range(containing: pos)
            if staged == nil && (i < 0 || s.base.isHole(i) || punched != nil) {
                let zerosEnd = punched?.upperBound ?? (i < 0 ? s.size : min(s.base.offsets[i + 1], baseEnd))
                let end = min(zerosEnd, s.dirty.nextStart(atOrAfter: pos) ?? s.size, s.size)
                list.appendHole(end - pos)
                pos = end
                continue
            }
            // A chunk holds data only: it ends where the data does (a hole nobody wrote, a
            // punched range), so zeros after a write stay a hole and cost nothing (a cut
            // that ran on into them would store a 256 KiB chunk for a 4 KiB write: t-limits).
            let limit = min(s.size, pos + Int64(chunker.maxSize))
            var dataEnd = pos
            while dataEnd < limit {
                let run = Self.run(s, at: dataEnd)
                guard run.data else { break }
                dataEnd = run.end
            }
            let want = Int(min(limit, dataEnd) - pos)
            if pos < windowStart || pos + Int64(want) > windowStart + Int64(window.count) {
                // Read ahead in 1 MiB blocks so a long rewrite is read once, not per chunk.
                window = try readMerged(&s, offset: pos, count: max(want, 1 << 20))
                windowStart = pos
            }
            let from = Int(pos - windowStart)
            let length = try withBytes(window) { (raw) throws(StoreError) -> Int in
                let piece = UnsafeRawBufferPointer(rebasing: raw[from..<from + want])
                let length = chunker.cut(piece)
                try list.append(UnsafeRawBufferPointer(rebasing: piece[0..<length])) { (id, chunk) throws(StoreError) in
                    try chunks.putWritten(id, chunk, announce: announce)
                }
                return length
            }
            pos += Int64(length)
        }
        return list
    }

    /// The bytes at `offset` through the overlay: staged writes over base chunks over
    /// zeros. `count` is bounded by the caller (a request, or a 1 MiB window).
    private func readMerged(_ s: inout State, offset: Int64, count: Int) throws(StoreError) -> [UInt8] {
        guard offset < s.size, count > 0 else { return [] }
        let end = offset + min(Int64(count), s.size - offset)
        // The base chunks under the range first (each verified); then every byte of `out`
        // is written once: copied from them, or zeroed where none is (zeroing it all before
        // the copy would write it twice, a cost a cold read feels).
        var copies: [(bytes: [UInt8], from: Int, into: Range<Int>)] = []
        let baseEnd = min(end, s.baseLimit, s.base.totalSize)
        if offset < baseEnd {
            var i = s.base.index(containing: offset)
            while i < s.base.count && s.base.offsets[i] < baseEnd {
                let chunkRange = s.base.range(i)
                let want = max(chunkRange.lowerBound, offset)..<min(chunkRange.upperBound, baseEnd)
                // Holes are zeros; a chunk wholly rewritten need not be read (nor verified).
                if !s.base.isHole(i) && !Self.hidden(s, want) {
                    // Fetched here when not local (a rewrite of a file not downloaded): under
                    // this file's lock only, never the filesystem's.
                    let bytes = try chunks.read(piece: i, of: s.base)
                    copies.append((bytes, Int(want.lowerBound - chunkRange.lowerBound), Int(want.lowerBound - offset)..<Int(want.upperBound - offset)))
                }
                i += 1
            }
        }
        let length = Int(end - offset)
        var out = [UInt8](unsafeUninitializedCapacity: length) { buffer, initialized in
            let start = buffer.baseAddress!
            var filled = 0
            for copy in copies {
                (start + filled).initialize(repeating: 0, count: copy.into.lowerBound - filled)
                copy.bytes.withUnsafeBufferPointer { (start + copy.into.lowerBound).initialize(from: $0.baseAddress! + copy.from, count: copy.into.count) }
                filled = copy.into.upperBound
            }
            (start + filled).initialize(repeating: 0, count: length - filled)
            initialized = length
        }
        for punched in s.zeroed.ranges where punched.overlaps(offset..<end) {
            let lower = Int(max(punched.lowerBound, offset) - offset), upper = Int(min(punched.upperBound, end) - offset)
            out.replaceSubrange(lower..<upper, with: repeatElement(0, count: upper - lower))
        }
        for piece in s.dirty.pieces(in: offset..<end) {
            let count = Int(piece.range.upperBound - piece.range.lowerBound)
            let into = Int(piece.range.lowerBound - offset)
            let staging = s.staging
            var failure: SystemError?
            out.withUnsafeMutableBytes { raw in
                do throws(SystemError) { try staging.read(into: UnsafeMutableRawBufferPointer(rebasing: raw[into..<into + count]), at: piece.staged) }
                catch { failure = error }
            }
            if let failure { throw .io(errno: failure.code, failure.context) }
        }
        return out
    }
}
