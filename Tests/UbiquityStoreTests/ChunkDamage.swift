import Glibc
import Testing
import UbiquityStore
import UbiquitySystem

/// What a power loss or a faulty disk does to one chunk of a store that is not open (tests):
/// wherever the chunk is kept, a pack record (format 18) or a chunk file (before).
enum ChunkDamage {
    /// A power loss before the chunk reached the disk: its pack record is zeros, and its
    /// pack has no index (a pack gets one only once flushed); or its chunk file is gone.
    static func lose(_ id: ChunkID, chunks: String) throws {
        let packs = try LocalPacks(directory: chunks + "/packs", readOnly: true)
        guard let (path, offset, length) = packs.location(of: id) else {
            unlink(filePath(id, chunks: chunks))
            return
        }
        try overwrite(path, at: offset - 48, with: [UInt8](repeating: 0, count: 48 + length))
        unlink(String(path.dropLast(4)) + "idx")
    }

    /// One byte of the chunk's bytes changed (`at`: its offset in the chunk).
    static func flip(_ id: ChunkID, chunks: String, at: Int = 0) throws {
        let packs = try LocalPacks(directory: chunks + "/packs", readOnly: true)
        let (path, offset, length) = try #require(packs.location(of: id))
        precondition(at < length)
        let fd = open(path, O_RDONLY)
        var byte: UInt8 = 0
        _ = pread(fd, &byte, 1, off_t(offset) + off_t(at))
        close(fd)
        try overwrite(path, at: offset + Int64(at), with: [byte ^ 0xFF])
    }

    /// Where a store from before format 18 keeps the chunk as a file.
    static func filePath(_ id: ChunkID, chunks: String) -> String {
        let hex = id.hex
        return "\(chunks)/\(hex.prefix(2))/\(hex)"
    }

    /// The chunk files' directories of a store from before format 18, made in `chunks`
    /// before a `ChunkStore` opens it: it then looks for chunk files too.
    static func makeOldLayout(chunks: String) {
        mkdir(chunks, 0o755)
        for i in 0..<256 { mkdir(chunks + "/" + Hex.byte(i), 0o755) }
    }

    private static func overwrite(_ path: String, at offset: Int64, with bytes: [UInt8]) throws {
        let fd = open(path, O_WRONLY)
        guard fd >= 0 else { throw SystemError.last("open \(path)") }
        defer { close(fd) }
        let written = bytes.withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, off_t(offset)) }
        guard written == bytes.count else { throw SystemError.last("write \(path)") }
    }
}
