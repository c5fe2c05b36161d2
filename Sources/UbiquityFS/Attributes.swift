import Glibc
import UbiquityStore

/// What getattr reports; the FUSE layer copies it into `struct stat`.
public struct Attributes: Sendable, Equatable {
    public var ino: UInt64
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

    public var blocks: Int64 { (size + 511) / 512 }

    init(_ inode: Inode, size: Int64? = nil) {
        ino = inode.id
        mode = NodeKindBits.bits(inode.kind) | inode.mode
        nlink = inode.nlink
        uid = inode.uid
        gid = inode.gid
        self.size = size ?? inode.size
        rdev = inode.rdev
        atime = inode.atime
        mtime = inode.mtime
        ctime = inode.ctime
    }

    init(virtual ino: UInt64, directory: Bool, size: Int64, time: Nanos, uid: UInt32, gid: UInt32) {
        self.ino = ino
        mode = directory ? UInt32(S_IFDIR) | 0o555 : UInt32(S_IFREG) | 0o444
        nlink = directory ? 2 : 1
        self.uid = uid
        self.gid = gid
        self.size = size
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
        }
    }

    static func kind(mode: UInt32) -> NodeKind? {
        switch mode & UInt32(S_IFMT) {
        case UInt32(S_IFREG), 0: return .file
        case UInt32(S_IFDIR): return .directory
        case UInt32(S_IFLNK): return .symlink
        case UInt32(S_IFIFO): return .fifo
        case UInt32(S_IFSOCK): return .socket
        default: return nil
        }
    }
}

/// Who is asking (from the FUSE request): new nodes are theirs.
public struct Caller: Sendable {
    public var uid: UInt32
    public var gid: UInt32
    public var umask: UInt32
    public init(uid: UInt32, gid: UInt32, umask: UInt32 = 0) { self.uid = uid; self.gid = gid; self.umask = umask }
}
