import Dispatch
import UbiquitySystem

/// Runs `body` on each item, at most `width` at once, and returns the results in the
/// items' order: requests to the backing store wait on the network, not on the CPU, so a
/// few at once fill the link (as `aws s3 cp` and rclone do).
func parallelMap<T: Sendable, R: Sendable>(_ items: [T], width: Int, _ body: @escaping @Sendable (T) -> R) -> [R] {
    if items.count <= 1 || width <= 1 { return items.map(body) }
    // Threads of their own (JoinableThread.detach says why not the global queue), each
    // taking the next item until none is left.
    let state = Locked<(next: Int, results: [R?])>((0, Array(repeating: nil, count: items.count)))
    let workers = (0..<min(width, items.count)).map { _ in
        JoinableThread {
            while let i = state.withLock({ s -> Int? in
                guard s.next < items.count else { return nil }
                defer { s.next += 1 }
                return s.next
            }) {
                let r = body(items[i])
                state.withLock { $0.results[i] = r }
            }
        }
    }
    for worker in workers { worker.join() }
    return state.withLock { $0.results.map { $0! } }
}
