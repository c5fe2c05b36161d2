import Glibc

/// Retries what may pass (`BackingError.isRetryable`: timeouts, resets, 5xx, SlowDown,
/// garbled answers) with exponential backoff and full jitter, a bounded number of times;
/// anything else, and the last failure, goes to the caller (the sync engine then counts
/// the device offline and tries again next cycle). Wraps any store, as restic's retry
/// backend does. `put` may be retried because it is idempotent; a retried `ifAbsent` put
/// whose first attempt did land answers `.exists`, which callers of `ifAbsent` accept.
public struct RetryingStore: WrappingStore {
    public let base: any BackingStore
    public let attempts: Int
    public let firstDelay: Double
    public let maxDelay: Double
    /// Sleeps that many seconds (tests inject a recorder).
    let sleep: @Sendable (Double) -> Void

    public init(_ base: any BackingStore, attempts: Int = 5, firstDelay: Double = 0.2, maxDelay: Double = 5,
                sleep: @escaping @Sendable (Double) -> Void = { usleep(useconds_t(min($0, 60) * 1e6)) }) {
        self.base = base
        self.attempts = max(1, attempts)
        self.firstDelay = firstDelay
        self.maxDelay = maxDelay
        self.sleep = sleep
    }

    public var location: String { base.location }

    public func retrying<T>(_ body: () throws(BackingError) -> T) throws(BackingError) -> T {
        var attempt = 0
        while true {
            do { return try body() } catch {
                attempt += 1
                guard error.isRetryable, attempt < attempts else { throw error }
                let ceiling = min(maxDelay, firstDelay * Double(1 << min(attempt - 1, 20)))
                sleep(Double.random(in: 0...ceiling))
            }
        }
    }

    public func put(_ key: BackingKey, _ bytes: [UInt8], ifAbsent: Bool) throws(BackingError) {
        try retrying { () throws(BackingError) in try base.put(key, bytes, ifAbsent: ifAbsent) }
    }
    public func get(_ key: BackingKey, range: Range<Int64>?) throws(BackingError) -> [UInt8] {
        try retrying { () throws(BackingError) in try base.get(key, range: range) }
    }
    public func stat(_ key: BackingKey) throws(BackingError) -> ObjectInfo? {
        try retrying { () throws(BackingError) in try base.stat(key) }
    }
    public func list(prefix: String, after: BackingKey?, limit: Int) throws(BackingError) -> ObjectListing {
        try retrying { () throws(BackingError) in try base.list(prefix: prefix, after: after, limit: limit) }
    }
    public func delete(_ key: BackingKey) throws(BackingError) {
        try retrying { () throws(BackingError) in try base.delete(key) }
    }
}
