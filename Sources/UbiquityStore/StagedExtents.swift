/// Where the bytes written to an open file since its last commit are kept in its staging
/// file: sorted, disjoint file ranges, each stored contiguously at a staging offset.
///
/// Why a map and not the file's own offsets: a write at offset 2^50 (after `truncate -s 1P`)
/// must cost its bytes, and the staging file lives on a disk filesystem whose files may
/// be far smaller than ours (ext4: 16 TiB). So staging is packed: a new range is appended
/// at the end of the staging file; an overwrite inside one range already staged reuses
/// its place (a database rewriting its pages does not grow staging); sequential writes
/// extend the last range. Appending after the last range (the common case) is O(1).
struct StagedExtents: Sendable, Equatable {
    struct Extent: Sendable, Equatable {
        var range: Range<Int64>
        /// Staging-file offset of `range.lowerBound`.
        var staged: Int64
    }

    private(set) var extents: [Extent] = []
    /// Bytes of the staging file in use (where the next new range goes).
    private(set) var stagingEnd: Int64 = 0
    /// Bytes staged in all ranges (what a reader of st_blocks counts as written).
    private(set) var stagedBytes: Int64 = 0

    var isEmpty: Bool { extents.isEmpty }

    /// Where a write of `r` would go in the staging file (what `place(r)` returns), so the
    /// bytes can be written before the map claims them.
    func location(for r: Range<Int64>) -> Int64 {
        let i = firstIndex { $0.range.upperBound > r.lowerBound }
        if i < extents.count, extents[i].range.lowerBound <= r.lowerBound, r.upperBound <= extents[i].range.upperBound {
            return extents[i].staged + (r.lowerBound - extents[i].range.lowerBound)
        }
        return stagingEnd
    }

    /// Records a write of `r` (not empty) and returns where its bytes go in the staging file.
    @discardableResult
    mutating func place(_ r: Range<Int64>) -> Int64 {
        let length = r.upperBound - r.lowerBound
        if let last = extents.last, last.range.upperBound <= r.lowerBound {
            // Sequential: extend the last range when it ends both here and at the staging end.
            if last.range.upperBound == r.lowerBound && last.staged + (last.range.upperBound - last.range.lowerBound) == stagingEnd {
                extents[extents.count - 1].range = last.range.lowerBound..<r.upperBound
            } else {
                extents.append(Extent(range: r, staged: stagingEnd))
            }
            stagedBytes += length
            defer { stagingEnd += length }
            return stagingEnd
        }
        let first = firstIndex { $0.range.upperBound > r.lowerBound }
        if first < extents.count, extents[first].range.lowerBound <= r.lowerBound, r.upperBound <= extents[first].range.upperBound {
            // An overwrite inside one staged range: in place.
            return extents[first].staged + (r.lowerBound - extents[first].range.lowerBound)
        }
        var replacement: [Extent] = []
        var end = first
        while end < extents.count && extents[end].range.lowerBound < r.upperBound {
            let e = extents[end]
            if e.range.lowerBound < r.lowerBound {
                replacement.append(Extent(range: e.range.lowerBound..<r.lowerBound, staged: e.staged))
            }
            if e.range.upperBound > r.upperBound {
                replacement.append(Extent(range: r.upperBound..<e.range.upperBound, staged: e.staged + (r.upperBound - e.range.lowerBound)))
            }
            stagedBytes -= e.range.upperBound - e.range.lowerBound
            end += 1
        }
        let new = Extent(range: r, staged: stagingEnd)
        // Keep the order: pieces before r, r, pieces after r.
        let before = replacement.filter { $0.range.upperBound <= r.lowerBound }
        let after = replacement.filter { $0.range.lowerBound >= r.upperBound }
        extents.replaceSubrange(first..<end, with: before + [new] + after)
        stagedBytes += length + (before + after).reduce(0) { $0 + ($1.range.upperBound - $1.range.lowerBound) }
        defer { stagingEnd += length }
        return stagingEnd
    }

    /// Drops everything at or beyond `size` (truncate). Returns true when nothing is staged
    /// any more (the caller may then empty the staging file).
    mutating func clip(to size: Int64) -> Bool {
        while let last = extents.last, last.range.upperBound > size {
            extents.removeLast()
            stagedBytes -= last.range.upperBound - last.range.lowerBound
            if last.range.lowerBound < size {
                extents.append(Extent(range: last.range.lowerBound..<size, staged: last.staged))
                stagedBytes += size - last.range.lowerBound
            }
        }
        if extents.isEmpty { stagingEnd = 0 }
        return extents.isEmpty
    }

    /// Forgets what is staged inside `r` (a punched hole): the pieces outside it keep
    /// their places in the staging file.
    mutating func remove(_ r: Range<Int64>) {
        let first = firstIndex { $0.range.upperBound > r.lowerBound }
        var end = first
        var kept: [Extent] = []
        while end < extents.count && extents[end].range.lowerBound < r.upperBound {
            let e = extents[end]
            if e.range.lowerBound < r.lowerBound { kept.append(Extent(range: e.range.lowerBound..<r.lowerBound, staged: e.staged)) }
            if e.range.upperBound > r.upperBound {
                kept.append(Extent(range: r.upperBound..<e.range.upperBound, staged: e.staged + (r.upperBound - e.range.lowerBound)))
            }
            stagedBytes -= e.range.upperBound - e.range.lowerBound
            end += 1
        }
        extents.replaceSubrange(first..<end, with: kept)
        stagedBytes += kept.reduce(0) { $0 + ($1.range.upperBound - $1.range.lowerBound) }
        if extents.isEmpty { stagingEnd = 0 }
    }

    mutating func removeAll() {
        extents.removeAll()
        stagingEnd = 0
        stagedBytes = 0
    }

    /// Whether any staged range overlaps `r`.
    func overlaps(_ r: Range<Int64>) -> Bool {
        let i = firstIndex { $0.range.upperBound > r.lowerBound }
        return i < extents.count && extents[i].range.lowerBound < r.upperBound
    }

    /// Whether staged ranges cover all of `r`.
    func covers(_ r: Range<Int64>) -> Bool {
        var at = r.lowerBound
        for piece in pieces(in: r) {
            if piece.range.lowerBound != at { return false }
            at = piece.range.upperBound
        }
        return at >= r.upperBound
    }

    /// The staged ranges intersected with `r`, in order, with their staging offsets.
    func pieces(in r: Range<Int64>) -> [Extent] {
        var out: [Extent] = []
        var i = firstIndex { $0.range.upperBound > r.lowerBound }
        while i < extents.count && extents[i].range.lowerBound < r.upperBound {
            let e = extents[i]
            let lower = max(e.range.lowerBound, r.lowerBound)
            out.append(Extent(range: lower..<min(e.range.upperBound, r.upperBound), staged: e.staged + (lower - e.range.lowerBound)))
            i += 1
        }
        return out
    }

    /// The staged range containing `offset`, if any.
    func extent(containing offset: Int64) -> Range<Int64>? {
        let i = firstIndex { $0.range.upperBound > offset }
        return i < extents.count && extents[i].range.lowerBound <= offset ? extents[i].range : nil
    }

    /// Where the first staged range at or after `offset` starts (nil: none).
    func nextStart(atOrAfter offset: Int64) -> Int64? {
        let i = firstIndex { $0.range.upperBound > offset }
        guard i < extents.count else { return nil }
        return max(extents[i].range.lowerBound, offset)
    }

    /// Binary search: the first index whose extent satisfies a monotone predicate.
    private func firstIndex(where predicate: (Extent) -> Bool) -> Int {
        var lo = 0, hi = extents.count
        while lo < hi {
            let mid = (lo + hi) / 2
            if predicate(extents[mid]) { hi = mid } else { lo = mid + 1 }
        }
        return lo
    }
}
