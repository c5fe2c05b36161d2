import CUbiquity
import Glibc
import Synchronization

/// Random 64-bit words for ids, drawn from the kernel 4 KiB at a time. The system's
/// generator makes one getrandom(2) call per word, and every create and every delete
/// makes an id of two words: the request path's only system calls besides its reply and
/// its log frame. Words from the kernel's generator, never reused; the daemon never forks
/// without exec (it spawns), so no two processes share a pool.
public enum RandomPool {
    private struct Pool {
        var words = [UInt64](repeating: 0, count: 512)
        var next = 512
    }
    private static let pool = Mutex(Pool())

    public static func next() -> UInt64 {
        pool.withLock { p in
            if p.next == p.words.count {
                p.words.withUnsafeMutableBytes { fill($0) }
                p.next = 0
            }
            defer { p.next += 1 }
            return p.words[p.next]
        }
    }

    /// Fills `buffer` from the kernel (getrandom blocks only until the pool is first
    /// seeded at boot); the system's generator takes over if the call fails.
    private static func fill(_ buffer: UnsafeMutableRawBufferPointer) {
        var done = 0
        while done < buffer.count {
            let got = ubq_getrandom(buffer.baseAddress! + done, buffer.count - done)
            if got > 0 {
                done += got
            } else if got < 0 && errno == EINTR {
                continue
            } else {
                break
            }
        }
        guard done < buffer.count else { return }
        var rng = SystemRandomNumberGenerator()
        var at = done
        while at < buffer.count {
            var word = rng.next() as UInt64
            let n = min(8, buffer.count - at)
            withUnsafeBytes(of: &word) { buffer.baseAddress!.advanced(by: at).copyMemory(from: $0.baseAddress!, byteCount: n) }
            at += n
        }
    }
}
