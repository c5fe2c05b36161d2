import Glibc
import UbiquitySystem

/// The bytes written to an open file since its last commit, at the staging offsets
/// `StagedExtents` assigns: in memory while they fit in `memoryLimit`, then in an unlinked
/// file of the staging directory.
///
/// Why memory first: most saves are small (a source file, a config, a git object), and an
/// anonymous file per save costs a create, a write, a read back and a close on the disk
/// filesystem, about a fifth of the daemon's time per small file created. Memory per open
/// file stays bounded by the limit; anything bigger goes to disk.
/// Used under its FileContent's lock.
final class StagingBuffer {
    static let memoryLimit = 64 << 10

    private var memory: [UInt8] = []
    private var fd: Int32 = -1
    let directory: String

    init(directory: String) { self.directory = directory }

    deinit { if fd >= 0 { close(fd) } }

    /// Writes `data` at staging offset `at`; the caller bounds `at + data.count` by
    /// the file's size limit.
    func write(_ data: UnsafeRawBufferPointer, at: Int64) throws(SystemError) {
        let end = at + Int64(data.count)
        if fd < 0 && end <= Int64(Self.memoryLimit) {
            // Grows by a zeroed array (one memset and one memcpy), not an element-wise
            // append: the staged bytes of every small file pass through here.
            if memory.count < Int(end) { memory += [UInt8](repeating: 0, count: Int(end) - memory.count) }
            memory.withUnsafeMutableBytes { raw in
                UnsafeMutableRawBufferPointer(rebasing: raw[Int(at)..<Int(end)]).copyMemory(from: data)
            }
            return
        }
        if fd < 0 {
            let file = try makeAnonymousFile(in: directory)
            do throws(SystemError) {
                try writeAll(file, memory, path: "staging data")
            } catch {
                close(file)
                throw error
            }
            fd = file
            memory = []
        }
        try writeAll(fd, data, at: at, path: "staging data")
    }

    /// Reads `buffer.count` bytes at `at`; what was never written reads as zeros.
    func read(into buffer: UnsafeMutableRawBufferPointer, at: Int64) throws(SystemError) {
        if fd >= 0 {
            // A short read (the file ends early) leaves zeros, which is what a write that
            // never reached the file would read as.
            _ = try readFully(fd, into: buffer, at: at, path: "staging data")
            return
        }
        buffer.initializeMemory(as: UInt8.self, repeating: 0)
        guard at < Int64(memory.count) else { return }
        let count = min(buffer.count, memory.count - Int(at))
        memory.withUnsafeBytes { raw in
            buffer.copyMemory(from: UnsafeRawBufferPointer(rebasing: raw[Int(at)..<Int(at) + count]))
        }
    }

    /// Drops every staged byte (after a commit, or a truncation that left none).
    func removeAll() {
        memory = []
        if fd >= 0 { _ = ftruncate(fd, 0) }
    }
}
