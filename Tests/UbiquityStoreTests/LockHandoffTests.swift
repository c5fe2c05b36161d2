import Dispatch
import Glibc
import Synchronization
import Testing
import TestSupport
@testable import UbiquitySystem

/// Background work that holds a lock in slices hands it to a thread that waits for it
/// between two slices (`Locked.yieldToWaiters`), rather than taking it again first.
@Suite struct LockHandoffTests {
    /// A loop of slices, each some microseconds of work under the lock, and a thread
    /// that asks for the lock once per round: counted in slices, not timed, it waits for
    /// the slice in progress and at most one it was not yet waiting for. (Without the
    /// hand-off it waits for dozens: the slicer takes the lock again first.)
    @Test func aWaiterGetsTheLockBetweenTwoSlices() {
        let lock = Locked(0)
        let slices = Atomic<Int>(0), stop = Atomic<Bool>(false)
        let slicer = JoinableThread {
            while !stop.load(ordering: .relaxed) {
                lock.withLock { n in
                    var x = n
                    for i in 0..<20_000 { x = x &* 31 &+ i }
                    n = x
                    slices.add(1, ordering: .relaxed)
                }
                lock.yieldToWaiters()
            }
        }
        while slices.load(ordering: .relaxed) < 10 { usleep(100) }
        var missed: [Int] = []
        for _ in 0..<200 {
            let before = slices.load(ordering: .relaxed)
            let at = lock.withLock { _ in slices.load(ordering: .relaxed) }
            missed.append(at - before)
            usleep(200)
        }
        stop.store(true, ordering: .relaxed)
        slicer.join()
        missed.sort()
        let median = missed[missed.count / 2]
        print("LockHandoffTests: slices while a thread waited for the lock: median \(median), most \(missed.last ?? 0)")
        #expect(median <= 2)
    }

    /// A sleeper of `withLock(when:_:)` woken at the end of one slice takes the lock
    /// before the next slice, which would take back what it waits for (the group commit's
    /// next part lends the index again) and so make it sleep again. Counted over 200
    /// rounds, not timed: a round counts as lost when the yield returned before its
    /// bound and the next slice still came first.
    @Test func aWokenSleeperGetsTheLockBeforeTheNextSlice() {
        struct State { var lent = true, entered = 0 }
        let lock = Locked(State())
        var lost = 0
        for round in 1...200 {
            let sleeper = JoinableThread { lock.withLock(when: { !$0.lent }) { $0.entered += 1 } }
            while lock.sleeperCount == 0 { usleep(20) }
            lock.withLock { s in
                s.lent = false // a part ends: what the sleeper waits for is back
                lock.wakeSleepers()
            }
            let start = DispatchTime.now().uptimeNanoseconds
            lock.yieldToWaiters()
            let early = DispatchTime.now().uptimeNanoseconds - start < UInt64(LockHandoff.longestNanoseconds) * 3 / 4
            let first = lock.withLock { s -> Bool in
                defer { s.lent = true } // the next part lends it again
                return s.entered == round
            }
            if early && !first { lost += 1 }
            // Let a sleeper that lost go through.
            lock.withLock { s in
                s.lent = false
                lock.wakeSleepers()
            }
            sleeper.join()
            lock.withLock { $0.lent = true }
        }
        print("LockHandoffTests: rounds a woken sleeper lost to the next slice: \(lost) of 200")
        #expect(lost == 0)
    }

    /// With no one waiting, a yield returns at once (no pause between slices of work
    /// that has the lock to itself).
    @Test func noWaiterNoPause() {
        let lock = Locked(0)
        for _ in 0..<10_000 {
            lock.withLock { $0 += 1 }
            lock.yieldToWaiters()
        }
        #expect(lock.withLock { $0 } == 10_000)
        #expect(!lock.hasWaiters)
    }
}
