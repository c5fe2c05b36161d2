import Glibc
import Synchronization
import TestSupport
import UbiquityBacking
import UbiquitySystem

/// A store that records every request (kind, key, range) on its way to `base`, and can
/// fail a request before it reaches `base` (it has no effect) or after (its effect stays
/// and its answer is lost: a timeout after the PUT landed). Tests that count work read
/// `calls`; tests that break things install `fault`.
final class RecordingStore: WrappingStore {
    enum Fault: Sendable {
        /// The request fails without effect.
        case before(BackingError)
        /// The request has its effect, then fails (the answer is lost).
        case after(BackingError)
        /// The request waits this many microseconds first (a server that stalls; the
        /// wait is outside the recorder's lock, so other requests go on meanwhile).
        case stall(UInt32)
    }

    struct Call: Sendable, CustomStringConvertible {
        let op: MemoryStore.Operation
        let key: String
        let range: Range<Int64>?
        /// Bytes sent (a put).
        var bytes = 0
        var description: String { "\(op.rawValue) \(key)" + (range.map { " \($0.lowerBound)..<\($0.upperBound)" } ?? "") }
    }

    let base: any BackingStore
    private let state = Mutex<(calls: [Call], fault: (@Sendable (MemoryStore.Operation, String) -> Fault?)?)>(([], nil))

    init(_ base: any BackingStore) { self.base = base }

    var location: String { base.location }
    var calls: [Call] { state.withLock { $0.calls } }
    func reset() { state.withLock { $0.calls = [] } }
    func setFault(_ fault: (@Sendable (MemoryStore.Operation, String) -> Fault?)?) { state.withLock { $0.fault = fault } }

    /// Calls of kind `op` whose key starts with `prefix`.
    func count(_ op: MemoryStore.Operation, _ prefix: String = "") -> Int {
        calls.filter { $0.op == op && $0.key.hasPrefix(prefix) }.count
    }

    private func run<T>(_ op: MemoryStore.Operation, _ key: String, range: Range<Int64>? = nil, bytes: Int = 0,
                        _ body: () throws(BackingError) -> T) throws(BackingError) -> T {
        let fault = state.withLock { s -> Fault? in
            s.calls.append(Call(op: op, key: key, range: range, bytes: bytes))
            return s.fault?(op, key)
        }
        if case .before(let error) = fault { throw error }
        if case .stall(let micros) = fault { usleep(micros) }
        let result = try body()
        if case .after(let error) = fault { throw error }
        return result
    }

    func put(_ key: BackingKey, _ bytes: [UInt8], ifAbsent: Bool) throws(BackingError) {
        try run(.put, key.path, bytes: bytes.count) { () throws(BackingError) in try base.put(key, bytes, ifAbsent: ifAbsent) }
    }
    func get(_ key: BackingKey, range: Range<Int64>?) throws(BackingError) -> [UInt8] {
        try run(.get, key.path, range: range) { () throws(BackingError) in try base.get(key, range: range) }
    }
    func stat(_ key: BackingKey) throws(BackingError) -> ObjectInfo? {
        try run(.stat, key.path) { () throws(BackingError) in try base.stat(key) }
    }
    func list(prefix: String, after: BackingKey?, limit: Int) throws(BackingError) -> ObjectListing {
        try run(.list, prefix) { () throws(BackingError) in try base.list(prefix: prefix, after: after, limit: limit) }
    }
    func delete(_ key: BackingKey) throws(BackingError) {
        try run(.delete, key.path) { () throws(BackingError) in try base.delete(key) }
    }
}

extension BackingStore {
    /// Every key under `prefix`, as text (a test's view of the container).
    func keys(_ prefix: String) -> [String] {
        ((try? listAll(prefix: prefix)) ?? []).map(\.key.path)
    }

    /// The object's bytes as text, nil when absent.
    func text(_ key: String) -> String? {
        (try? get(BackingKey(checked: key))).map { String(decoding: $0, as: UTF8.self) }
    }
}

/// `count` characters of random text (hex digits): content the chunker cuts as it would
/// any file's, and that no other file shares.
func randomText(_ count: Int, _ rng: inout SplitMix64) -> String {
    String(Hex.encode(rng.bytes((count + 1) / 2)).prefix(count))
}
