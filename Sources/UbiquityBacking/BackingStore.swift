/// The storage seam: everything that leaves or enters a device goes through a
/// `BackingStore`, whatever holds it (a shared directory, an S3 bucket, memory in tests).
/// The protocol is small on purpose, in the spirit of restic's backend and JuiceFS's
/// object storage: whole immutable objects under keys, no append, rename or lock.
///
/// Contract, for every implementation (`BackingConformance` checks it):
/// - `put` writes a whole object atomically: a reader sees all of its bytes or none of
///   them, never a part. It is durable when it returns. It is idempotent: writing the same
///   bytes again is harmless. With `ifAbsent` it fails with `.exists` when the key has an
///   object already, and leaves that object as it was (S3's `If-None-Match: *`).
/// - `get` returns the object's bytes, or the bytes of `range` within it (a range that
///   runs past the end is cut at the end; one that starts at or past it is empty).
/// - `stat` tells the object's size, nil when there is none.
/// - `list` returns keys under a prefix in ascending byte order, `limit` at a time,
///   starting after `after`; `more` says whether to call again. Objects being written are
///   never listed.
/// - `delete` removes an object; deleting one that is not there succeeds.
/// - Keys are `BackingKey`s: relative, `/`-separated, no empty, `.` or `..` component. No
///   key is also the directory of another (`a` beside `a/b`): a directory store could not
///   hold both, and the layout never makes such keys.
/// - Every failure is a `BackingError` that says whether trying again can help; the caller
///   (a `RetryingStore`, then the sync engine) decides when and how often.
/// - Thread-safe: calls may come from several threads at once.
/// - Nothing here is called under a filesystem or store lock (DESIGN: nothing slow under
///   a lock): a call may take as long as the network does.
public protocol BackingStore: Sendable {
    func put(_ key: BackingKey, _ bytes: [UInt8], ifAbsent: Bool) throws(BackingError)
    func get(_ key: BackingKey, range: Range<Int64>?) throws(BackingError) -> [UInt8]
    func stat(_ key: BackingKey) throws(BackingError) -> ObjectInfo?
    func list(prefix: String, after: BackingKey?, limit: Int) throws(BackingError) -> ObjectListing
    func delete(_ key: BackingKey) throws(BackingError)
    /// Where it is, for messages and `ubiquity status` (never a secret).
    var location: String { get }
}

extension BackingStore {
    public func put(_ key: BackingKey, _ bytes: [UInt8]) throws(BackingError) { try put(key, bytes, ifAbsent: false) }
    public func get(_ key: BackingKey) throws(BackingError) -> [UInt8] { try get(key, range: nil) }

    /// Every key under `prefix`, page by page (`pageSize` a request), at most `cap` of them:
    /// a listing that never ends (a hostile or broken server) stops there with an error
    /// instead of growing without bound.
    public func listAll(prefix: String, pageSize: Int = 1000, cap: Int = 10_000_000) throws(BackingError) -> [ObjectInfo] {
        var out: [ObjectInfo] = []
        var after: BackingKey?
        while true {
            let page = try list(prefix: prefix, after: after, limit: pageSize)
            // A page must move forward: a server that repeats itself would loop forever.
            if let last = page.objects.last, let previous = after, last.key <= previous {
                throw .garbage("\(location): a listing of \(prefix) went backwards (\(last.key.path) after \(previous.path))")
            }
            out += page.objects
            if out.count > cap { throw .garbage("\(location): a listing of \(prefix) passed \(cap) keys") }
            guard page.more, let last = page.objects.last else { return out }
            after = last.key
        }
    }
}

/// A store that adds something (retries, a meter, encryption) to the one below it.
public protocol WrappingStore: BackingStore {
    var base: any BackingStore { get }
}

extension BackingStore {
    /// The first store of type `T` in this one's chain of wrappers, itself included.
    public func find<T: BackingStore>(_ type: T.Type) -> T? {
        var store: any BackingStore = self
        while true {
            if let found = store as? T { return found }
            guard let wrapper = store as? any WrappingStore else { return nil }
            store = wrapper.base
        }
    }
}

/// A key: a relative path of `/`-separated components, each non-empty, not `.` or `..`,
/// without NUL, at most 1,024 bytes in all (S3's limit). The one place that checks it.
public struct BackingKey: Hashable, Comparable, Sendable, CustomStringConvertible {
    public let path: String

    public init?(_ path: String) {
        guard !path.isEmpty, path.utf8.count <= 1024, !path.utf8.contains(0) else { return nil }
        for component in path.split(separator: "/", omittingEmptySubsequences: false) {
            if component.isEmpty || component == "." || component == ".." { return nil }
        }
        self.path = path
    }

    /// A key made of known-good parts (the layout's own names). Traps on a bad one: a
    /// programming error, never input.
    public init(checked path: String) {
        guard let key = BackingKey(path) else { preconditionFailure("not a backing key: \(path)") }
        self = key
    }

    /// Byte order, as S3 lists keys; equality and hashing by bytes too (Swift's `==` on
    /// strings is canonical equivalence: NFC and NFD `é` would be one key, on S3 two).
    public static func < (a: BackingKey, b: BackingKey) -> Bool { a.path.utf8.lexicographicallyPrecedes(b.path.utf8) }
    public static func == (a: BackingKey, b: BackingKey) -> Bool { a.path.utf8.elementsEqual(b.path.utf8) }
    public func hash(into hasher: inout Hasher) {
        hasher.combine(path.utf8.count)
        for byte in path.utf8 { hasher.combine(byte) }
    }
    public var description: String { path }
}

public struct ObjectInfo: Equatable, Sendable {
    public let key: BackingKey
    public let size: Int64
    public init(key: BackingKey, size: Int64) {
        self.key = key
        self.size = size
    }
}

public struct ObjectListing: Sendable {
    public var objects: [ObjectInfo]
    public var more: Bool
    public init(objects: [ObjectInfo], more: Bool) {
        self.objects = objects
        self.more = more
    }
}

/// Why a call failed, and whether trying again can help.
public enum BackingError: Error, Equatable, Sendable, CustomStringConvertible {
    /// No object under the key (get; never for delete).
    case notFound(String)
    /// `put(ifAbsent:)` found an object there.
    case exists(String)
    /// Worth retrying: a timeout, a reset or refused connection, 5xx, SlowDown, a
    /// network filesystem's EIO or ESTALE.
    case transient(String)
    /// Retrying cannot help until someone changes something: access denied, no such
    /// bucket, a bad key or region, a read-only directory.
    case permanent(String)
    /// An answer that makes no sense (bad XML, a wrong length, a listing that never ends):
    /// logged and treated like a transient failure, never trusted.
    case garbage(String)

    public var isRetryable: Bool {
        switch self {
        case .transient, .garbage: return true
        case .notFound, .exists, .permanent: return false
        }
    }

    public var description: String {
        switch self {
        case .notFound(let s): return "not found: \(s)"
        case .exists(let s): return "exists already: \(s)"
        case .transient(let s), .permanent(let s): return s
        case .garbage(let s): return "bad answer: \(s)"
        }
    }
}
