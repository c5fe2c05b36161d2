import CFuse
import Glibc
import Synchronization
import UbiquitySystem

/// libfuse's reads from and writes to /dev/fuse, through its custom-I/O hook, for one
/// capability the libfuse of Debian 12 (3.14) cannot negotiate: FUSE_HANDLE_KILLPRIV_V2
/// (protocol 7.33; libfuse learned it in 3.17).
///
/// Without it the kernel asks for `security.capability` (a GETXATTR round trip) before
/// every write(2), to learn whether a capability must be cleared: a 4 KiB write costs two
/// requests, not one (strace of fio's random writes: 4,362 WRITE, 4,362 GETXATTR). With
/// it the kernel marks the superblock SB_NOSEC, stops asking, and instead flags each
/// write, O_TRUNC open and truncation whose caller lacks CAP_FSETID; the filesystem then
/// clears set-user-ID, and set-group-ID when group-executable (`FileSystem.dropSetID`).
/// No capability ever needs clearing: only `user.*` attributes can be set here.
///
/// Layouts are the kernel's (`/usr/include/linux/fuse.h`), read with bounds checked.
enum KernelChannel {
    /// Reads and writes through the hooks below from now on; the session must be mounted
    /// (its descriptor is the one read). False if libfuse refused.
    static func install(on session: OpaquePointer) -> Bool {
        var io = fuse_custom_io()
        io.read = { fd, buf, size, userdata in
            let n = Glibc.read(fd, buf, size)
            if n > 0, let buf, let userdata {
                KernelChannel.noteRequest(UnsafeRawBufferPointer(start: buf, count: n), KernelChannel.mount(userdata))
            }
            return n
        }
        io.writev = { fd, iov, count, userdata in
            if let iov, count >= 2, let userdata { KernelChannel.amendInitReply(iov, KernelChannel.mount(userdata)) }
            return Glibc.writev(fd, iov, count)
        }
        return fuse_session_custom_io(session, &io, fuse_session_fd(session)) == 0
    }

    /// Whether the request this thread is serving asks that set-id bits go (a write or an
    /// O_TRUNC open by a caller without CAP_FSETID). libfuse parses a request on the
    /// thread that read it, so the read hook leaves the flag here for the operation.
    static var requestDropsSetID: Bool { pthread_getspecific(dropsSetIDKey) != nil }

    // fuse_in_header: len u32, opcode u32, unique u64, nodeid u64, uid, gid, pid u32, ... (40 bytes).
    private static let inHeaderSize = 40
    private static let opcodeOffset = 4, uniqueOffset = 8
    private static let opcodeOpen: UInt32 = 14, opcodeWrite: UInt32 = 16, opcodeInit: UInt32 = 26
    /// fuse_init_in.flags and fuse_init_out.flags: after major, minor, max_readahead.
    private static let initFlagsOffset = 12
    private static let handleKillPrivV2: UInt32 = 1 << 28
    /// fuse_write_in.write_flags (after fh, offset, size) and its FUSE_WRITE_KILL_SUIDGID.
    private static let writeFlagsOffset = 20, writeKillSetID: UInt32 = 1 << 2
    /// fuse_open_in.open_flags (after flags) and its FUSE_OPEN_KILL_SUIDGID.
    private static let openFlagsOffset = 4, openKillSetID: UInt32 = 1 << 0
    // fuse_out_header: len u32, error i32, unique u64 (16 bytes).
    private static let outHeaderSize = 16, errorOffset = 4

    private static let dropsSetIDKey: pthread_key_t = {
        var key = pthread_key_t()
        precondition(pthread_key_create(&key, nil) == 0, "no thread-specific key left")
        return key
    }()

    private static func mount(_ userdata: UnsafeMutableRawPointer) -> MountContext {
        Unmanaged<MountContext>.fromOpaque(userdata).takeUnretainedValue()
    }

    private static func field(_ bytes: UnsafeRawBufferPointer, _ offset: Int) -> UInt32? {
        offset + 4 <= bytes.count ? bytes.loadUnaligned(fromByteOffset: offset, as: UInt32.self) : nil
    }

    private static func noteRequest(_ request: UnsafeRawBufferPointer, _ mount: MountContext) {
        guard let opcode = field(request, opcodeOffset) else { return }
        var drops = false
        switch opcode {
        case opcodeWrite: drops = (field(request, inHeaderSize + writeFlagsOffset) ?? 0) & writeKillSetID != 0
        case opcodeOpen: drops = (field(request, inHeaderSize + openFlagsOffset) ?? 0) & openKillSetID != 0
        case opcodeInit:
            // Offered by the kernel (5.11 and later): answered yes in the reply.
            if (field(request, inHeaderSize + initFlagsOffset) ?? 0) & handleKillPrivV2 != 0 { // so the header is whole
                mount.initUnique.store(request.loadUnaligned(fromByteOffset: uniqueOffset, as: UInt64.self), ordering: .releasing)
            }
        default: break
        }
        if drops != requestDropsSetID { pthread_setspecific(dropsSetIDKey, drops ? UnsafeRawPointer(bitPattern: 1) : nil) }
    }

    /// Expires every name the kernel keeps for the mount, found or known absent: each is
    /// looked up again at its next use (FUSE_NOTIFY_INC_EPOCH: protocol 7.44, Linux 6.16;
    /// libfuse 3.14 has no call for it). It takes no lock in the kernel, so a request may
    /// send it before its reply.
    static func expireNames(_ mount: MountContext) {
        let fd = mount.channel.load(ordering: .acquiring)
        guard fd >= 0 else { return }
        // fuse_out_header alone: its length, the notice's code where a reply has its
        // error, and unique 0 (a notice, not a reply).
        var notice = [UInt8](repeating: 0, count: outHeaderSize)
        notice.withUnsafeMutableBytes {
            $0.storeBytes(of: UInt32(outHeaderSize).littleEndian, toByteOffset: 0, as: UInt32.self)
            $0.storeBytes(of: notifyIncEpoch.littleEndian, toByteOffset: errorOffset, as: Int32.self)
        }
        let written = notice.withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) }
        if written != outHeaderSize, !refusedEpoch.exchange(true, ordering: .relaxed) {
            log("ubiquity: the kernel refused to expire its cached names (FUSE_NOTIFY_INC_EPOCH: \(errnoText(errno))): after a directory loses search permission, names under it the kernel cached still resolve for up to \(Int(cacheTimeout)) s")
        }
    }

    private static let notifyIncEpoch: Int32 = 8
    private static let refusedEpoch = Atomic<Bool>(false)

    /// Adds FUSE_HANDLE_KILLPRIV_V2 to a successful reply to the INIT that offered it.
    private static func amendInitReply(_ iov: UnsafeMutablePointer<iovec>, _ mount: MountContext) {
        let wanted = mount.initUnique.load(ordering: .acquiring)
        guard wanted != 0, iov[0].iov_len >= outHeaderSize, let header = iov[0].iov_base,
              header.loadUnaligned(fromByteOffset: uniqueOffset, as: UInt64.self) == wanted else { return }
        mount.initUnique.store(0, ordering: .releasing)
        guard header.loadUnaligned(fromByteOffset: errorOffset, as: Int32.self) == 0,
              iov[1].iov_len >= initFlagsOffset + 4, let reply = iov[1].iov_base else { return }
        let flags = reply.loadUnaligned(fromByteOffset: initFlagsOffset, as: UInt32.self)
        reply.storeBytes(of: flags | handleKillPrivV2, toByteOffset: initFlagsOffset, as: UInt32.self)
    }
}
