/// A set of byte ranges of a file, kept sorted, disjoint and merged: the ranges a punch or
/// zero-range left reading as zeros, and the ranges fallocate reserved (`FileContent`).
/// Lookups are binary searches (a file may gain thousands of punches from a discard, and
/// the content looks up per piece); insert and remove are linear in the ranges kept.
struct ByteRanges: Sendable, Equatable {
    private(set) var ranges: [Range<Int64>] = []

    var isEmpty: Bool { ranges.isEmpty }

    /// The first index whose range ends after `offset`.
    private func firstEnding(after offset: Int64) -> Int {
        var lo = 0, hi = ranges.count
        while lo < hi {
            let mid = (lo + hi) / 2
            if ranges[mid].upperBound > offset { hi = mid } else { lo = mid + 1 }
        }
        return lo
    }

    mutating func insert(_ r: Range<Int64>) {
        guard !r.isEmpty else { return }
        // Ranges touching or overlapping r merge into it.
        var first = firstEnding(after: r.lowerBound - 1)
        if first > 0 && ranges[first - 1].upperBound == r.lowerBound { first -= 1 }
        var end = first
        var lower = r.lowerBound, upper = r.upperBound
        while end < ranges.count && ranges[end].lowerBound <= upper {
            lower = min(lower, ranges[end].lowerBound)
            upper = max(upper, ranges[end].upperBound)
            end += 1
        }
        ranges.replaceSubrange(first..<end, with: [lower..<upper])
    }

    mutating func remove(_ r: Range<Int64>) {
        guard !r.isEmpty else { return }
        let first = firstEnding(after: r.lowerBound)
        var end = first
        var kept: [Range<Int64>] = []
        while end < ranges.count && ranges[end].lowerBound < r.upperBound {
            let x = ranges[end]
            if x.lowerBound < r.lowerBound { kept.append(x.lowerBound..<r.lowerBound) }
            if x.upperBound > r.upperBound { kept.append(r.upperBound..<x.upperBound) }
            end += 1
        }
        ranges.replaceSubrange(first..<end, with: kept)
    }

    /// Drops everything at or beyond `size`.
    mutating func clip(to size: Int64) { remove(size..<Int64.max) }

    /// The range containing `offset`, if any.
    func range(containing offset: Int64) -> Range<Int64>? {
        let i = firstEnding(after: offset)
        return i < ranges.count && ranges[i].lowerBound <= offset ? ranges[i] : nil
    }

    func overlaps(_ r: Range<Int64>) -> Bool {
        guard !r.isEmpty else { return false }
        let i = firstEnding(after: r.lowerBound)
        return i < ranges.count && ranges[i].lowerBound < r.upperBound
    }

    /// Where the first range at or after `offset` starts (nil: none).
    func nextStart(atOrAfter offset: Int64) -> Int64? {
        let i = firstEnding(after: offset)
        return i < ranges.count ? max(ranges[i].lowerBound, offset) : nil
    }

    /// The ranges intersected with `r`, in order.
    func pieces(in r: Range<Int64>) -> [Range<Int64>] {
        var out: [Range<Int64>] = []
        var i = firstEnding(after: r.lowerBound)
        while i < ranges.count && ranges[i].lowerBound < r.upperBound {
            out.append(max(ranges[i].lowerBound, r.lowerBound)..<min(ranges[i].upperBound, r.upperBound))
            i += 1
        }
        return out
    }

    /// The parts of `r` no range covers.
    func gaps(in r: Range<Int64>) -> [Range<Int64>] {
        var out: [Range<Int64>] = []
        var at = r.lowerBound
        for x in pieces(in: r) {
            if x.lowerBound > at { out.append(at..<x.lowerBound) }
            at = x.upperBound
        }
        if at < r.upperBound { out.append(at..<r.upperBound) }
        return out
    }
}
