/// Saturating arithmetic for numbers that come from outside (the kernel, the store, a
/// setting): Swift traps on overflow, and a size or a time at the edge of its range must
/// not stop the daemon. The result is clamped to Int64's range.
extension Int64 {
    public func addingClamped(_ other: Int64) -> Int64 {
        let (sum, overflow) = addingReportingOverflow(other)
        return overflow ? (other > 0 ? .max : .min) : sum
    }

    public func subtractingClamped(_ other: Int64) -> Int64 {
        let (difference, overflow) = subtractingReportingOverflow(other)
        return overflow ? (other < 0 ? .max : .min) : difference
    }

    public func multipliedClamped(by other: Int64) -> Int64 {
        let (product, overflow) = multipliedReportingOverflow(by: other)
        return overflow ? ((self < 0) == (other < 0) ? .max : .min) : product
    }
}
