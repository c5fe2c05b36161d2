import Glibc
import Synchronization

/// State behind a pthread mutex. Used instead of `Synchronization.Mutex` because its
/// `withLock` takes `inout sending`, which rejects closures that mix caller pointers with
/// state (it cannot express "this closure touches only the state"). The state is reachable only inside `withLock`.
public final class Locked<State>: @unchecked Sendable {
    // Heap-allocated: a pthread mutex must not move, and `&property` promises no stable address.
    private let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
    private var state: State
    /// The thread holding the lock (0: none), so code that must never run under it (a
    /// fetch from the network) can check (`isHeldByCurrentThread`).
    private let owner = Atomic<UInt>(0)

    /// Where the lock stands in the lock order (nil: not checked).
    private let rank: LockRank?

    /// - Parameter rank: the lock's place in the lock order (`LockRank`), checked at
    ///   every `withLock` in debug builds.
    public init(_ state: State, rank: LockRank? = nil) {
        self.state = state
        self.rank = rank
        pthread_mutex_init(mutex, nil)
    }

    deinit {
        pthread_mutex_destroy(mutex)
        mutex.deallocate()
    }

    public func withLock<R, E: Error>(_ body: (inout State) throws(E) -> R) throws(E) -> R {
        let ranks = rank?.acquiring()
        pthread_mutex_lock(mutex)
        owner.store(UInt(pthread_self()), ordering: .relaxed)
        defer {
            owner.store(0, ordering: .relaxed)
            pthread_mutex_unlock(mutex)
            if let ranks { LockRank.released(ranks) }
        }
        return try body(&state)
    }

    /// Whether the calling thread holds the lock now.
    public var isHeldByCurrentThread: Bool { owner.load(ordering: .relaxed) == UInt(pthread_self()) }
}
