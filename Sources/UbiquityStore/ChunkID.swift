import Crypto

/// A chunk's name: the SHA-256 of its bytes. Chunks are immutable, so the name is also the
/// proof of integrity: every read re-hashes and compares.
public struct ChunkID: Hashable, Sendable, CustomStringConvertible {
    /// The 32 digest bytes as four words, so hashing and comparing stay cheap.
    let a, b, c, d: UInt64

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
        let utf8 = Array(hex.utf8)
        guard utf8.count == 64 else { return nil }
        var raw = [UInt8](repeating: 0, count: 32)
        for i in 0..<32 {
            guard let hi = hexValue(utf8[2 * i]), let lo = hexValue(utf8[2 * i + 1]) else { return nil }
            raw[i] = hi << 4 | lo
        }
        self.init(raw: raw)
    }

    public var raw: [UInt8] {
        var words = (a, b, c, d)
        return withUnsafeBytes(of: &words) { Array($0) }
    }

    public var hex: String {
        let digits = Array("0123456789abcdef".utf8)
        var out = [UInt8]()
        out.reserveCapacity(64)
        for byte in raw {
            out.append(digits[Int(byte >> 4)])
            out.append(digits[Int(byte & 15)])
        }
        return String(decoding: out, as: UTF8.self)
    }

    public var description: String { hex }
}

private func hexValue(_ c: UInt8) -> UInt8? {
    switch c {
    case UInt8(ascii: "0")...UInt8(ascii: "9"): return c - UInt8(ascii: "0")
    case UInt8(ascii: "a")...UInt8(ascii: "f"): return c - UInt8(ascii: "a") + 10
    default: return nil
    }
}
