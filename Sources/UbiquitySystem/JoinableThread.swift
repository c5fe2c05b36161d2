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
}

/// Lowers the calling thread's priority (nice 10): background work (gc, prune) then
/// yields the CPU to the requests it shares the machine with.
public func lowerThreadPriority() {
    _ = setpriority(__priority_which_t(PRIO_PROCESS.rawValue), id_t(ubq_gettid()), 10)
}
