/// CRC-32C (Castagnoli: the polynomial of iSCSI, ext4 and LevelDB's logs), reflected, with
/// the usual pre- and post-inversion, computed a word at a time (slicing by 8).
///
/// For checks that must find a torn or damaged write, not a forgery: the logs' frames
/// live in the device's own store. About 2 instructions a byte, where SHA-256 without the
/// CPU's SHA extensions takes some 36.
public enum CRC32C {
    /// `CRC32C.checksum("123456789".utf8)` is this (the standard check value).
    public static let checkValue: UInt32 = 0xE306_9283

    /// Table k maps a byte to its contribution k bytes further on: 8 × 256 entries.
    private static let tables: [UInt32] = {
        var t = [UInt32](repeating: 0, count: 8 * 256)
        for i in 0..<256 {
            var c = UInt32(i)
            for _ in 0..<8 { c = c & 1 != 0 ? (c >> 1) ^ 0x82F6_3B78 : c >> 1 }
            t[i] = c
        }
        for k in 1..<8 {
            for i in 0..<256 {
                let prior = t[(k - 1) * 256 + i]
                t[k * 256 + i] = (prior >> 8) ^ t[Int(prior & 0xff)]
            }
        }
        return t
    }()

    /// The checksum of the buffers one after another, as if they were one.
    public static func checksum(_ buffers: UnsafeRawBufferPointer...) -> UInt32 {
        var crc = Running()
        for buffer in buffers { crc.update(buffer) }
        return crc.value
    }

    /// A checksum taken a piece at a time.
    public struct Running {
        private var state: UInt32 = 0xFFFF_FFFF
        public init() {}
        public mutating func update(_ bytes: UnsafeRawBufferPointer) { state = CRC32C.update(state, bytes) }
        public var value: UInt32 { ~state }
    }

    public static func checksum(_ bytes: some Sequence<UInt8>) -> UInt32 {
        Array(bytes).withUnsafeBytes { checksum($0) }
    }

    /// Folds `bytes` into a running (inverted) value.
    private static func update(_ start: UInt32, _ bytes: UnsafeRawBufferPointer) -> UInt32 {
        tables.withUnsafeBufferPointer { t in
            var crc = start
            var i = 0
            let n = bytes.count
            while n - i >= 8 {
                let word = UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: i, as: UInt64.self)) ^ UInt64(crc)
                crc = t[7 * 256 + Int(word & 0xff)] ^ t[6 * 256 + Int((word >> 8) & 0xff)]
                    ^ t[5 * 256 + Int((word >> 16) & 0xff)] ^ t[4 * 256 + Int((word >> 24) & 0xff)]
                    ^ t[3 * 256 + Int((word >> 32) & 0xff)] ^ t[2 * 256 + Int((word >> 40) & 0xff)]
                    ^ t[1 * 256 + Int((word >> 48) & 0xff)] ^ t[Int(word >> 56)]
                i += 8
            }
            while i < n {
                crc = (crc >> 8) ^ t[Int((crc ^ UInt32(bytes[i])) & 0xff)]
                i += 1
            }
            return crc
        }
    }
}
