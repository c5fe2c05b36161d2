import Dispatch
import UbiquitySystem

/// Runs `body` on each item, at most `width` at once, and returns the results in the
/// items' order: requests to the backing store wait on the network, not on the CPU, so a
/// few at once fill the link (as `aws s3 cp` and rclone do).
func parallelMap<T: Sendable, R: Sendable>(_ items: [T], width: Int, _ body: @escaping @Sendable (T) -> R) -> [R] {
    if items.count <= 1 || width <= 1 { return items.map(body) }
    let results = Locked<[R?]>(Array(repeating: nil, count: items.count))
    let slots = DispatchSemaphore(value: width)
    let group = DispatchGroup()
    for (i, item) in items.enumerated() {
        slots.wait()
        group.enter()
        DispatchQueue.global().async {
            let r = body(item)
            results.withLock { $0[i] = r }
            slots.signal()
            group.leave()
        }
    }
    group.wait()
    return results.withLock { $0.map { $0! } }
}
