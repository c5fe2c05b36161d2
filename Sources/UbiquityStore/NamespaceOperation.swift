/// One change of the namespace as the operation log carries it (the namespace engine): what a
/// request did, after it was checked against the in-memory namespace, with every number
/// it chose (inode numbers, times), so that replaying it gives the same state. A request
/// appends one of these; replay applies them in order (`Namespace.apply`).
public enum NamespaceOperation: Equatable, Sendable {
    /// A new node under a new name: create, mkdir, mknod, symlink.
    case create(NodeRecord)
    /// Another name for an existing node that is not a directory: link(2).
    case link(InodeNumber, parent: InodeNumber, name: String, time: Nanos)
    /// A name goes (unlink, rmdir); the node goes with its last name.
    case unlink(parent: InodeNumber, name: String, time: Nanos)
    /// rename(2): the target name is replaced, or with `exchange` the two names swap.
    case rename(from: InodeNumber, fromName: String, to: InodeNumber, toName: String, exchange: Bool, time: Nanos)
    /// setattr: the fields that change; ctime always.
    case setAttributes(InodeNumber, AttributeChange)
    case setXattr(InodeNumber, name: String, value: [UInt8], time: Nanos)
    case removeXattr(InodeNumber, name: String, time: Nanos)
}

/// A node as `create` makes it.
public struct NodeRecord: Equatable, Sendable {
    public var inode: InodeNumber
    public var parent: InodeNumber
    public var name: String
    public var kind: NodeKind
    /// Permission bits (07777).
    public var mode: UInt32
    public var uid: UInt32
    public var gid: UInt32
    public var rdev: UInt64
    /// Symlinks only.
    public var target: String?
    public var time: Nanos

    public init(inode: InodeNumber, parent: InodeNumber, name: String, kind: NodeKind, mode: UInt32, uid: UInt32, gid: UInt32,
                rdev: UInt64 = 0, target: String? = nil, time: Nanos) {
        self.inode = inode; self.parent = parent; self.name = name; self.kind = kind; self.mode = mode
        self.uid = uid; self.gid = gid; self.rdev = rdev; self.target = target; self.time = time
    }
}

/// What a setattr changes (nil: left as it is).
public struct AttributeChange: Equatable, Sendable {
    public var mode: UInt32?
    public var uid: UInt32?
    public var gid: UInt32?
    public var size: Int64?
    public var atime: Nanos?
    public var mtime: Nanos?
    public var ctime: Nanos

    public init(mode: UInt32? = nil, uid: UInt32? = nil, gid: UInt32? = nil, size: Int64? = nil,
                atime: Nanos? = nil, mtime: Nanos? = nil, ctime: Nanos) {
        self.mode = mode; self.uid = uid; self.gid = gid; self.size = size; self.atime = atime; self.mtime = mtime; self.ctime = ctime
    }
}

// MARK: the frame payload

/// The payload of an operation-log frame: a tag byte, then the fields in order; integers
/// little-endian, strings and byte strings as a u32 length and the bytes, an optional as a
/// flag byte and the value. Decoding checks every length against what is left and against
/// the field's limit, so a frame's bytes cannot make it trap or allocate without bound.
extension NamespaceOperation {
    /// Names and symlink targets: 4095 bytes of a path, up to 4 UTF-8 bytes each in the
    /// string form (NameCodec).
    static let maxString = 4 * 4096
    /// An xattr value (the filesystem allows 64 KiB).
    static let maxValue = 64 << 10

    private enum Tag: UInt8 { case create = 1, link, unlink, rename, setAttributes, setXattr, removeXattr }

    public var encoded: [UInt8] {
        var w = PayloadWriter()
        switch self {
        case .create(let n):
            w.byte(Tag.create.rawValue)
            w.inode(n.inode); w.inode(n.parent); w.string(n.name); w.u64(UInt64(bitPattern: n.kind.rawValue))
            w.u32(n.mode); w.u32(n.uid); w.u32(n.gid); w.u64(n.rdev); w.optional(n.target) { $0.string($1) }; w.i64(n.time)
        case .link(let inode, let parent, let name, let time):
            w.byte(Tag.link.rawValue); w.inode(inode); w.inode(parent); w.string(name); w.i64(time)
        case .unlink(let parent, let name, let time):
            w.byte(Tag.unlink.rawValue); w.inode(parent); w.string(name); w.i64(time)
        case .rename(let from, let fromName, let to, let toName, let exchange, let time):
            w.byte(Tag.rename.rawValue); w.inode(from); w.string(fromName); w.inode(to); w.string(toName)
            w.byte(exchange ? 1 : 0); w.i64(time)
        case .setAttributes(let inode, let c):
            w.byte(Tag.setAttributes.rawValue); w.inode(inode)
            w.optional(c.mode) { $0.u32($1) }; w.optional(c.uid) { $0.u32($1) }; w.optional(c.gid) { $0.u32($1) }
            w.optional(c.size) { $0.i64($1) }; w.optional(c.atime) { $0.i64($1) }; w.optional(c.mtime) { $0.i64($1) }
            w.i64(c.ctime)
        case .setXattr(let inode, let name, let value, let time):
            w.byte(Tag.setXattr.rawValue); w.inode(inode); w.string(name); w.bytes(value); w.i64(time)
        case .removeXattr(let inode, let name, let time):
            w.byte(Tag.removeXattr.rawValue); w.inode(inode); w.string(name); w.i64(time)
        }
        return w.out
    }

    /// Nil for anything that is not exactly one well-formed operation.
    public init?(decoding payload: some Collection<UInt8>) {
        var r = PayloadReader(Array(payload))
        guard let tag = r.byte().flatMap(Tag.init(rawValue:)) else { return nil }
        let op: NamespaceOperation?
        switch tag {
        case .create:
            if let inode = r.inode(), let parent = r.inode(), let name = r.string(), let kindRaw = r.u64(),
               let kind = NodeKind(rawValue: Int64(bitPattern: kindRaw)), let mode = r.u32(), let uid = r.u32(), let gid = r.u32(),
               let rdev = r.u64(), let target = r.optional({ $0.string() }), let time = r.i64() {
                op = .create(NodeRecord(inode: inode, parent: parent, name: name, kind: kind, mode: mode, uid: uid, gid: gid,
                                        rdev: rdev, target: target, time: time))
            } else { op = nil }
        case .link:
            if let inode = r.inode(), let parent = r.inode(), let name = r.string(), let time = r.i64() {
                op = .link(inode, parent: parent, name: name, time: time)
            } else { op = nil }
        case .unlink:
            if let parent = r.inode(), let name = r.string(), let time = r.i64() { op = .unlink(parent: parent, name: name, time: time) } else { op = nil }
        case .rename:
            if let from = r.inode(), let fromName = r.string(), let to = r.inode(), let toName = r.string(),
               let exchange = r.byte(), exchange <= 1, let time = r.i64() {
                op = .rename(from: from, fromName: fromName, to: to, toName: toName, exchange: exchange == 1, time: time)
            } else { op = nil }
        case .setAttributes:
            if let inode = r.inode(), let mode = r.optional({ $0.u32() }), let uid = r.optional({ $0.u32() }),
               let gid = r.optional({ $0.u32() }), let size = r.optional({ $0.i64() }), let atime = r.optional({ $0.i64() }),
               let mtime = r.optional({ $0.i64() }), let ctime = r.i64() {
                op = .setAttributes(inode, AttributeChange(mode: mode, uid: uid, gid: gid, size: size, atime: atime, mtime: mtime, ctime: ctime))
            } else { op = nil }
        case .setXattr:
            if let inode = r.inode(), let name = r.string(), let value = r.bytes(limit: Self.maxValue), let time = r.i64() {
                op = .setXattr(inode, name: name, value: value, time: time)
            } else { op = nil }
        case .removeXattr:
            if let inode = r.inode(), let name = r.string(), let time = r.i64() { op = .removeXattr(inode, name: name, time: time) } else { op = nil }
        }
        guard let op, r.atEnd else { return nil }
        self = op
    }
}

private struct PayloadWriter {
    var out: [UInt8] = []
    mutating func byte(_ v: UInt8) { out.append(v) }
    mutating func u32(_ v: UInt32) { withUnsafeBytes(of: v.littleEndian) { out += $0 } }
    mutating func u64(_ v: UInt64) { withUnsafeBytes(of: v.littleEndian) { out += $0 } }
    mutating func i64(_ v: Int64) { u64(UInt64(bitPattern: v)) }
    mutating func inode(_ v: InodeNumber) { u64(v.rawValue) }
    mutating func bytes(_ v: [UInt8]) { u32(UInt32(v.count)); out += v }
    mutating func string(_ v: String) { bytes(Array(v.utf8)) }
    mutating func optional<T>(_ v: T?, _ body: (inout PayloadWriter, T) -> Void) {
        if let v { byte(1); body(&self, v) } else { byte(0) }
    }
}

private struct PayloadReader {
    let b: [UInt8]
    var at = 0
    init(_ b: [UInt8]) { self.b = b }
    var atEnd: Bool { at == b.count }

    mutating func take(_ n: Int) -> ArraySlice<UInt8>? {
        guard n >= 0, b.count - at >= n else { return nil }
        defer { at += n }
        return b[at..<at + n]
    }
    mutating func byte() -> UInt8? { take(1)?.first }
    mutating func u32() -> UInt32? { take(4).map { $0.reversed().reduce(UInt32(0)) { $0 << 8 | UInt32($1) } } }
    mutating func u64() -> UInt64? { take(8).map { $0.reversed().reduce(UInt64(0)) { $0 << 8 | UInt64($1) } } }
    mutating func i64() -> Int64? { u64().map { Int64(bitPattern: $0) } }
    mutating func inode() -> InodeNumber? { u64().map { InodeNumber(rawValue: $0) } }
    mutating func bytes(limit: Int) -> [UInt8]? {
        guard let n = u32(), n <= UInt32(limit), let slice = take(Int(n)) else { return nil }
        return Array(slice)
    }
    mutating func string() -> String? {
        guard let raw = bytes(limit: NamespaceOperation.maxString) else { return nil }
        return String(validating: raw, as: UTF8.self)
    }
    /// `.some(nil)` for an absent value, nil for a malformed one.
    mutating func optional<T>(_ body: (inout PayloadReader) -> T?) -> T?? {
        switch byte() {
        case 0: return .some(nil)
        case 1: return body(&self).map { .some($0) } ?? nil
        default: return nil
        }
    }
}
