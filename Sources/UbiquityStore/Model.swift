/// Glossary
/// - Chunk: an immutable run of bytes named by its SHA-256 (`ChunkID`), shared by every
///   version that contains it.
/// - Version: one committed state of a file: its chunk list, size, mode, mtime, the device
///   that made it and its parent version(s). Versions are never changed, only added.
/// - History (`FileID`): the identity a file's versions share. It survives renames, and a
///   rename over an existing file continues the target's history.
/// - Inode: a live node of the tree (file, directory, symlink, fifo) with its attributes.
/// - Device: one mount of one store; it has a stable random id (`DeviceID`) and a human name.
/// - Local-only: a file under a `.nosync` name or an editor scratch file; its content is
///   stored (latest only) but never kept as history nor synced.

public enum NodeKind: Int64, Sendable {
    case file = 1, directory = 2, symlink = 3, fifo = 4, socket = 5, blockDevice = 6, characterDevice = 7

    /// Nodes that live only on this device: they have no content to version or sync.
    public var isLocalNode: Bool { self == .fifo || self == .socket || self == .blockDevice || self == .characterDevice }
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
    /// Bytes of the committed content held in chunks, not holes.
    public var allocated: Int64
    /// Bytes of those chunks that are not on this device (files on demand: st_blocks
    /// counts `allocated - absent`; 0 once downloaded). Refreshed when a file's chunks
    /// arrive or go (`Store.refreshAbsent`).
    public var absent: Int64 = 0
    /// What this device keeps of the file (files on demand; local, never synced).
    public var keep = KeepPolicy.automatic
    public var atime: Nanos
    public var mtime: Nanos
    public var ctime: Nanos
    public var rdev: UInt64
    public var target: String?
    /// History identity (files only).
    public var fileID: FileID?
    /// Row of the current version (files only; nil before the first commit).
    public var head: Int64?
    /// Number of directory entries naming this inode (plus subdirectories for directories).
    public var nlink: UInt32 = 0

    public init(id: InodeNumber, kind: NodeKind, mode: UInt32, uid: UInt32, gid: UInt32, size: Int64 = 0,
                time: Nanos, rdev: UInt64 = 0, target: String? = nil, fileID: FileID? = nil) {
        self.id = id; self.kind = kind; self.mode = mode; self.uid = uid; self.gid = gid; self.size = size; allocated = size
        atime = time; mtime = time; ctime = time
        self.rdev = rdev; self.target = target; self.fileID = fileID
    }
}

/// How much of a file's current content is on this device (`user.ubiquity.downloaded`,
/// `ubiquity query`; Apple's Current / Downloaded / NotDownloaded).
public enum DownloadState: String, Sendable {
    case current
    case partial
    case notDownloaded = "not-downloaded"

    /// The one rule: `current` when nothing is absent; `not-downloaded` when at most the
    /// small tail that came inside the record is here (a chunk of at most 1 KiB, the
    /// inline limit: only a file's last chunk can be that small); else `partial`.
    public init(allocated: Int64, absent: Int64) {
        if absent <= 0 { self = .current } else if allocated - absent <= 1024 { self = .notDownloaded } else { self = .partial }
    }
}

/// What a device keeps of a file's content (`ubiquity pin`, `evict`).
public enum KeepPolicy: Int64, Sendable {
    /// As the mount's `--download` mode says (and the cache limit may evict it).
    case automatic = 0
    /// Always here: downloaded in either mode, never evicted by the cache limit.
    case pinned = 1
    /// Evicted by hand: not downloaded again in the background (a read still fetches).
    case evicted = 2
}

/// One committed version (metadata only; the chunk list is loaded on demand).
public struct Version: Sendable, Equatable {
    public let row: Int64
    /// Global id, the same on every device.
    public let id: VersionID
    /// What it is a version of: a file's history (a directory's or symlink's record when
    /// read by row).
    public let node: NodeID
    public let parents: [VersionID]
    public let deviceID: DeviceID
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

/// The largest file the store keeps: 2^62 bytes (4 EiB). Every size and offset from the
/// kernel, the database or another device is checked against it before any arithmetic,
/// so sums of sizes and offsets never overflow an Int64. Beyond it: EFBIG.
public let maxFileSize: Int64 = 1 << 62

/// A version's content: its pieces in order. A piece is a stored chunk (named by its
/// hash), an *inline* chunk (at most `inlineLimit` bytes, kept in the list itself: a tiny
/// file's content lives in its version row, store format 14), or a *hole*, a run of zero
/// bytes of any length that is stored nowhere, so a sparse file costs what was written,
/// not what was claimed. An inline chunk is named by its hash too, so lists, records and
/// the backing store see the same ids whichever way a device keeps the bytes.
public struct ChunkList: Sendable, Equatable {
    /// Chunks up to this size are kept in the list (`appendInline`). At 64 bytes a copy per
    /// version never costs more than a shared chunk would: a row of small.sqlite (about 54
    /// bytes besides the content) plus the 32-byte hash in every list naming it.
    public static let inlineLimit = 64

    /// ids[i] is piece i's chunk, or `ChunkID.hole`.
    public private(set) var ids: [ChunkID] = []
    /// offsets[i] is where piece i starts; offsets.last is the total size.
    public private(set) var offsets: [Int64] = [0]
    /// The bytes of the inline chunks, by id (an id's bytes are the same wherever it is).
    public private(set) var inline: [ChunkID: [UInt8]] = [:]

    public init() {}

    /// Equal when they name the same pieces: whether a chunk's bytes are kept inline or in
    /// the chunk store is how a device keeps them, not what the content is.
    public static func == (a: ChunkList, b: ChunkList) -> Bool { a.ids == b.ids && a.offsets == b.offsets }

    public var count: Int { ids.count }
    public var totalSize: Int64 { offsets.last! }

    public func size(_ i: Int) -> Int64 { offsets[i + 1] - offsets[i] }
    public func range(_ i: Int) -> Range<Int64> { offsets[i]..<offsets[i + 1] }
    public func isHole(_ i: Int) -> Bool { ids[i] == .hole }
    public func isInline(_ i: Int) -> Bool { inline[ids[i]] != nil }

    /// Piece i as the chunk store has it: nil for a hole or an inline chunk, which no
    /// store, fetch, download, eviction or gc ever needs.
    public func stored(_ i: Int) -> ChunkWant? {
        isHole(i) || isInline(i) ? nil : ChunkWant(id: ids[i], size: Int(size(i)))
    }

    /// The chunks kept in the chunk store with their sizes, holes and inline chunks left
    /// out (fsck, uploads, downloads, eviction, gc).
    public var chunks: [(id: ChunkID, size: Int)] {
        (0..<count).compactMap { i in stored(i).map { ($0.id, $0.size) } }
    }

    /// Bytes held in chunks (the file's size less its holes).
    public var storedBytes: Int64 {
        var total: Int64 = 0
        for i in 0..<count where !isHole(i) { total += size(i) }
        return total
    }

    /// Appends a stored chunk of `size` bytes (1...ChunkStore.maxChunkSize).
    public mutating func append(_ id: ChunkID, size: Int) {
        precondition(id != .hole && size > 0 && size <= ChunkStore.maxChunkSize && totalSize <= maxFileSize - Int64(size))
        ids.append(id)
        offsets.append(totalSize + Int64(size))
    }

    /// Appends a chunk of 1...`inlineLimit` bytes kept in the list.
    public mutating func appendInline(_ bytes: [UInt8]) {
        precondition(!bytes.isEmpty && bytes.count <= Self.inlineLimit)
        let id = ChunkID(hashing: bytes)
        append(id, size: bytes.count)
        inline[id] = bytes
    }

    /// Appends a chunk, inline when it is small enough (every writer's one rule), else
    /// handed to `store` with its id (which stores it).
    public mutating func append<E: Error>(_ bytes: UnsafeRawBufferPointer, storedBy store: (ChunkID, UnsafeRawBufferPointer) throws(E) -> Void) throws(E) {
        if bytes.count <= Self.inlineLimit {
            appendInline(Array(bytes))
        } else {
            let id = ChunkID(hashing: bytes)
            try store(id, bytes)
            append(id, size: bytes.count)
        }
    }

    /// Keeps inline those of `bytes` (a record's small chunks, checked against their ids)
    /// that are pieces of this list of at most `inlineLimit` bytes.
    public mutating func keepInline(_ bytes: [ChunkID: [UInt8]]) {
        for i in 0..<count where !isHole(i) && size(i) <= Int64(Self.inlineLimit) {
            if let b = bytes[ids[i]], Int64(b.count) == size(i) { inline[ids[i]] = b }
        }
    }

    /// Appends `length` zero bytes, joining a hole that ends the list.
    public mutating func appendHole(_ length: Int64) {
        guard length > 0 else { return }
        precondition(totalSize <= maxFileSize - length)
        if ids.last == .hole {
            offsets[offsets.count - 1] += length
        } else {
            ids.append(.hole)
            offsets.append(totalSize + length)
        }
    }

    /// Appends piece `i` of `other` (a chunk, inline or stored, or a hole).
    public mutating func append(pieceOf other: ChunkList, at i: Int) {
        if other.isHole(i) {
            appendHole(other.size(i))
        } else {
            append(other.ids[i], size: Int(other.size(i)))
            if let bytes = other.inline[other.ids[i]] { inline[other.ids[i]] = bytes }
        }
    }

    /// The index of the piece containing byte `offset` (offset < totalSize).
    public func index(containing offset: Int64) -> Int {
        var lo = 0, hi = ids.count - 1
        while lo < hi {
            let mid = (lo + hi + 1) / 2
            if offsets[mid] <= offset { lo = mid } else { hi = mid - 1 }
        }
        return lo
    }

    /// Marks an inline entry in its 4-byte size field (chunk sizes stay below 2^23).
    private static let inlineFlag: UInt32 = 1 << 31

    /// Serialized form (the versions table's `chunks` column, the intent log). Every entry
    /// ends in a 4-byte little-endian size field, so a list is read from its end:
    /// - a stored chunk: its 32 digest bytes, then its size (1...4 MiB);
    /// - a hole (store format 3): its length as 8 bytes little-endian, 24 zero bytes, then
    ///   a size field of 0, which no chunk has;
    /// - an inline chunk (store format 14): its n bytes, then n with the top bit set.
    /// Lists written before format 14 (36-byte entries only) read unchanged.
    public var encoded: [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(ids.count * 36)
        for i in 0..<count {
            if isHole(i) {
                withUnsafeBytes(of: size(i).littleEndian) { out += $0 }
                out += [UInt8](repeating: 0, count: 28)
            } else if let bytes = inline[ids[i]] {
                out += bytes
                withUnsafeBytes(of: (Self.inlineFlag | UInt32(bytes.count)).littleEndian) { out += $0 }
            } else {
                out += ids[i].raw
                withUnsafeBytes(of: UInt32(size(i)).littleEndian) { out += $0 }
            }
        }
        return out
    }

    /// Decodes `encoded`; nil for anything malformed (a bad length, a chunk size out of
    /// range, a total over `maxFileSize`): the bytes come from disk and are not trusted.
    public init?(encoded: [UInt8]) {
        // Read from the end, entry by entry, then appended in order.
        enum Entry { case chunk(ChunkID, Int), inline([UInt8]), hole(Int64) }
        var entries: [Entry] = []
        var end = encoded.count
        while end > 0 {
            guard end >= 4 else { return nil }
            let field = UInt32(encoded[end - 4]) | UInt32(encoded[end - 3]) << 8 | UInt32(encoded[end - 2]) << 16 | UInt32(encoded[end - 1]) << 24
            if field & Self.inlineFlag != 0 {
                let n = Int(field & ~Self.inlineFlag)
                guard n >= 1, n <= Self.inlineLimit, end - 4 >= n else { return nil }
                entries.append(.inline(Array(encoded[end - 4 - n..<end - 4])))
                end -= 4 + n
                continue
            }
            guard end >= 36 else { return nil }
            let i = end - 36
            if field == 0 {
                var length: Int64 = 0
                for k in 0..<8 { length |= Int64(encoded[i + k]) << (8 * k) }
                guard length > 0, encoded[i + 8..<i + 32].allSatisfy({ $0 == 0 }) else { return nil }
                entries.append(.hole(length))
            } else {
                guard let id = ChunkID(raw: encoded[i..<i + 32]), id != .hole, field <= UInt32(ChunkStore.maxChunkSize) else { return nil }
                entries.append(.chunk(id, Int(field)))
            }
            end = i
        }
        for entry in entries.reversed() {
            switch entry {
            case .chunk(let id, let size):
                guard Int64(size) <= maxFileSize - totalSize else { return nil }
                append(id, size: size)
            case .inline(let bytes):
                guard Int64(bytes.count) <= maxFileSize - totalSize else { return nil }
                appendInline(bytes)
            case .hole(let length):
                guard length <= maxFileSize - totalSize else { return nil }
                appendHole(length)
            }
        }
        // A piece named by an inline chunk's id is that chunk: the same size (a damaged row
        // naming it with another size would have a reader copy past its bytes).
        if !inline.isEmpty {
            for i in 0..<count where !isHole(i) {
                if let bytes = inline[ids[i]], Int64(bytes.count) != size(i) { return nil }
            }
        }
    }
}
