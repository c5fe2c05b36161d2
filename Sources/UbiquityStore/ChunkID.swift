import Crypto
import UbiquitySystem

/// A chunk's name: the SHA-256 of its bytes. Chunks are immutable, so the name is also the
/// proof of integrity: every read re-hashes and compares.
public struct ChunkID: Hashable, Sendable, CustomStringConvertible {
    /// The 32 digest bytes as four words, so hashing and comparing stay cheap.
    let a, b, c, d: UInt64

    /// Not a chunk: marks a hole in a `ChunkList` (no SHA-256 output is all zeros in practice).
    public static let hole = ChunkID(words: (0, 0, 0, 0))

    private init(words: (UInt64, UInt64, UInt64, UInt64)) { (a, b, c, d) = words }

    public init(hashing bytes: UnsafeRawBufferPointer) {
        let digest = SHA256.hash(data: bytes)
        var words: (UInt64, UInt64, UInt64, UInt64) = (0, 0, 0, 0)
        digest.withUnsafeBytes { raw in
            withUnsafeMutableBytes(of: &words) { $0.copyMemory(from: raw) }
        }
        (a, b, c, d) = words
    }

    public init(hashing bytes: [UInt8]) {
        self = bytes.withUnsafeBytes { ChunkID(hashing: $0) }
    }

    /// Reads 32 raw digest bytes.
    public init?(raw: some Collection<UInt8>) {
        guard raw.count == 32 else { return nil }
        var words: (UInt64, UInt64, UInt64, UInt64) = (0, 0, 0, 0)
        withUnsafeMutableBytes(of: &words) { dest in
            for (i, byte) in raw.enumerated() { dest[i] = byte }
        }
        (a, b, c, d) = words
    }

    /// Parses 64 lowercase hex digits.
    public init?(hex: String) {
        guard Hex.isLowercase(hex, count: 64), let raw = Hex.decode(hex) else { return nil }
        self.init(raw: raw)
    }

    public var raw: [UInt8] {
        var words = (a, b, c, d)
        return withUnsafeBytes(of: &words) { Array($0) }
    }

    public var hex: String { withUnsafeBytes(of: (a, b, c, d)) { Hex.encode($0) } }

    public var description: String { hex }
}
