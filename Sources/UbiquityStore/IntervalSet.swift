/// Disjoint, sorted half-open byte ranges: the parts of an open file written since its
/// last commit. Appending after the last range (the common sequential write) is O(1).
public struct IntervalSet: Sendable, Equatable {
    public private(set) var ranges: [Range<Int64>] = []

    public init() {}

    public var isEmpty: Bool { ranges.isEmpty }

    public mutating func insert(_ r: Range<Int64>) {
        guard !r.isEmpty else { return }
        if let last = ranges.last, last.upperBound <= r.lowerBound {
            if last.upperBound == r.lowerBound { ranges[ranges.count - 1] = last.lowerBound..<r.upperBound } else { ranges.append(r) }
            return
        }
        // First range that ends at or after r starts (touching ranges merge).
        let first = firstIndex { $0.upperBound >= r.lowerBound }
        var lower = r.lowerBound, upper = r.upperBound
        var end = first
        while end < ranges.count && ranges[end].lowerBound <= upper {
            lower = min(lower, ranges[end].lowerBound)
            upper = max(upper, ranges[end].upperBound)
            end += 1
        }
        ranges.replaceSubrange(first..<end, with: [lower..<upper])
    }

    /// Drops everything at or beyond `size` (truncate).
    public mutating func clip(to size: Int64) {
        while let last = ranges.last, last.upperBound > size {
            ranges.removeLast()
            if last.lowerBound < size { ranges.append(last.lowerBound..<size) }
        }
    }

    /// Whether any range overlaps `r`.
    public func overlaps(_ r: Range<Int64>) -> Bool {
        let i = firstIndex { $0.upperBound > r.lowerBound }
        return i < ranges.count && ranges[i].lowerBound < r.upperBound
    }

    /// The ranges intersected with `r`, in order.
    public func intersections(with r: Range<Int64>) -> [Range<Int64>] {
        var out: [Range<Int64>] = []
        var i = firstIndex { $0.upperBound > r.lowerBound }
        while i < ranges.count && ranges[i].lowerBound < r.upperBound {
            out.append(max(ranges[i].lowerBound, r.lowerBound)..<min(ranges[i].upperBound, r.upperBound))
            i += 1
        }
        return out
    }

    public mutating func removeAll() { ranges.removeAll() }

    /// Binary search: the first index whose range satisfies a monotone predicate.
    private func firstIndex(where predicate: (Range<Int64>) -> Bool) -> Int {
        var lo = 0, hi = ranges.count
        while lo < hi {
            let mid = (lo + hi) / 2
            if predicate(ranges[mid]) { hi = mid } else { lo = mid + 1 }
        }
        return lo
    }
}
