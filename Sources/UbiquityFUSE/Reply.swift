import CFuse
import Glibc
import Synchronization
import UbiquityFS
import UbiquityStore

/// The filesystem and per-mount settings, reached from C callbacks through libfuse's
/// userdata pointer (callbacks cannot capture context).
final class MountContext: Sendable {
    let fs: FileSystem
    /// The INIT request whose reply `KernelChannel` amends (0: none pending).
    let initUnique = Atomic<UInt64>(0)
    /// Whether the daemon checks permissions itself (`Permissions.daemonChecks`).
    let checksPermissions: Bool
    /// /dev/fuse, for the notices libfuse has no call for (`KernelChannel.expireNames`).
    let channel = Atomic<Int32>(-1)
    init(fs: FileSystem, checksPermissions: Bool) {
        self.fs = fs
        self.checksPermissions = checksPermissions
    }
}

/// Every request asks for it first: the request is noted as activity, which the group
/// commit's fold waits to pause (`FileSystem.noteRequest`).
func context(_ req: fuse_req_t?) -> MountContext {
    let context = Unmanaged<MountContext>.fromOpaque(fuse_req_userdata(req)!).takeUnretainedValue()
    context.fs.noteRequest()
    return context
}

func caller(_ req: fuse_req_t?) -> Caller {
    let ctx = fuse_req_ctx(req)!.pointee
    return Caller(uid: ctx.uid, gid: ctx.gid) // the kernel has applied the umask already
}

/// The caller, for `Permissions`: its supplementary groups are read from /proc by libfuse
/// only if a rule asks (the request carries uid, gid and pid only).
func requester(_ req: fuse_req_t?) -> Requester {
    let ctx = fuse_req_ctx(req)!.pointee
    return Requester(uid: ctx.uid, gid: ctx.gid) {
        var list = [gid_t](repeating: 0, count: 64)
        var count = Int(fuse_req_getgroups(req, Int32(list.count), &list))
        if count > list.count, count <= maxGroups {
            list = [gid_t](repeating: 0, count: count)
            count = Int(fuse_req_getgroups(req, Int32(list.count), &list))
        }
        return count > 0 ? Array(list.prefix(min(count, list.count))) : []
    }
}

/// NGROUPS_MAX: more than this is no answer libfuse could give.
private let maxGroups = 65536

/// The daemon's own check that the caller may have `want` of `ino`, on mounts where the
/// kernel does not check (none otherwise). `directory`: `ino` is known to be a directory
/// (a request's parent), so root needs no attributes to be let through.
func require(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ want: Access, directory: Bool = false) throws(Errno) {
    let mount = context(req)
    guard mount.checksPermissions else { return }
    // Root's requests, nearly all of a root mount's, pass here without a Requester.
    if fuse_req_ctx(req)!.pointee.uid == 0, directory || !want.contains(.execute) { return }
    try Permissions.check(try mount.fs.getattr(inode(ino)), want, by: requester(req))
}

/// An inode number from the kernel, as the filesystem types it (the kernel's numbers
/// are the ones `Attributes.ino` gave it).
func inode(_ ino: fuse_ino_t) -> InodeNumber { InodeNumber(rawValue: ino) }

/// The handle open or opendir left in `fi->fh`, which the kernel hands back with every
/// later request on that open file.
func handle(_ fi: UnsafeMutablePointer<fuse_file_info>?) -> HandleID { HandleID(rawValue: fi!.pointee.fh) }

/// A name from the kernel as a Swift string, byte for byte (NameCodec: any bytes work).
/// Longer than NAME_MAX (255 bytes): ENAMETOOLONG, as ext4 answers, for lookups too.
func name(_ c: UnsafePointer<CChar>?) throws(Errno) -> String {
    try text(c, maxBytes: 255)
}

/// A symlink target from the kernel (at most PATH_MAX - 1 bytes).
func target(_ c: UnsafePointer<CChar>?) throws(Errno) -> String {
    try text(c, maxBytes: 4095)
}

/// An xattr name from the kernel (the kernel allows at most 255 bytes).
func xattrName(_ c: UnsafePointer<CChar>?) throws(Errno) -> String {
    try text(c, maxBytes: 255)
}

private func text(_ c: UnsafePointer<CChar>?, maxBytes: Int) throws(Errno) -> String {
    guard let c else { throw .invalid }
    let length = strnlen(c, maxBytes + 1)
    guard length <= maxBytes else { throw .nameTooLong }
    return NameCodec.string(UnsafeRawBufferPointer(start: c, count: length))
}

/// A string as the NUL-terminated bytes the kernel gets back (NameCodec).
func withCName<R>(_ name: String, _ body: (UnsafePointer<CChar>, Int) -> R) -> R {
    // Nearly every name is its own UTF-8 (no NUL: names cannot hold one), which a native
    // string keeps NUL-terminated: no copy.
    if !NameCodec.mayHoldEscapes(name) { return name.withCString { body($0, name.utf8.count) } }
    let bytes = NameCodec.bytes(name) + [0]
    return bytes.withUnsafeBufferPointer { raw in
        raw.withMemoryRebound(to: CChar.self) { body($0.baseAddress!, bytes.count - 1) }
    }
}

/// Runs an operation and replies with its errno on failure. Every request gets exactly
/// one reply: `body` replies on success, this replies on error.
func reply(_ req: fuse_req_t?, _ body: () throws(Errno) -> Void) {
    do throws(Errno) {
        try body()
    } catch {
        fuse_reply_err(req, error.code)
    }
}

/// Attribute and entry validity for real nodes: five minutes. Everything that changes a
/// node comes through the kernel, except what sync and conflict resolution change, and
/// those send `notify_inval_inode`/`_entry` for exactly what they changed
/// (`FUSESession.invalidate`). So the kernel may keep names and attributes long: a
/// `tar -x` or `git clone` looks up each directory once, not once a second.
/// Not forever: the bound limits what a missed invalidation could ever show.
let cacheTimeout = 300.0

func statBuffer(_ a: Attributes) -> stat {
    var st = stat()
    st.st_ino = ino_t(a.ino.rawValue)
    st.st_mode = mode_t(a.mode)
    st.st_nlink = nlink_t(a.nlink)
    st.st_uid = a.uid
    st.st_gid = a.gid
    st.st_size = off_t(a.size)
    st.st_blocks = blkcnt_t(a.blocks)
    st.st_blksize = 4096
    st.st_rdev = dev_t(a.rdev)
    st.st_atim = timespec(a.atime)
    st.st_mtim = timespec(a.mtime)
    st.st_ctim = timespec(a.ctime)
    return st
}

func entryParam(_ a: Attributes) -> fuse_entry_param {
    var e = fuse_entry_param()
    e.ino = a.ino.rawValue
    e.generation = 1
    e.attr = statBuffer(a)
    let timeout = a.cacheSeconds(live: cacheTimeout)
    e.attr_timeout = timeout
    e.entry_timeout = timeout
    return e
}

func replyEntry(_ req: fuse_req_t?, _ a: Attributes) {
    var e = entryParam(a)
    fuse_reply_entry(req, &e)
}

/// A name that is not there, for the kernel to remember (an entry of inode 0).
func replyNoEntry(_ req: fuse_req_t?) {
    var e = fuse_entry_param()
    e.entry_timeout = cacheTimeout
    fuse_reply_entry(req, &e)
}

/// A read's bytes, sent from the pieces as they are (one iovec each, no copy into one
/// buffer first). Each piece's address is valid only inside its own
/// `withUnsafeBufferPointer`, so the calls nest; the caller bounds the count
/// (`FileContent.maxPieces`).
func replyPieces(_ req: fuse_req_t?, _ pieces: [ArraySlice<UInt8>]) {
    let pieces = pieces.filter { !$0.isEmpty }
    var iov: [iovec] = []
    iov.reserveCapacity(pieces.count)
    func nest(_ k: Int) {
        guard k < pieces.count else {
            _ = fuse_reply_iov(req, iov, Int32(iov.count))
            return
        }
        pieces[k].withUnsafeBufferPointer { b in
            iov.append(iovec(iov_base: UnsafeMutableRawPointer(mutating: b.baseAddress), iov_len: b.count))
            nest(k + 1)
        }
    }
    nest(0)
}

func replyAttr(_ req: fuse_req_t?, _ a: Attributes) {
    var st = statBuffer(a)
    fuse_reply_attr(req, &st, a.cacheSeconds(live: cacheTimeout))
}

extension timespec {
    /// Floor division: times before 1970 need tv_nsec in 0..<1e9 with a smaller tv_sec
    /// (t-differential.py seed 1018991498 checks it).
    init(_ nanos: Nanos) {
        var seconds = nanos / 1_000_000_000
        var rest = nanos % 1_000_000_000
        if rest < 0 { seconds -= 1; rest += 1_000_000_000 }
        self.init(tv_sec: Int(seconds), tv_nsec: Int(rest))
    }
    /// A time from the kernel (utimensat) in nanoseconds. Times beyond what 64-bit
    /// nanoseconds hold (before 1677 or after 2262) are clamped to the nearest one
    /// rather than overflowing: ext4 clamps what it cannot store too.
    var nanos: Nanos {
        let (scaled, overflow) = Nanos(tv_sec).multipliedReportingOverflow(by: 1_000_000_000)
        if overflow { return tv_sec < 0 ? .min : .max }
        let (sum, overflow2) = scaled.addingReportingOverflow(Nanos(tv_nsec))
        return overflow2 ? (tv_nsec < 0 ? .min : .max) : sum
    }
}
