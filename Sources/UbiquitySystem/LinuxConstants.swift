import CUbiquity

/// Linux constants that Swift's Glibc module does not export (they need _GNU_SOURCE),
/// with their values from the C headers (CUbiquity).
public enum Linux {
    /// lseek(2) whence: the next data, the next hole.
    public static let seekData = ubq_seek_data
    public static let seekHole = ubq_seek_hole
    /// fallocate(2) mode bits.
    public static let fallocKeepSize = ubq_falloc_keep_size
    public static let fallocPunchHole = ubq_falloc_punch_hole
    public static let fallocZeroRange = ubq_falloc_zero_range

    /// fallocate(2): 0 or -1 and errno.
    public static func fallocate(_ fd: Int32, mode: Int32, offset: Int64, length: Int64) -> Int32 {
        ubq_fallocate(fd, mode, offset, length)
    }
}

/// At most `count` malloc arenas from now on (glibc makes up to eight per core, and each
/// keeps the memory freed into it). Call it before starting threads.
public func limitMallocArenas(_ count: Int32) { _ = ubq_limit_malloc_arenas(count) }
