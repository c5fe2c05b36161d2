import CUbiquity
import Glibc

/// A pthread running `body` once; `join()` waits for it. (Foundation's Thread is not
/// linked; a Task would block a cooperative-pool thread.)
public final class JoinableThread: @unchecked Sendable {
    private var thread = pthread_t()
    private let body: @Sendable () -> Void

    public init(_ body: @escaping @Sendable () -> Void) {
        self.body = body
        let box = Unmanaged.passRetained(self).toOpaque()
        pthread_create(&thread, nil, { arg in
            let me = Unmanaged<JoinableThread>.fromOpaque(arg!).takeRetainedValue()
            me.body()
            return nil
        }, box)
    }

    public func join() { pthread_join(thread, nil) }

    /// Runs `body` on a thread of its own that nobody joins. For work that blocks on the
    /// network: libdispatch's global queues run about one thread per core on Linux and do
    /// not add threads when those block, so requests stalled there starve every other
    /// piece of work queued behind them.
    public static func detach(_ body: @escaping @Sendable () -> Void) {
        let thread = JoinableThread(body)
        pthread_detach(thread.thread)
    }
}

/// Lowers the calling thread's priority (nice 10): background work (gc, prune) then
/// yields the CPU to the requests it shares the machine with.
public func lowerThreadPriority() {
    _ = setpriority(__priority_which_t(PRIO_PROCESS.rawValue), id_t(ubq_gettid()), 10)
}
