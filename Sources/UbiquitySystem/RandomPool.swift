import CUbiquity
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
                refill(&p.words)
                p.next = 0
            }
            defer { p.next += 1 }
            return p.words[p.next]
        }
    }

    /// New words from the kernel (getrandom blocks only until its pool is first seeded at
    /// boot); the system's generator gives them if the call fails.
    private static func refill(_ words: inout [UInt64]) {
        let filled = words.withUnsafeMutableBytes { raw -> Bool in
            var done = 0
            while done < raw.count {
                let got = retryingEINTR { ubq_getrandom(raw.baseAddress! + done, raw.count - done) }
                guard got > 0 else { return false }
                done += got
            }
            return true
        }
        if filled { return }
        var rng = SystemRandomNumberGenerator()
        for i in words.indices { words[i] = rng.next() }
    }
}
