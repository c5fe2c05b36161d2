import Glibc
import UbiquityStore

/// What getattr reports; the FUSE layer copies it into `struct stat`.
public struct Attributes: Sendable, Equatable {
    public var ino: InodeNumber
    /// Full st_mode: file type bits and permission bits.
    public var mode: UInt32
    public var nlink: UInt32
    public var uid: UInt32
    public var gid: UInt32
    public var size: Int64
    public var rdev: UInt64
    public var atime: Nanos
    public var mtime: Nanos
    public var ctime: Nanos

    /// Bytes held (not holes), so `du` and `cp --sparse` see a sparse file as sparse.
    public var allocated: Int64

    /// A node of the hidden views that never changes (a version under .versions/): the
    /// kernel may cache it like a live node. Other virtual nodes are never cached.
    public var immutable = false

    /// How long the kernel may cache this node's entry and attributes, in seconds.
    public func cacheSeconds(live: Double) -> Double {
        !VirtualViews.isVirtual(ino) || immutable ? live : 0
    }

    public var isDirectory: Bool { mode & UInt32(S_IFMT) == UInt32(S_IFDIR) }
    public var isSticky: Bool { mode & UInt32(S_ISVTX) != 0 }

    /// st_blocks: 512-byte units of `allocated` (at most maxFileSize, so no overflow).
    public var blocks: Int64 { allocated / 512 + (allocated % 512 == 0 ? 0 : 1) }

    init(_ inode: Inode, size: Int64? = nil, allocated: Int64? = nil) {
        ino = inode.id
        mode = NodeKindBits.bits(inode.kind) | inode.mode
        nlink = inode.nlink
        uid = inode.uid
        gid = inode.gid
        self.size = size ?? inode.size
        // Not capped by the size: KEEP_SIZE reserves past the end count, as on ext4.
        // Bytes not on this device (files on demand) take no disk here: `du` shows what is
        // local, `du --apparent-size` the size.
        self.allocated = min(max(allocated ?? inode.allocated - inode.absent, 0), maxFileSize)
        rdev = inode.rdev
        atime = inode.atime
        mtime = inode.mtime
        ctime = inode.ctime
    }

    init(virtual ino: InodeNumber, directory: Bool, size: Int64, time: Nanos, uid: UInt32, gid: UInt32) {
        self.ino = ino
        mode = directory ? UInt32(S_IFDIR) | 0o555 : UInt32(S_IFREG) | 0o444
        nlink = directory ? 2 : 1
        self.uid = uid
        self.gid = gid
        self.size = size
        allocated = size
        rdev = 0
        atime = time; mtime = time; ctime = time
    }
}

enum NodeKindBits {
    static func bits(_ kind: NodeKind) -> UInt32 {
        switch kind {
        case .file: return UInt32(S_IFREG)
        case .directory: return UInt32(S_IFDIR)
        case .symlink: return UInt32(S_IFLNK)
        case .fifo: return UInt32(S_IFIFO)
        case .socket: return UInt32(S_IFSOCK)
        case .blockDevice: return UInt32(S_IFBLK)
        case .characterDevice: return UInt32(S_IFCHR)
        }
    }

    static func kind(mode: UInt32) -> NodeKind? {
        switch mode & UInt32(S_IFMT) {
        case UInt32(S_IFREG), 0: return .file
        case UInt32(S_IFDIR): return .directory
        case UInt32(S_IFLNK): return .symlink
        case UInt32(S_IFIFO): return .fifo
        case UInt32(S_IFSOCK): return .socket
        case UInt32(S_IFBLK): return .blockDevice
        case UInt32(S_IFCHR): return .characterDevice
        default: return nil
        }
    }
}

/// Who is asking (from the FUSE request): new nodes are theirs.
public struct Caller: Sendable {
    public var uid: UInt32
    public var gid: UInt32
    public init(uid: UInt32, gid: UInt32) { self.uid = uid; self.gid = gid }
}
