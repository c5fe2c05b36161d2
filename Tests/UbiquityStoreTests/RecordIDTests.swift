import Glibc
import Synchronization
import Testing
import UbiquitySystem
import UbiquityStore

/// Record and history ids (`ID128.new`): 32 lowercase hex digits that begin with the
/// time in milliseconds, so ids made later sort later (the indexes they key grow at their
/// end), and are unique within a millisecond.
@Suite struct RecordIDTests {
    @Test func idsMadeLaterSortLaterAndNeverRepeat() {
        var ids: [String] = []
        for _ in 0..<5 {
            ids.append(VersionID.new().hex)
            usleep(2000)
        }
        #expect(ids == ids.sorted(), "\(ids)")
        for id in ids { #expect(id.count == 32 && id.utf8.allSatisfy { Hex.value($0) != nil && !(0x41...0x46).contains($0) }, "\(id)") }
        // The first 12 digits are now in milliseconds.
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        let now = Int64(ts.tv_sec) * 1000 + Int64(ts.tv_nsec) / 1_000_000
        let made = Int64(ids.last!.prefix(12), radix: 16)!
        #expect(made <= now && now - made < 1000, "\(made) \(now)")
        // Many in the same millisecond: all different.
        let burst = (0..<5_000).map { _ in FileID.new() }
        #expect(Set(burst).count == burst.count)
    }

    /// The ids' random words come from a pool drawn from the kernel 4 KiB at a time
    /// (`RandomPool`): each word is handed out once, across refills and threads.
    @Test func thePoolHandsOutEachWordOnce() {
        let drawn = Mutex<[UInt64]>([])
        let threads = (0..<4).map { _ in
            JoinableThread {
                let mine = (0..<3_000).map { _ in RandomPool.next() }
                drawn.withLock { $0 += mine }
            }
        }
        for thread in threads { thread.join() }
        let words = drawn.withLock { $0 }
        #expect(words.count == 12_000 && Set(words).count == words.count)
    }
}
