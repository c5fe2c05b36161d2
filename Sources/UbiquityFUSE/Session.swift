import CFuse
import Dispatch
import Glibc
import UbiquityFS
import UbiquityStore
import UbiquitySystem

/// One FUSE mount of a `FileSystem`: mount, serve on libfuse's multi-threaded loop until
/// unmounted or signalled, then commit what is pending.
public final class FUSESession: @unchecked Sendable {
    public struct Options: Sendable {
        /// Extra `-o` options (allow_other, ro, ...), comma-separated.
        public var mountOptions: [String] = []
        public var maxThreads: UInt32 = 8
        /// Install SIGTERM/SIGINT/SIGHUP handlers that end the loop (daemons; not tests).
        public var handleSignals = true
        public var fsname = "ubiquity"
        public init() {}
    }

    public let mountpoint: String
    private let fs: FileSystem
    private let options: Options
    private var session: OpaquePointer?
    private let context: Unmanaged<MountContext>
    private var ops: fuse_lowlevel_ops
    /// Kernel cache invalidations run here, never on the thread that changed the tree: the
    /// kernel may need a lock held by the very request that caused the change (a
    /// `setfattr user.ubiquity.control` on the root holds the root's inode lock).
    private let notifications = DispatchQueue(label: "ubiquity.invalidate")
    private let serving = Locked(false)

    public init(fs: FileSystem, mountpoint: String, options: Options) {
        self.fs = fs
        self.mountpoint = mountpoint
        self.options = options
        let checks = Permissions.daemonChecks(mountOptions: options.mountOptions, kernelRelease: Self.kernelRelease())
        context = Unmanaged.passRetained(MountContext(fs: fs, checksPermissions: checks))
        ops = makeOperations()
    }

    deinit {
        if let session { fuse_session_destroy(session) }
        context.release()
    }

    /// Creates the session and mounts. On return the mount is live (requests queue until
    /// `run()` serves them).
    public func mount() throws(MountError) {
        if isMountpoint(mountpoint) {
            throw .failed("\(mountpoint) is already a mount point; unmount it first (`ubiquity unmount \(mountpoint)` or `fusermount3 -u \(mountpoint)`)")
        }
        var all = ["fsname=\(options.fsname)", "subtype=ubiquity"]
        if !context.takeUnretainedValue().checksPermissions, !options.mountOptions.contains("default_permissions") {
            all.append("default_permissions")
        }
        all += options.mountOptions
        let argv = ["ubiquity", "-o", all.joined(separator: ",")]
        var cargs = argv.map { strdup($0) }
        defer { cargs.forEach { free($0) } }
        cargs.append(nil)
        let created: OpaquePointer? = cargs.withUnsafeMutableBufferPointer { buf in
            var args = fuse_args(argc: Int32(argv.count), argv: buf.baseAddress, allocated: 0)
            let se = fuse_session_new(&args, &ops, MemoryLayout<fuse_lowlevel_ops>.size, context.toOpaque())
            fuse_opt_free_args(&args)
            return se
        }
        guard let created else { throw .failed("libfuse refused the mount options: \(all.joined(separator: ","))") }
        session = created
        if options.handleSignals {
            // libfuse installs its handlers only over SIG_DFL; a daemon started from a script
            // may inherit SIGINT ignored, and libfuse would then leave it so.
            signal(SIGINT, SIG_DFL); signal(SIGTERM, SIG_DFL); signal(SIGHUP, SIG_DFL)
            if fuse_set_signal_handlers(created) != 0 { throw .failed("cannot install signal handlers") }
        }
        if fuse_session_mount(created, mountpoint) != 0 {
            if options.handleSignals { fuse_remove_signal_handlers(created) }
            throw .failed("cannot mount on \(mountpoint): does it exist, is it an empty directory you own, and is /dev/fuse usable (package fuse3)?")
        }
        context.takeUnretainedValue().channel.store(fuse_session_fd(created), ordering: .releasing)
        guard KernelChannel.install(on: created) else {
            fuse_session_unmount(created)
            if options.handleSignals { fuse_remove_signal_handlers(created) }
            throw .failed("libfuse refused custom I/O on /dev/fuse (libfuse 3.14 or later is needed)")
        }
        raiseReadahead()
    }

    /// uname's release, such as "6.18.4-amd64".
    static func kernelRelease() -> String {
        var names = utsname()
        uname(&names)
        return withUnsafeBytes(of: &names.release) { String(decoding: $0.prefix(while: { $0 != 0 }), as: UTF8.self) }
    }

    /// The kernel reads ahead 128 KiB at a time on a FUSE mount, and offers no more in
    /// init whatever the filesystem asks: a sequential reader then waits for a request
    /// per 128 KiB. The mount's backing device info takes a larger window, from root only
    /// (anyone else keeps the default, silently). Found through mountinfo, not stat: a stat
    /// of the mountpoint would wait for this very daemon, which does not serve yet.
    private func raiseReadahead() {
        guard getuid() == 0, let entry = mountEntries().last(where: { $0.mountpoint == mountpoint }) else { return }
        let path = "/sys/class/bdi/\(entry.device)/read_ahead_kb"
        let fd = open(path, O_WRONLY | O_CLOEXEC)
        guard fd >= 0 else { return }
        defer { close(fd) }
        _ = "\(Self.readaheadKiB)\n".withCString { write(fd, $0, strlen($0)) }
    }

    /// Matches `max_readahead` in init: a FUSE request carries at most 1 MiB.
    static let readaheadKiB = 1024

    /// Serves requests until the filesystem is unmounted or a signal ends the loop, then
    /// unmounts (if still mounted) and commits everything pending. Returns the loop's status.
    @discardableResult
    public func run() -> Int32 {
        guard let session else { return -1 }
        // Each loop sleeps until its doorbell rings but maintenance, which looks every
        // 10 s (space taken by others, a prune that is due): an idle mount wakes for that
        // and the sync poll only (IntegrationTests/mount/t-idle.sh counts).
        let autosave = BackgroundLoop(every: 1, doorbell: fs.autosaveDue) { [fs] in fs.commitIdle() }
        let groupCommit = BackgroundLoop(every: 0.1, doorbell: fs.commitDue) { [fs] in !fs.groupCommit() } // again in 0.1 s while something waits
        // Its own loop: a long gc in the maintenance loop must not hold checkpoints back.
        let checkpoints = BackgroundLoop(every: 5, doorbell: fs.checkpointDue) { [fs] in
            fs.checkpointInBackground()
            return false
        }
        let maintenance = BackgroundLoop(every: 10) { [fs] in
            fs.relieveSpacePressure()
            fs.keepCacheLimit()
            fs.barrierIfNeeded()
            fs.compactIfMuchFree()
            fs.maintainIfDue()
            return true
        }
        let cfg = fuse_loop_cfg_create()
        fuse_loop_cfg_set_max_threads(cfg, options.maxThreads)
        fuse_loop_cfg_set_clone_fd(cfg, 0)
        serving.withLock { $0 = true }
        let status = fuse_session_loop_mt(session, cfg)
        serving.withLock { $0 = false }
        notifications.sync {}
        fuse_loop_cfg_destroy(cfg)
        autosave.stop()
        groupCommit.stop()
        maintenance.stop()
        checkpoints.stop()
        fuse_session_unmount(session)
        if options.handleSignals { fuse_remove_signal_handlers(session) }
        fs.drain()
        return status
    }

    /// Tells the kernel to drop what it cached of nodes sync changed (attributes, pages,
    /// names), so readers, even ones holding the file open, see the new version.
    ///
    /// Names and contents are told twice, the second time a second later: a reply sent
    /// just before sync changed them can reach the kernel's caches after the first notice,
    /// which finds nothing to drop. A lookup's (that the name is absent, or what was
    /// there): Linux keeps a lookup in flight out of its name cache until the reply is
    /// taken in. A read's: its pages of the old version enter the page cache after the
    /// notice, and an open keeps the cache (`keep_cache`), so the file would read old
    /// until the next change (t-sync-garbage.sh, under load).
    public func invalidate(_ changes: TreeChanges) {
        notifications.async { [self] in
            guard let session, serving.withLock({ $0 }) else { return }
            // Another device took a directory's search bit away (`Permissions`).
            if changes.searchNarrowed, context.takeUnretainedValue().checksPermissions {
                KernelChannel.expireNames(context.takeUnretainedValue())
            }
            for ino in changes.inodes { _ = fuse_lowlevel_notify_inval_inode(session, ino.rawValue, 0, 0) }
            // Content that arrived or went changes st_blocks only: the attributes (offset -1).
            for ino in changes.downloads.union(changes.attributes) where !changes.inodes.contains(ino) {
                _ = fuse_lowlevel_notify_inval_inode(session, ino.rawValue, -1, 0)
            }
            invalidate(changes.entries)
        }
        guard !changes.entries.isEmpty || !changes.inodes.isEmpty else { return }
        notifications.asyncAfter(deadline: .now() + Self.secondNotice) { [self] in
            guard let session, serving.withLock({ $0 }) else { return }
            for ino in changes.inodes { _ = fuse_lowlevel_notify_inval_inode(session, ino.rawValue, 0, 0) }
            invalidate(changes.entries)
        }
    }

    static let secondNotice = DispatchTimeInterval.seconds(1)

    /// Runs on `notifications`.
    private func invalidate(_ entries: [EntryName]) {
        guard let session, serving.withLock({ $0 }) else { return }
        for entry in entries {
            _ = withCName(entry.name) { fuse_lowlevel_notify_inval_entry(session, entry.parent.rawValue, $0, $1) }
        }
    }
}

public enum MountError: Error, CustomStringConvertible {
    case failed(String)
    public var description: String { if case .failed(let m) = self { return m }; return "" }
}
