import Glibc
import UbiquitySystem

/// The 16 bytes of a record id or a history id. Records spell them as 32 lowercase hex
/// digits (docs/FORMAT.md); the store keeps the bytes (store format 13: half the size in
/// the versions row and in every index that holds one). Compared as bytes, which is the
/// order of the digits.
public struct ID128: Hashable, Comparable, Sendable {
    public let high: UInt64
    public let low: UInt64

    public init(high: UInt64, low: UInt64) { self.high = high; self.low = low }

    /// All zero bits: what a damaged column or frame reads as (no id is made so).
    public static let zero = ID128(high: 0, low: 0)

    /// Exactly 32 lowercase hex digits (the only spelling records use).
    public init?(hex: some StringProtocol) {
        guard Hex.isLowercase(hex, count: 32), let bytes = Hex.decode(hex) else { return nil }
        self.init(bytes: bytes)
    }

    /// Exactly 16 bytes, big-endian.
    public init?(bytes: some Collection<UInt8>) {
        guard bytes.count == 16 else { return nil }
        var high: UInt64 = 0, low: UInt64 = 0
        for (i, b) in bytes.enumerated() {
            if i < 8 { high = high << 8 | UInt64(b) } else { low = low << 8 | UInt64(b) }
        }
        self.init(high: high, low: low)
    }

    public var bytes: [UInt8] {
        (0..<16).map { i in UInt8(truncatingIfNeeded: (i < 8 ? high : low) >> (8 * (7 - i % 8))) }
    }

    public var hex: String { withUnsafeBytes(of: (high.bigEndian, low.bigEndian)) { Hex.encode($0) } }

    public static func < (a: ID128, b: ID128) -> Bool { (a.high, a.low) < (b.high, b.low) }

    /// A new id whose first 6 bytes are the wall-clock time in milliseconds and the other
    /// 10 random: ids made later sort later, so the indexes they key take new rows near
    /// their end (a join adds to a few pages per index instead of dirtying pages all over
    /// every B-tree); 80 random bits keep two made in the same millisecond apart. Readers
    /// treat an id as opaque.
    public static func new() -> ID128 {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        let millis = UInt64(max(0, ts.tv_sec)) &* 1000 &+ UInt64(max(0, ts.tv_nsec) / 1_000_000)
        let random = RandomPool.next(), more = RandomPool.next()
        return ID128(high: millis << 16 | random >> 48, low: more)
    }
}

/// What a record id and a history id share; they are two types so that one cannot be
/// passed for the other.
public protocol ID128Wrapper: Hashable, Comparable, Sendable, CustomStringConvertible {
    var value: ID128 { get }
    init(_ value: ID128)
}

extension ID128Wrapper {
    public init?(hex: some StringProtocol) {
        guard let value = ID128(hex: hex) else { return nil }
        self.init(value)
    }
    public static func new() -> Self { Self(ID128.new()) }
    public static var zero: Self { Self(ID128.zero) }
    /// Its 32 lowercase hex digits, as records, names and logs spell it.
    public var description: String { value.hex }
    public var hex: String { value.hex }
    public static func < (a: Self, b: Self) -> Bool { a.value < b.value }
}

/// A record's global id (a version of a file, a tombstone, a directory's or symlink's record).
public struct VersionID: ID128Wrapper {
    public let value: ID128
    public init(_ value: ID128) { self.value = value }
}

/// A file's history id: what its versions share, kept across renames.
public struct FileID: ID128Wrapper {
    public let value: ID128
    public init(_ value: ID128) { self.value = value }
}

/// A device's id: 64 random bits, made once per store (`Store.deviceID`). Everything
/// that writes one spells it as 16 lowercase hex digits: records, segment and backing key
/// names, the store's text columns, logs, status, JSON (docs/FORMAT.md); it is parsed
/// from that text only where it comes in. Kept as the number: the digits are fixed-width,
/// so the number's order is the digits' order, which the conflict winner rule and the
/// key-value stamps compare (docs/FORMAT.md: "device ids compared as bytes").
public struct DeviceID: Hashable, Comparable, Sendable, CustomStringConvertible {
    private let value: UInt64

    private init(value: UInt64) { self.value = value }

    /// Exactly 16 lowercase hex digits (the only spelling there is).
    public init?(hex: some StringProtocol) {
        self.init(digits: hex.utf8)
    }

    /// The same from UTF-8 bytes (a text column read in place: records' devices, at every
    /// fold of a tombstone; a segment's name).
    public init?(digits: some Collection<UInt8>) {
        guard digits.count == 16 else { return nil }
        var value: UInt64 = 0
        for c in digits {
            let digit: UInt8
            switch c {
            case 0x30...0x39: digit = c - 0x30
            case 0x61...0x66: digit = c - 0x61 + 10
            default: return nil
            }
            value = value << 4 | UInt64(digit)
        }
        self.init(value: value)
    }

    /// A new id: 64 bits from the system's generator.
    public static func new() -> DeviceID {
        var rng = SystemRandomNumberGenerator()
        return DeviceID(value: rng.next())
    }

    /// All zero bits: what a damaged text column reads as (no id is made so, but for a
    /// chance of one in 2^64).
    static let zero = DeviceID(value: 0)

    /// Its 16 lowercase hex digits, as records, names and logs spell it.
    public var hex: String { withUnsafeBytes(of: value.bigEndian) { Hex.encode($0) } }
    public var description: String { hex }

    public static func < (a: DeviceID, b: DeviceID) -> Bool { a.value < b.value }
}

/// What a record is a record of: a file's history, or a directory or symlink, whose
/// identity is its path (two devices that both make `photos/` make one directory).
/// Paths compare and hash as bytes: two names that differ only in Unicode normalization
/// are two nodes (Swift's `String` equality would make them one).
public enum NodeID: Hashable, Sendable, CustomStringConvertible {
    case file(FileID)
    case directory(String)
    case symlink(String)

    public var fileID: FileID? {
        if case .file(let id) = self { return id }
        return nil
    }

    public var isDirectory: Bool {
        if case .directory = self { return true }
        return false
    }

    /// The spelling of records before format 13 of the store and in logs: the history
    /// id's hex digits, `dir:<path>` or `link:<path>`.
    public var description: String {
        switch self {
        case .file(let id): id.hex
        case .directory(let path): "dir:" + path
        case .symlink(let path): "link:" + path
        }
    }

    public static func == (a: NodeID, b: NodeID) -> Bool {
        switch (a, b) {
        case (.file(let x), .file(let y)): x == y
        case (.directory(let x), .directory(let y)), (.symlink(let x), .symlink(let y)): x.utf8.elementsEqual(y.utf8)
        default: false
        }
    }

    public func hash(into hasher: inout Hasher) {
        switch self {
        case .file(let id): hasher.combine(0); hasher.combine(id)
        case .directory(let path): hasher.combine(1); for b in path.utf8 { hasher.combine(b) }
        case .symlink(let path): hasher.combine(2); for b in path.utf8 { hasher.combine(b) }
        }
    }
}

/// A node's number in the live tree: the kernel's inode number (`fuse_ino_t`), the `id`
/// of an `inodes` row, and the numbers the filesystem gives its virtual nodes. A type of
/// its own, so that one cannot be passed for a handle, a size or an offset; `rawValue`
/// is read only where a number leaves for the kernel or a database column, and made
/// only where one comes from there (and for the fixed numbers: the root, the virtual
/// ranges' bases).
public struct InodeNumber: Hashable, Comparable, Sendable, CustomStringConvertible {
    public let rawValue: UInt64

    public init(rawValue: UInt64) { self.rawValue = rawValue }

    /// No node's number (to FUSE, an entry of inode 0 is a negative entry; the store
    /// numbers from the root, 1): where a scan in inode order starts.
    public static let zero = InodeNumber(rawValue: 0)

    /// The number `n` places after this one (the next to give out; the virtual ranges'
    /// fixed nodes). Overflow traps.
    public func advanced(by n: UInt64) -> InodeNumber { InodeNumber(rawValue: rawValue + n) }

    public static func < (a: InodeNumber, b: InodeNumber) -> Bool { a.rawValue < b.rawValue }

    /// The decimal number, as logs spell it.
    public var description: String { String(rawValue) }
}

// MARK: in the database

/// Store format 13: ids are 16-byte blobs; a list of parents is their concatenation; a
/// node is its history id's blob, or the text `dir:<path>` / `link:<path>`. A column that
/// does not hold what it should reads as the zero id (and a parent list that is not
/// 16-byte ids as none) rather than stopping the daemon: the store is this program's own.
extension SQLValue {
    static func id(_ id: some ID128Wrapper) -> SQLValue { .blob(id.value.bytes) }
    static func ids(_ ids: [VersionID]) -> SQLValue { .blob(ids.flatMap(\.value.bytes)) }
    static func node(_ node: NodeID) -> SQLValue {
        if case .file(let id) = node { return .id(id) }
        return .text(node.description)
    }
    /// Device ids stay text in the store (`devices`, `sync_peers`, `pruned_records`, `kv`).
    static func device(_ id: DeviceID) -> SQLValue { .text(id.hex) }

    /// An inode number in an INTEGER column: its 64 bits as SQLite's signed integer.
    static func inode(_ id: InodeNumber) -> SQLValue { .int(Int64(bitPattern: id.rawValue)) }
}

extension InodeNumber {
    /// Whether an `inodes` row can have this number (SQLite's integers are signed): a
    /// larger one names no row.
    var fitsColumn: Bool { rawValue <= UInt64(Int64.max) }
}

extension SQLRow {
    func id128(_ column: Int32) -> ID128 { ID128(bytes: blob(column)) ?? .zero }
    func versionID(_ column: Int32) -> VersionID { VersionID(id128(column)) }
    func fileID(_ column: Int32) -> FileID { FileID(id128(column)) }
    func optionalFileID(_ column: Int32) -> FileID? { isNull(column) ? nil : fileID(column) }
    func inode(_ column: Int32) -> InodeNumber { InodeNumber(rawValue: UInt64(bitPattern: int(column))) }
    func versionIDs(_ column: Int32) -> [VersionID] {
        guard isBlob(column) else { return [] }
        let bytes = blob(column)
        guard bytes.count % 16 == 0 else { return [] }
        return stride(from: 0, to: bytes.count, by: 16).compactMap { ID128(bytes: bytes[$0..<$0 + 16]).map(VersionID.init) }
    }
    func deviceID(_ column: Int32) -> DeviceID { DeviceID(digits: utf8(column)) ?? .zero }
    func nodeID(_ column: Int32) -> NodeID {
        if isText(column) {
            // By bytes: `String.hasPrefix` compares characters, and a path that begins
            // with a combining mark makes one character of it and the colon.
            let bytes = blob(column)
            if bytes.starts(with: "dir:".utf8) { return .directory(String(decoding: bytes.dropFirst(4), as: UTF8.self)) }
            if bytes.starts(with: "link:".utf8) { return .symlink(String(decoding: bytes.dropFirst(5), as: UTF8.self)) }
        }
        return .file(fileID(column))
    }
}
