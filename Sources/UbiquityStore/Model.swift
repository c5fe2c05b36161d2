/// Glossary
/// - Chunk: an immutable run of bytes named by its SHA-256 (`ChunkID`), shared by every
///   version that contains it.
/// - Version: one committed state of a file: its chunk list, size, mode, mtime, the device
///   that made it and its parent version(s). Versions are never changed, only added.
/// - History (`FileID`): the identity a file's versions share. It survives renames, and a
///   rename over an existing file continues the target's history.
/// - Inode: a live node of the tree (file, directory, symlink, fifo) with its attributes.
/// - Device: one mount of one store; it has a stable random id and a human name.
/// - Local-only: a file under a `.nosync` name or an editor scratch file; its content is
///   stored (latest only) but never kept as history nor synced.

public typealias InodeNumber = UInt64

public enum NodeKind: Int64, Sendable {
    case file = 1, directory = 2, symlink = 3, fifo = 4, socket = 5
}

/// Nanoseconds since the Unix epoch.
public typealias Nanos = Int64

public struct Inode: Sendable, Equatable {
    public var id: InodeNumber
    public var kind: NodeKind
    /// Permission bits (07777), not the file type.
    public var mode: UInt32
    public var uid: UInt32
    public var gid: UInt32
    /// Committed size for files; target length for symlinks.
    public var size: Int64
    public var atime: Nanos
    public var mtime: Nanos
    public var ctime: Nanos
    public var rdev: UInt64
    public var target: String?
    /// History identity (files only).
    public var fileID: String?
    /// Row of the current version (files only; nil before the first commit).
    public var head: Int64?
    /// Number of directory entries naming this inode (plus subdirectories for directories).
    public var nlink: UInt32 = 0

    public init(id: InodeNumber, kind: NodeKind, mode: UInt32, uid: UInt32, gid: UInt32, size: Int64 = 0,
                time: Nanos, rdev: UInt64 = 0, target: String? = nil, fileID: String? = nil) {
        self.id = id; self.kind = kind; self.mode = mode; self.uid = uid; self.gid = gid; self.size = size
        atime = time; mtime = time; ctime = time
        self.rdev = rdev; self.target = target; self.fileID = fileID
    }
}

/// One committed version (metadata only; the chunk list is loaded on demand).
public struct Version: Sendable, Equatable {
    public let row: Int64
    /// Global id, the same on every device: 32 hex digits.
    public let id: String
    public let fileID: String
    public let parents: [String]
    public let deviceID: String
    public let deviceName: String
    /// When it was committed (its name sorts by this).
    public let committed: Nanos
    public let mtime: Nanos
    public let mode: UInt32
    public let size: Int64
    public let isTombstone: Bool
    public let isLocal: Bool
    /// The file's path (relative to the container root) when it was committed.
    public let path: String
}

/// A version's content: its chunks in order, with their sizes.
public struct ChunkList: Sendable, Equatable {
    public var ids: [ChunkID] = []
    public var sizes: [UInt32] = []
    /// offsets[i] is where chunk i starts; offsets.last is the total size.
    public private(set) var offsets: [Int64] = [0]

    public init() {}

    public var count: Int { ids.count }
    public var totalSize: Int64 { offsets.last! }

    public mutating func append(_ id: ChunkID, size: Int) {
        ids.append(id)
        sizes.append(UInt32(size))
        offsets.append(offsets.last! + Int64(size))
    }

    /// The index of the chunk containing byte `offset` (offset < totalSize).
    public func index(containing offset: Int64) -> Int {
        var lo = 0, hi = ids.count - 1
        while lo < hi {
            let mid = (lo + hi + 1) / 2
            if offsets[mid] <= offset { lo = mid } else { hi = mid - 1 }
        }
        return lo
    }

    /// Serialized form: per chunk 32 digest bytes + 4-byte little-endian size.
    public var encoded: [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(ids.count * 36)
        for (id, size) in zip(ids, sizes) {
            out += id.raw
            withUnsafeBytes(of: size.littleEndian) { out += $0 }
        }
        return out
    }

    public init?(encoded: [UInt8]) {
        guard encoded.count % 36 == 0 else { return nil }
        var i = 0
        while i < encoded.count {
            guard let id = ChunkID(raw: encoded[i..<i + 32]) else { return nil }
            let size = UInt32(encoded[i + 32]) | UInt32(encoded[i + 33]) << 8 | UInt32(encoded[i + 34]) << 16 | UInt32(encoded[i + 35]) << 24
            append(id, size: Int(size))
            i += 36
        }
    }
}
