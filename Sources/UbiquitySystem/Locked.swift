import Glibc
import Synchronization

/// State behind a pthread mutex. Used instead of `Synchronization.Mutex` because its
/// `withLock` takes `inout sending`, which rejects closures that mix caller pointers with
/// state (it cannot express "this closure touches only the state"). The state is reachable only inside `withLock`.
///
/// A pthread mutex is not fair: a thread that lets it go and takes it again at once
/// usually wins over one blocked on it. Background work that holds the lock in slices
/// hands it over between them with `yieldToWaiters`, which waits only while someone waits.
public final class Locked<State>: @unchecked Sendable {
    // Heap-allocated: a pthread mutex must not move, and `&property` promises no stable address.
    private let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
    private var state: State
    /// The thread holding the lock (0: none), so code that must never run under it (a
    /// fetch from the network) can check (`isHeldByCurrentThread`).
    private let owner = Atomic<UInt>(0)
    /// Threads blocked in `withLock` now, and the number of acquisitions so far: a
    /// yielder waits until the second moves (`yieldToWaiters`).
    private let waiters = Atomic<Int>(0)
    private let acquisitions = Atomic<UInt>(0)
    /// Threads in `yieldToWaiters` on this lock (an acquisition wakes them only if some).
    private let yielders = Atomic<Int>(0)
    /// Sleepers `wakeSleepers` woke that have not taken the lock back yet: they wait for it
    /// inside the condition wait, which `waiters` does not count.
    private let woken = Atomic<Int>(0)
    /// Where holders whose condition does not hold yet sleep with the lock let go
    /// (`withLock(when:_:)`), and how many sleep there now (changed under the lock).
    private let condition = UnsafeMutablePointer<pthread_cond_t>.allocate(capacity: 1)
    private let sleepers = Atomic<Int>(0)

    /// Where the lock stands in the lock order (nil: not checked).
    private let rank: LockRank?

    /// - Parameter rank: the lock's place in the lock order (`LockRank`), checked at
    ///   every `withLock` in debug builds.
    public init(_ state: State, rank: LockRank? = nil) {
        self.state = state
        self.rank = rank
        pthread_mutex_init(mutex, nil)
        pthread_cond_init(condition, nil)
    }

    deinit {
        pthread_cond_destroy(condition)
        condition.deallocate()
        pthread_mutex_destroy(mutex)
        mutex.deallocate()
    }

    public func withLock<R, E: Error>(_ body: (inout State) throws(E) -> R) throws(E) -> R {
        acquire()
        defer { release() }
        return try body(&state)
    }

    /// `withLock`, with `body` run only once `ready` holds: until then the caller sleeps
    /// with the lock let go (a condition wait), so others take it meanwhile, and looks
    /// again each time a holder calls `wakeSleepers`. For a holder that needs something
    /// another thread has (the index the group commit's folder holds) and must not hold
    /// the lock against everyone while it waits.
    public func withLock<R, E: Error>(when ready: (State) -> Bool, _ body: (inout State) throws(E) -> R) throws(E) -> R {
        acquire()
        defer { release() }
        while !ready(state) {
            sleepers.add(1, ordering: .relaxed)
            owner.store(0, ordering: .relaxed)
            pthread_cond_wait(condition, mutex)
            owner.store(UInt(pthread_self()), ordering: .relaxed)
            sleepers.subtract(1, ordering: .relaxed)
            tookBackAfterWaking()
        }
        return try body(&state)
    }

    /// A sleeper holds the lock again: one woken fewer (never below none: a wake-up
    /// without `wakeSleepers` is not counted), and an acquisition, as a yielder counts them.
    private func tookBackAfterWaking() {
        var left = woken.load(ordering: .sequentiallyConsistent)
        while left > 0 {
            let (exchanged, now) = woken.compareExchange(expected: left, desired: left - 1, ordering: .sequentiallyConsistent)
            if exchanged { break }
            left = now
        }
        acquisitions.add(1, ordering: .sequentiallyConsistent)
        if yielders.load(ordering: .sequentiallyConsistent) > 0 { LockHandoff.shared.wakeAll() }
    }

    /// Wakes the callers of `withLock(when:_:)` asleep now, to look at their condition
    /// again. Called by the lock's holder: a sleeper looks and falls asleep under the
    /// lock, so no wake-up is lost between the two.
    public func wakeSleepers() {
        assert(isHeldByCurrentThread, "wakeSleepers without the lock can miss a sleeper about to wait")
        let asleep = sleepers.load(ordering: .relaxed)
        guard asleep > 0 else { return }
        woken.store(asleep, ordering: .sequentiallyConsistent)
        pthread_cond_broadcast(condition)
    }

    /// `wakeSleepers` from any thread: one that does not hold the lock (it just let go of
    /// what the sleepers wait for) takes it for the moment, so that a sleeper about to
    /// wait is either asleep by then or sees the change.
    public func wakeSleepersFromAnyThread() {
        if isHeldByCurrentThread { return wakeSleepers() }
        acquire()
        defer { release() }
        wakeSleepers()
    }

    /// Callers of `withLock(when:_:)` asleep now (tests).
    public var sleeperCount: Int { sleepers.load(ordering: .relaxed) }

    @inline(__always)
    private func acquire() {
        rank?.acquiring()
        if pthread_mutex_trylock(mutex) != 0 {
            waiters.add(1, ordering: .sequentiallyConsistent)
            pthread_mutex_lock(mutex)
            waiters.subtract(1, ordering: .sequentiallyConsistent)
        }
        owner.store(UInt(pthread_self()), ordering: .relaxed)
        // Sequentially consistent with the yielder's count: either it sees this
        // acquisition, or this sees it waiting and wakes it.
        acquisitions.add(1, ordering: .sequentiallyConsistent)
        if yielders.load(ordering: .sequentiallyConsistent) > 0 { LockHandoff.shared.wakeAll() }
    }

    @inline(__always)
    private func release() {
        owner.store(0, ordering: .relaxed)
        pthread_mutex_unlock(mutex)
        rank?.released()
    }

    /// Whether the calling thread holds the lock now.
    public var isHeldByCurrentThread: Bool { owner.load(ordering: .relaxed) == UInt(pthread_self()) }

    /// Acquisitions so far (tests count them).
    public var acquisitionCount: UInt { acquisitions.load(ordering: .sequentiallyConsistent) }

    /// Whether another thread is blocked on the lock now.
    public var hasWaiters: Bool { waiters.load(ordering: .relaxed) > 0 }

    /// Called without the lock, between two holds of a slice of background work: while
    /// another thread is blocked on the lock, or a sleeper of `withLock(when:_:)` was woken
    /// and has not taken it back, waits until one of them has taken it (bounded by
    /// `LockHandoff.longestNanoseconds`), so that the next slice does not take it again
    /// first (a woken sleeper that found the lock taken again by a slice that lends what
    /// it waits for would sleep again, slice after slice). Returns at once when no one waits.
    public func yieldToWaiters() {
        let anyone = { [self] in
            waiters.load(ordering: .sequentiallyConsistent) > 0 || woken.load(ordering: .sequentiallyConsistent) > 0
        }
        guard anyone() else { return }
        let seen = acquisitions.load(ordering: .sequentiallyConsistent)
        LockHandoff.shared.wait(yielders: yielders) {
            acquisitions.load(ordering: .sequentiallyConsistent) != seen || !anyone()
        }
    }
}

/// Where threads in `Locked.yieldToWaiters` wait: one condition for every lock (yields
/// are rare and brief; each yielder checks its own lock when woken).
final class LockHandoff: @unchecked Sendable {
    static let shared = LockHandoff()
    /// The longest a yield waits (a waiter that is slow to be scheduled does not hold
    /// background work up for longer).
    static let longestNanoseconds = 20_000_000

    private let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
    private let condition = UnsafeMutablePointer<pthread_cond_t>.allocate(capacity: 1)

    private init() {
        pthread_mutex_init(mutex, nil)
        var attributes = pthread_condattr_t()
        pthread_condattr_init(&attributes)
        pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC)
        pthread_cond_init(condition, &attributes)
        pthread_condattr_destroy(&attributes)
    }

    func wakeAll() {
        pthread_mutex_lock(mutex)
        pthread_cond_broadcast(condition)
        pthread_mutex_unlock(mutex)
    }

    /// Waits until `done` holds, counted in `yielders` meanwhile (which `wakeAll`'s
    /// callers read before they wake anyone).
    func wait(yielders: borrowing Atomic<Int>, until done: () -> Bool) {
        var deadline = timespec()
        clock_gettime(CLOCK_MONOTONIC, &deadline)
        let nanoseconds = Int(deadline.tv_nsec) + Self.longestNanoseconds
        deadline.tv_sec += nanoseconds / 1_000_000_000
        deadline.tv_nsec = nanoseconds % 1_000_000_000
        pthread_mutex_lock(mutex)
        yielders.add(1, ordering: .sequentiallyConsistent)
        while !done() {
            if pthread_cond_timedwait(condition, mutex, &deadline) == ETIMEDOUT { break }
        }
        yielders.subtract(1, ordering: .sequentiallyConsistent)
        pthread_mutex_unlock(mutex)
    }
}
