import Synchronization

/// A backing store in memory, for the sync simulation and the conformance suite: the
/// protocol's semantics exactly, plus what tests need to see and break:
/// - `counts`: requests by kind and bytes moved (tests that prove cost proportional to a
///   change count these, not time);
/// - `fault`: decides per request whether it fails, and how (a `BackingError`), before it
///   has any effect: a failed put leaves nothing, as an atomic put must.
public final class MemoryStore: BackingStore {
    public enum Operation: String, Sendable { case put, get, stat, list, delete }

    public struct Counts: Equatable, Sendable {
        public var requests: [String: Int] = [:]
        public var bytesUp: Int64 = 0
        public var bytesDown: Int64 = 0
        /// Keys LIST answers returned (what a reader parses; on S3, the pages it pays for).
        public var keysListed = 0
        public var total: Int { requests.values.reduce(0, +) }
        public func of(_ op: Operation) -> Int { requests[op.rawValue, default: 0] }
    }

    private struct State {
        var objects: [BackingKey: [UInt8]] = [:]
        var counts = Counts()
        var fault: (@Sendable (Operation, BackingKey?) -> BackingError?)?
    }

    private let state = Mutex(State())
    public let location: String

    public init(name: String = "memory") { location = "memory:\(name)" }

    public var counts: Counts { state.withLock { $0.counts } }
    public func resetCounts() { state.withLock { $0.counts = Counts() } }

    /// Installs (or removes, with nil) the fault plan.
    public func setFault(_ fault: (@Sendable (Operation, BackingKey?) -> BackingError?)?) { state.withLock { $0.fault = fault } }

    /// Every key and its bytes (tests compare stores with it).
    public var snapshot: [BackingKey: [UInt8]] { state.withLock { $0.objects } }

    private func begin(_ op: Operation, _ key: BackingKey?) throws(BackingError) {
        let fault = state.withLock { s -> (@Sendable (Operation, BackingKey?) -> BackingError?)? in
            s.counts.requests[op.rawValue, default: 0] += 1
            return s.fault
        }
        if let error = fault?(op, key) { throw error }
    }

    public func put(_ key: BackingKey, _ bytes: [UInt8], ifAbsent: Bool) throws(BackingError) {
        try begin(.put, key)
        let stored = state.withLock { s -> Bool in
            if ifAbsent && s.objects[key] != nil { return false }
            s.objects[key] = bytes
            s.counts.bytesUp += Int64(bytes.count)
            return true
        }
        if !stored { throw .exists(key.path) }
    }

    public func get(_ key: BackingKey, range: Range<Int64>?) throws(BackingError) -> [UInt8] {
        try begin(.get, key)
        let bytes = state.withLock { s -> [UInt8]? in
            guard let all = s.objects[key] else { return nil }
            let size = Int64(all.count)
            let r = range.map { max(0, min($0.lowerBound, size))..<max(0, min($0.upperBound, size)) } ?? 0..<size
            let out = Array(all[Int(r.lowerBound)..<Int(r.upperBound)])
            s.counts.bytesDown += Int64(out.count)
            return out
        }
        guard let bytes else { throw .notFound(key.path) }
        return bytes
    }

    public func stat(_ key: BackingKey) throws(BackingError) -> ObjectInfo? {
        try begin(.stat, key)
        return state.withLock { s in s.objects[key].map { ObjectInfo(key: key, size: Int64($0.count)) } }
    }

    public func list(prefix: String, after: BackingKey?, limit: Int) throws(BackingError) -> ObjectListing {
        try begin(.list, nil)
        let want = max(1, limit)
        let keys = state.withLock { s in
            s.objects.filter { entry in entry.key.path.hasPrefix(prefix) && (after.map { $0 < entry.key } ?? true) }
                .map { ObjectInfo(key: $0.key, size: Int64($0.value.count)) }
        }.sorted { $0.key < $1.key }
        let page = Array(keys.prefix(want))
        state.withLock { $0.counts.keysListed += page.count }
        return ObjectListing(objects: page, more: keys.count > want)
    }

    public func delete(_ key: BackingKey) throws(BackingError) {
        try begin(.delete, key)
        _ = state.withLock { $0.objects.removeValue(forKey: key) }
    }
}
