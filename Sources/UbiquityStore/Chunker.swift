/// Content-defined chunking, FastCDC-style (Xia et al., USENIX ATC 2016): a Gear rolling
/// hash with normalized chunking. A cut depends only on the bytes since the previous cut,
/// so an edit moves at most the cuts near it and the rest of a file dedups against its
/// previous version. Sizes: 16 KiB min / 64 KiB average / 256 KiB max; a file smaller than
/// the minimum is one chunk.
///
/// An encrypted container cuts with a table of its own, derived from its key (as borg
/// seeds its chunker), so the sizes of a known file's chunks do not give it away.
public struct Chunker: Sendable, Equatable {
    public let minSize: Int
    public let avgSize: Int
    public let maxSize: Int
    /// Stricter mask below the average size, looser above it ("normalized chunking", level 2):
    /// this narrows the size distribution around the average.
    private let maskSmall: UInt64
    private let maskLarge: UInt64
    /// The Gear hash's 256 words.
    private let gear: [UInt64]

    public static let standard = Chunker(minSize: 16 << 10, avgSize: 64 << 10, maxSize: 256 << 10)

    /// The standard sizes with another table: exactly 256 words (nil otherwise).
    public static func keyed(table: [UInt64]) -> Chunker? {
        guard table.count == 256 else { return nil }
        return Chunker(minSize: standard.minSize, avgSize: standard.avgSize, maxSize: standard.maxSize, gear: table)
    }

    public init(minSize: Int, avgSize: Int, maxSize: Int) {
        self.init(minSize: minSize, avgSize: avgSize, maxSize: maxSize, gear: standardGear)
    }

    private init(minSize: Int, avgSize: Int, maxSize: Int, gear: [UInt64]) {
        precondition(0 < minSize && minSize < avgSize && avgSize < maxSize && avgSize & (avgSize - 1) == 0)
        self.gear = gear
        self.minSize = minSize
        self.avgSize = avgSize
        self.maxSize = maxSize
        let bits = UInt64(avgSize.trailingZeroBitCount)
        // Gear shifts left, so the high bits depend on the last 64 bytes: mask the top bits.
        maskSmall = ~(UInt64.max >> (bits + 2))
        maskLarge = ~(UInt64.max >> (bits - 2))
    }

    /// The length of the chunk that starts at `data`'s first byte. Pass at least `maxSize`
    /// bytes, or all that is left of the input: the cut depends on nothing else.
    public func cut(_ data: UnsafeRawBufferPointer) -> Int {
        scan(data, limit: min(data.count, maxSize))
    }

    /// Scans for a cut in data[0..<limit]; returns `limit` when none is found.
    private func scan(_ data: UnsafeRawBufferPointer, limit: Int) -> Int {
        if limit <= minSize { return limit }
        let normal = min(limit, avgSize)
        let bytes = data.baseAddress!.assumingMemoryBound(to: UInt8.self)
        return self.gear.withUnsafeBufferPointer { gear -> Int in
            var hash: UInt64 = 0
            var i = minSize
            while i < normal {
                hash = (hash << 1) &+ gear[Int(bytes[i])]
                if hash & maskSmall == 0 { return i &+ 1 }
                i &+= 1
            }
            while i < limit {
                hash = (hash << 1) &+ gear[Int(bytes[i])]
                if hash & maskLarge == 0 { return i &+ 1 }
                i &+= 1
            }
            return limit
        }
    }
}

/// 256 pseudo-random words from SplitMix64 with a fixed seed. Changing the seed or the
/// generator changes every cut point and so breaks dedup against existing stores: never do.
private let standardGear: [UInt64] = {
    var state: UInt64 = 0x5562_6971_7569_7479 // "Ubiquity"
    return (0..<256).map { _ in
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}()
