/// One record as it travels between devices (docs/FORMAT.md): a version of a file, a
/// directory or a symlink, or a tombstone. Locally each is a row of the versions table.
public struct SyncRecord: Sendable, Equatable {
    public var id: VersionID
    /// The history id of a file; the path of a directory or symlink.
    public var node: NodeID
    public var kind: NodeKind
    public var parents: [VersionID]
    public var deviceID: DeviceID
    public var deviceName: String
    public var committed: Nanos
    public var mtime: Nanos
    public var mode: UInt32
    public var isTombstone: Bool
    /// Same content as the first parent; only path, mode, mtime or xattrs changed.
    public var isMeta: Bool
    public var path: String
    public var chunks: ChunkList
    public var target: String?
    /// User xattrs, names without the `user.` prefix, sorted by name.
    public var xattrs: [XattrEntry]
    /// The bytes of small chunks, carried inside the record instead of as objects
    /// (backing format 3); filled by the sender, checked against their ids by the codec.
    /// Not stored as such: the chunks are (those of at most `ChunkList.inlineLimit` bytes
    /// kept in `chunks` itself, store format 14; the codec puts them there).
    public var inline: [ChunkID: [UInt8]] = [:]
    /// Where its chunks that are not inline are in the backing store's packs (backing
    /// format 5): filled by the sender from the store's `chunk_places`, read from the
    /// record by a receiver, which learns them. Never stored in the versions table.
    public var places: [ChunkID: ChunkPlace] = [:]
    /// Its dot and the dots it descends from (backing format 4; empty in older records).
    public var lineage = Lineage()

    public init(id: VersionID, node: NodeID, kind: NodeKind, parents: [VersionID], deviceID: DeviceID, deviceName: String,
                committed: Nanos, mtime: Nanos, mode: UInt32, isTombstone: Bool, isMeta: Bool, path: String,
                chunks: ChunkList = ChunkList(), target: String? = nil, xattrs: [XattrEntry] = []) {
        self.id = id; self.node = node; self.kind = kind; self.parents = parents; self.deviceID = deviceID
        self.deviceName = deviceName; self.committed = committed; self.mtime = mtime; self.mode = mode
        self.isTombstone = isTombstone; self.isMeta = isMeta; self.path = path; self.chunks = chunks
        self.target = target; self.xattrs = xattrs
    }

    public var size: Int64 { kind == .symlink ? Int64(target.map(NameCodec.byteCount) ?? 0) : chunks.totalSize }
}

/// A chunk's bytes in the backing store: pack `pack` (32 hex digits), from byte `offset`
/// (its length is the chunk's size).
public struct ChunkPlace: Sendable, Equatable, Hashable {
    public let pack: String
    public let offset: Int64
    public init(pack: String, offset: Int64) {
        self.pack = pack
        self.offset = offset
    }
}

public struct XattrEntry: Sendable, Equatable {
    public var name: String
    public var value: [UInt8]
    public init(name: String, value: [UInt8]) { self.name = name; self.value = value }
}

/// The xattrs column: per entry a 2-byte name length, the name, a 4-byte value length,
/// the value (little-endian).
enum XattrCodec {
    static func encode(_ entries: [XattrEntry]) -> [UInt8] {
        var out: [UInt8] = []
        for e in entries {
            let name = Array(e.name.utf8)
            out += [UInt8(name.count & 0xFF), UInt8(name.count >> 8)] + name
            let n = e.value.count
            out += [UInt8(n & 0xFF), UInt8((n >> 8) & 0xFF), UInt8((n >> 16) & 0xFF), UInt8(n >> 24)] + e.value
        }
        return out
    }

    static func decode(_ bytes: [UInt8]) -> [XattrEntry] {
        var result: [XattrEntry] = []
        var i = 0
        while i + 2 <= bytes.count {
            let n = Int(bytes[i]) | Int(bytes[i + 1]) << 8
            i += 2
            guard i + n + 4 <= bytes.count else { break }
            let name = String(decoding: bytes[i..<i + n], as: UTF8.self)
            i += n
            let m = Int(bytes[i]) | Int(bytes[i + 1]) << 8 | Int(bytes[i + 2]) << 16 | Int(bytes[i + 3]) << 24
            i += 4
            guard i + m <= bytes.count else { break }
            result.append(XattrEntry(name: name, value: Array(bytes[i..<i + m])))
            i += m
        }
        return result
    }
}
