/// A set of byte ranges of a file, kept sorted, disjoint and merged: the ranges a punch or
/// zero-range left reading as zeros, and the ranges fallocate reserved (`FileContent`).
/// Each operation is linear in the ranges it keeps, which a file gains only by fallocate
/// calls, never by writes.
struct ByteRanges: Sendable, Equatable {
    private(set) var ranges: [Range<Int64>] = []

    var isEmpty: Bool { ranges.isEmpty }

    mutating func insert(_ r: Range<Int64>) {
        guard !r.isEmpty else { return }
        var lower = r.lowerBound, upper = r.upperBound
        var kept: [Range<Int64>] = []
        kept.reserveCapacity(ranges.count + 1)
        for x in ranges {
            if x.upperBound < lower || x.lowerBound > upper {
                kept.append(x)
            } else { // overlapping or touching: merge
                lower = min(lower, x.lowerBound)
                upper = max(upper, x.upperBound)
            }
        }
        kept.append(lower..<upper)
        ranges = kept.sorted { $0.lowerBound < $1.lowerBound }
    }

    mutating func remove(_ r: Range<Int64>) {
        guard !r.isEmpty else { return }
        var kept: [Range<Int64>] = []
        for x in ranges {
            guard x.overlaps(r) else { kept.append(x); continue }
            if x.lowerBound < r.lowerBound { kept.append(x.lowerBound..<r.lowerBound) }
            if x.upperBound > r.upperBound { kept.append(r.upperBound..<x.upperBound) }
        }
        ranges = kept
    }

    /// Drops everything at or beyond `size`.
    mutating func clip(to size: Int64) { remove(size..<Int64.max) }

    /// The range containing `offset`, if any.
    func range(containing offset: Int64) -> Range<Int64>? { ranges.first { $0.contains(offset) } }

    func overlaps(_ r: Range<Int64>) -> Bool { ranges.contains { $0.overlaps(r) } }

    /// Where the first range at or after `offset` starts (nil: none).
    func nextStart(atOrAfter offset: Int64) -> Int64? {
        ranges.first { $0.upperBound > offset }.map { max($0.lowerBound, offset) }
    }

    /// The parts of `r` no range covers.
    func gaps(in r: Range<Int64>) -> [Range<Int64>] {
        var out: [Range<Int64>] = []
        var at = r.lowerBound
        for x in ranges where x.overlaps(r) {
            if x.lowerBound > at { out.append(at..<x.lowerBound) }
            at = max(at, x.upperBound)
        }
        if at < r.upperBound { out.append(at..<r.upperBound) }
        return out
    }
}
