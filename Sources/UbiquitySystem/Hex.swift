import Glibc

/// Lowercase hexadecimal, the one encoding of ids and hashes on disk and in records.
public enum Hex {
    public static func encode(_ bytes: some Sequence<UInt8>) -> String {
        // Written straight into the string's storage: ids and inline chunks of every record
        // go through here (a generic append loop costs a visible share of the daemon's CPU
        // in a burst of small saves).
        let count = bytes.underestimatedCount
        if let exact = bytes.withContiguousStorageIfAvailable({ encode(contiguous: $0) }) { return exact }
        var out: [UInt8] = []
        out.reserveCapacity(count * 2)
        for b in bytes {
            out.append(digit(b >> 4))
            out.append(digit(b & 15))
        }
        return String(decoding: out, as: UTF8.self)
    }

    private static func encode(contiguous bytes: UnsafeBufferPointer<UInt8>) -> String {
        String(unsafeUninitializedCapacity: bytes.count * 2) { out in
            for (i, b) in bytes.enumerated() {
                out[2 * i] = digit(b >> 4)
                out[2 * i + 1] = digit(b & 15)
            }
            return bytes.count * 2
        }
    }

    /// Appends the digits of `bytes` to `out` (a journal line written in place).
    public static func append(_ bytes: UnsafeRawBufferPointer, to out: inout [UInt8]) {
        let start = out.count
        out.append(contentsOf: repeatElement(0, count: bytes.count * 2))
        out.withUnsafeMutableBufferPointer { out in
            guard let base = out.baseAddress?.advanced(by: start) else { return }
            for (i, b) in bytes.enumerated() {
                base[2 * i] = digit(b >> 4)
                base[2 * i + 1] = digit(b & 15)
            }
        }
    }

    /// The lowercase digit of a value 0...15.
    @inline(__always) private static func digit(_ value: UInt8) -> UInt8 {
        value < 10 ? 0x30 + value : 0x61 - 10 + value
    }

    /// Two digits for one byte value 0...255.
    public static func byte(_ value: Int) -> String { encode([UInt8(truncatingIfNeeded: value)]) }

    /// Decodes hex digits (either case); nil for an odd length or a non-digit.
    public static func decode(_ text: some StringProtocol) -> [UInt8]? {
        let utf8 = Array(text.utf8)
        guard utf8.count % 2 == 0 else { return nil }
        var out: [UInt8] = []
        out.reserveCapacity(utf8.count / 2)
        var i = 0
        while i < utf8.count {
            guard let hi = value(utf8[i]), let lo = value(utf8[i + 1]) else { return nil }
            out.append(hi << 4 | lo)
            i += 2
        }
        return out
    }

    /// Whether `text` is exactly `count` lowercase hex digits (ids in paths and records).
    public static func isLowercase(_ text: some StringProtocol, count: Int) -> Bool {
        text.utf8.count == count && text.utf8.allSatisfy { ($0 >= 0x30 && $0 <= 0x39) || ($0 >= 0x61 && $0 <= 0x66) }
    }

    public static func value(_ c: UInt8) -> UInt8? {
        switch c {
        case 0x30...0x39: c - 0x30
        case 0x61...0x66: c - 0x61 + 10
        case 0x41...0x46: c - 0x41 + 10
        default: nil
        }
    }
}

/// `bytes` random bytes as lowercase hex (temporary file names, pack names); one generator call
/// per 8 bytes (each is a getrandom system call).
public func randomHex(bytes: Int) -> String {
    var rng = SystemRandomNumberGenerator()
    var raw: [UInt8] = []
    raw.reserveCapacity(bytes + 8)
    while raw.count < bytes { withUnsafeBytes(of: rng.next()) { raw += $0 } }
    return Hex.encode(raw.prefix(bytes))
}
