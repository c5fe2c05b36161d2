import Glibc

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
        var dirty = IntervalSet()
        /// Set by any write or truncate since the last commit.
        var changed = false
        var stagingFD: Int32 = -1
        var lastChange: Nanos = 0
        /// `lastChange` of content whose commit was refused as invalid (`.invalidContent`).
        var refusedChange: Nanos?
        /// Where the last read ended (to recognise sequential reading).
        var lastReadEnd: Int64 = -1
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
    }
    private let stagingDirectory: String

    public init(base: ChunkList, chunks: ChunkStore, stagingDirectory: String) {
        state = Locked(State(base: base, baseLimit: base.totalSize, size: base.totalSize))
        summary = Locked(Summary(size: base.totalSize))
        self.chunks = chunks
        self.stagingDirectory = stagingDirectory
    }

    deinit {
        state.withLock { s in if s.stagingFD >= 0 { close(s.stagingFD) } }
    }

    public var size: Int64 { summary.withLock { $0.size } }
    public var isChanged: Bool { summary.withLock { $0.changed } }
    /// Whether bytes were written since the last commit (not just a truncation).
    public var hasWrites: Bool { summary.withLock { $0.hasWrites } }
    /// The current changes were refused by the last commit (and nothing changed since).
    public var isRefused: Bool { summary.withLock { $0.refused } }
    /// When the content last changed (for the idle autosave).
    public var lastChange: Nanos { summary.withLock { $0.lastChange } }

    /// Called under the content lock after every change of `s`.
    private func publish(_ s: State) {
        summary.withLock {
            $0 = Summary(size: s.size, changed: s.changed, hasWrites: !s.dirty.isEmpty,
                         refused: s.changed && s.refusedChange == s.lastChange, lastChange: s.lastChange)
        }
    }

    public func read(offset: Int64, count: Int) throws(StoreError) -> [UInt8] {
        // Fetch and verify the base chunks outside the lock, so parallel reads (kernel
        // readahead) hash in parallel; the assembly under the lock then hits the cache.
        let (needed, ahead) = state.withLock { s -> ([ChunkID], [ChunkID]) in
            let end = min(offset + Int64(count), s.size, s.baseLimit, s.base.totalSize)
            guard offset < end else { return ([], []) }
            var ids: [ChunkID] = []
            var i = s.base.index(containing: offset)
            while i < s.base.count && s.base.offsets[i] < end { ids.append(s.base.ids[i]); i += 1 }
            // Sequential reading: fetch the next few chunks (about 1 MiB) ahead.
            var ahead: [ChunkID] = []
            if offset == s.lastReadEnd {
                while i < s.base.count && ahead.count < 16 && s.base.offsets[i] < end + (1 << 20) {
                    ahead.append(s.base.ids[i])
                    i += 1
                }
            }
            s.lastReadEnd = offset + Int64(count)
            return (ids, ahead)
        }
        if !ahead.isEmpty { chunks.prefetch(ahead) }
        for id in needed { _ = try chunks.read(id) }
        return try state.withLock { (s) throws(StoreError) in try readMerged(&s, offset: offset, count: count) }
    }

    public func write(offset: Int64, _ data: UnsafeRawBufferPointer) throws(StoreError) {
        try state.withLock { (s) throws(StoreError) in
            if s.stagingFD < 0 { s.stagingFD = try makeStagingFile(in: stagingDirectory) }
            var done = 0
            while done < data.count {
                let n = pwrite(s.stagingFD, data.baseAddress! + done, data.count - done, off_t(offset) + off_t(done))
                if n < 0 { if errno == EINTR { continue }; throw .io(errno: errno, "write staging data") }
                done += n
            }
            let end = offset + Int64(data.count)
            s.dirty.insert(offset..<end)
            s.size = max(s.size, end)
            s.changed = true
            s.lastChange = nowNanos()
            publish(s)
        }
    }

    public func truncate(_ newSize: Int64) throws(StoreError) {
        state.withLock { s in
            if newSize < s.size {
                s.dirty.clip(to: newSize)
                s.baseLimit = min(s.baseLimit, newSize)
                if s.stagingFD >= 0 { _ = ftruncate(s.stagingFD, off_t(newSize)) }
            }
            s.size = newSize
            s.changed = true
            s.lastChange = nowNanos()
            publish(s)
        }
    }

    /// If anything changed since the last commit: chunks the changed parts into the chunk
    /// store, calls `record` with the new chunk list (still under this content's lock, so
    /// commits of one file are recorded in order), and makes the list `record` returns
    /// (usually the same) the new base. Returns whether a commit happened.
    @discardableResult
    public func commit(chunker: Chunker = .standard, record: (ChunkList) throws(StoreError) -> ChunkList) throws(StoreError) -> Bool {
        try state.withLock { (s) throws(StoreError) -> Bool in
            guard s.changed else { return false }
            let list: ChunkList
            do throws(StoreError) {
                list = try record(try rechunk(&s, chunker: chunker))
            } catch {
                if case .invalidContent = error {
                    s.refusedChange = s.lastChange
                    publish(s)
                }
                throw error
            }
            s.base = list
            s.baseLimit = list.totalSize
            s.dirty.removeAll()
            s.changed = false
            if s.stagingFD >= 0 { _ = ftruncate(s.stagingFD, 0) }
            publish(s)
            return true
        }
    }

    /// Drops uncommitted writes: the content is its base again.
    public func discardChanges() {
        state.withLock { s in
            s = State(base: s.base, baseLimit: s.base.totalSize, size: s.base.totalSize, stagingFD: s.stagingFD, lastChange: s.lastChange)
            if s.stagingFD >= 0 { _ = ftruncate(s.stagingFD, 0) }
            publish(s)
        }
    }

    /// The new chunk list: base chunks untouched by writes and truncation are reused as they
    /// are; the rest is read through the overlay and cut again.
    private func rechunk(_ s: inout State, chunker: Chunker) throws(StoreError) -> ChunkList {
        var reusable: [Int64: Int] = [:]
        for i in 0..<s.base.count {
            let range = s.base.offsets[i]..<s.base.offsets[i + 1]
            if range.upperBound <= s.baseLimit && range.upperBound <= s.size && !s.dirty.overlaps(range) {
                reusable[range.lowerBound] = i
            }
        }
        var list = ChunkList()
        var window: [UInt8] = []
        var windowStart: Int64 = 0
        var pos: Int64 = 0
        // Holes (past the truncated base, never written) read as zeros, and a window of
        // zeros always cuts the same way: append that chunk without reading or hashing,
        // so a sparse 5 GiB file commits in milliseconds.
        let baseEnd = min(s.baseLimit, s.base.totalSize)
        var zero: (id: ChunkID, length: Int)?
        while pos < s.size {
            if let i = reusable[pos] {
                list.append(s.base.ids[i], size: Int(s.base.sizes[i]))
                pos = s.base.offsets[i + 1]
                continue
            }
            let want = Int(min(Int64(chunker.maxSize), s.size - pos))
            if want == chunker.maxSize && pos >= baseEnd && !s.dirty.overlaps(pos..<pos + Int64(want)) {
                if zero == nil { zero = try zeroChunk(chunker) }
                list.append(zero!.id, size: zero!.length)
                pos += Int64(zero!.length)
                continue
            }
            if pos < windowStart || pos + Int64(want) > windowStart + Int64(window.count) {
                // Read ahead in 1 MiB blocks so a long rewrite is read once, not per chunk.
                window = try readMerged(&s, offset: pos, count: max(want, 1 << 20))
                windowStart = pos
            }
            let from = Int(pos - windowStart)
            let length = try withBytes(window) { (raw) throws(StoreError) -> Int in
                let piece = UnsafeRawBufferPointer(rebasing: raw[from..<from + want])
                let length = chunker.cut(piece)
                let chunk = UnsafeRawBufferPointer(rebasing: piece[0..<length])
                let id = ChunkID(hashing: chunk)
                try chunks.put(id, chunk)
                list.append(id, size: length)
                return length
            }
            pos += Int64(length)
        }
        return list
    }

    /// The chunk a run of at least `maxSize` zeros starts with (stored once).
    private func zeroChunk(_ chunker: Chunker) throws(StoreError) -> (id: ChunkID, length: Int) {
        let zeros = [UInt8](repeating: 0, count: chunker.maxSize)
        return try withBytes(zeros) { (raw) throws(StoreError) in
            let length = chunker.cut(raw)
            let piece = UnsafeRawBufferPointer(rebasing: raw[0..<length])
            let id = ChunkID(hashing: piece)
            try chunks.put(id, piece)
            return (id, length)
        }
    }

    private func readMerged(_ s: inout State, offset: Int64, count: Int) throws(StoreError) -> [UInt8] {
        let end = min(offset + Int64(count), s.size)
        guard offset < end else { return [] }
        var out = [UInt8](repeating: 0, count: Int(end - offset))
        let baseEnd = min(end, s.baseLimit, s.base.totalSize)
        if offset < baseEnd {
            var i = s.base.index(containing: offset)
            while i < s.base.count && s.base.offsets[i] < baseEnd {
                let chunkRange = s.base.offsets[i]..<s.base.offsets[i + 1]
                let want = max(chunkRange.lowerBound, offset)..<min(chunkRange.upperBound, baseEnd)
                // A chunk wholly rewritten need not be read (nor verified) at all.
                if !s.dirty.intersections(with: want).elementsEqual([want]) {
                    let bytes = try chunks.read(s.base.ids[i])
                    guard bytes.count == Int(s.base.sizes[i]) else { throw .corruptChunk(s.base.ids[i]) }
                    let from = Int(want.lowerBound - chunkRange.lowerBound)
                    let to = Int(want.upperBound - chunkRange.lowerBound)
                    out.replaceSubrange(Int(want.lowerBound - offset)..<Int(want.upperBound - offset), with: bytes[from..<to])
                }
                i += 1
            }
        }
        for r in s.dirty.intersections(with: offset..<end) {
            var done = 0
            let total = Int(r.upperBound - r.lowerBound)
            while done < total {
                let n = out.withUnsafeMutableBytes { raw in
                    pread(s.stagingFD, raw.baseAddress! + Int(r.lowerBound - offset) + done, total - done, off_t(r.lowerBound) + off_t(done))
                }
                if n < 0 { if errno == EINTR { continue }; throw .io(errno: errno, "read staging data") }
                if n == 0 { break } // a hole past the staging file's end reads as zeros
                done += n
            }
        }
        return out
    }
}

func makeStagingFile(in directory: String) throws(StoreError) -> Int32 {
    // O_TMPFILE (Linux, x86_64 and arm64 value) is hidden behind _GNU_SOURCE in Glibc.
    let oTmpFile: Int32 = 0o20000000 | O_DIRECTORY
    let fd = open(directory, O_RDWR | oTmpFile | O_CLOEXEC, 0o600)
    if fd >= 0 { return fd }
    // O_TMPFILE is not supported everywhere (some network filesystems): create and unlink.
    let path = directory + "/" + randomHex(bytes: 8)
    let named = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
    if named < 0 { throw .io(errno: errno, "create staging file in \(directory)") }
    unlink(path)
    return named
}
