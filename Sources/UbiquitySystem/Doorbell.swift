import Dispatch
import Synchronization

/// Tells a background loop that it has work, so that it can sleep without a timeout while
/// it has none: an idle mount's threads then wake only for the sync poll (loops that
/// polled every 0.1 s would wake 40 times a second to do nothing).
///
/// `ring()` is cheap enough for every write: an atomic load while the bell has rung and
/// the loop has not taken it yet (one semaphore signal per taking, however many rings).
public final class Doorbell: Sendable {
    private let rung = Atomic<Bool>(false)
    private let semaphore = DispatchSemaphore(value: 0)

    public init() {}

    public func ring() {
        if rung.load(ordering: .relaxed) { return }
        if rung.exchange(true, ordering: .acquiringAndReleasing) { return }
        semaphore.signal()
    }

    /// Blocks until the bell has rung (or `interrupt()`); does not take the ring.
    func waitForRing() { semaphore.wait() }

    /// Takes the ring: the next `ring()` signals again. Called just before the work, so
    /// a ring after this point runs the work once more.
    func take() { rung.store(false, ordering: .sequentiallyConsistent) }

    /// Ends a `waitForRing()` in progress, or the next one (a loop that stops).
    func interrupt() { semaphore.signal() }
}

/// A thread running `body` every `interval` seconds until stopped; with a doorbell, only
/// while there is work: it sleeps until rung, then runs `body` `interval` after the ring
/// (rings meanwhile are taken by the same run: a group commit), and again every interval
/// while `body` says more remains. Not a Task: a blocking loop on the cooperative pool
/// (two threads on two cores) would starve it.
public final class BackgroundLoop: Sendable {
    private final class Stop: Sendable {
        let requested = Atomic<Bool>(false)
        let signal = DispatchSemaphore(value: 0)
    }
    private let ending: Stop
    private let doorbell: Doorbell?
    private let thread: JoinableThread

    /// - Parameter body: returns whether to run again after `interval` without a ring
    ///   (ignored without a doorbell: such a loop always runs again).
    public init(every interval: Double, doorbell: Doorbell? = nil, _ body: @escaping @Sendable () -> Bool) {
        self.doorbell = doorbell
        let stop = Stop()
        ending = stop
        thread = JoinableThread {
            var again = doorbell == nil
            while !stop.requested.load(ordering: .acquiring) {
                if !again { doorbell?.waitForRing() }
                if stop.signal.wait(timeout: .now() + interval) == .success { return }
                doorbell?.take()
                again = body() || doorbell == nil
            }
        }
    }

    /// Ends the loop (a run in progress finishes first) and waits for its thread.
    public func stop() {
        guard !ending.requested.exchange(true, ordering: .acquiringAndReleasing) else { return }
        ending.signal.signal()
        doorbell?.interrupt()
        thread.join()
    }
}
