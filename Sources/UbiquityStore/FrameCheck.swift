import Crypto
import UbiquitySystem

/// How a frame of the store's own logs (the operation log's segments, the intent log) is
/// checked: what finds a write torn by a crash or damaged on the disk. Not a defence
/// against forgery: the logs are the device's own files.
enum FrameCheck: CaseIterable, Sendable {
    /// CRC-32C, 4 bytes little-endian: what store format 19 on writes. A frame is checked
    /// on every request, and SHA-256 without the CPU's SHA extensions costs some 36
    /// instructions a byte (docs/BENCHMARKS.md, "Instructions per request").
    case crc32c
    /// The first 8 bytes of SHA-256: formats 7 to 18, read only.
    case sha256

    var size: Int { self == .crc32c ? 4 : 8 }

    /// The check of the parts, one after another.
    func compute(_ parts: UnsafeRawBufferPointer...) -> [UInt8] {
        switch self {
        case .crc32c:
            var crc = CRC32C.Running()
            for part in parts { crc.update(part) }
            return withUnsafeBytes(of: crc.value.littleEndian) { Array($0) }
        case .sha256:
            var hasher = SHA256()
            for part in parts { hasher.update(bufferPointer: part) }
            return Array(hasher.finalize().prefix(size))
        }
    }
}
