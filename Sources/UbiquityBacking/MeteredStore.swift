import Synchronization

/// Counts what goes through a store (requests by kind, bytes each way) and keeps the last
/// failure: `ubiquity status` shows them, and tests count requests through it. Wraps any
/// store; messages it keeps are the stores' own, which never carry a secret.
public final class MeteredStore: WrappingStore {
    public struct Meter: Sendable, Equatable {
        public var requests = 0
        public var puts = 0
        public var gets = 0
        public var lists = 0
        public var stats = 0
        public var deletes = 0
        public var bytesUp: Int64 = 0
        public var bytesDown: Int64 = 0
        public var lastError: String?
    }

    public let base: any BackingStore
    private let state = Mutex(Meter())

    public init(_ base: any BackingStore) { self.base = base }

    public var location: String { base.location }
    public var meter: Meter { state.withLock { $0 } }


    private func count<T>(_ kind: WritableKeyPath<Meter, Int>, up: Int = 0, _ body: () throws(BackingError) -> T,
                          down: (T) -> Int = { _ in 0 }) throws(BackingError) -> T {
        state.withLock { m in
            m.requests += 1
            m[keyPath: kind] += 1
            m.bytesUp += Int64(up)
        }
        do {
            let result = try body()
            let bytes = Int64(down(result))
            if bytes > 0 { state.withLock { $0.bytesDown += bytes } }
            return result
        } catch {
            switch error {
            case .notFound, .exists: break // answers, not failures
            default: state.withLock { $0.lastError = error.description }
            }
            throw error
        }
    }

    public func put(_ key: BackingKey, _ bytes: [UInt8], ifAbsent: Bool) throws(BackingError) {
        try count(\.puts, up: bytes.count) { () throws(BackingError) in try base.put(key, bytes, ifAbsent: ifAbsent) }
    }
    public func get(_ key: BackingKey, range: Range<Int64>?) throws(BackingError) -> [UInt8] {
        try count(\.gets, { () throws(BackingError) in try base.get(key, range: range) }, down: { $0.count })
    }
    public func stat(_ key: BackingKey) throws(BackingError) -> ObjectInfo? {
        try count(\.stats) { () throws(BackingError) in try base.stat(key) }
    }
    public func list(prefix: String, after: BackingKey?, limit: Int) throws(BackingError) -> ObjectListing {
        try count(\.lists) { () throws(BackingError) in try base.list(prefix: prefix, after: after, limit: limit) }
    }
    public func delete(_ key: BackingKey) throws(BackingError) {
        try count(\.deletes) { () throws(BackingError) in try base.delete(key) }
    }
}
