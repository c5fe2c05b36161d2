import Glibc
import UbiquityFS
import UbiquityFUSE
import UbiquityStore
import UbiquitySync
import UbiquitySystem

/// Tells whoever started us that the mount is live: the background parent (through a
/// pipe) and systemd (READY=1 on $NOTIFY_SOCKET, a datagram: no libsystemd needed).
public struct Readiness {
    public let pipeFD: Int32?

    public init(pipeFD: Int32?) {
        self.pipeFD = pipeFD
        // Helpers we start (fusermount3 for auto_unmount) must not inherit it.
        if let pipeFD { _ = fcntl(pipeFD, F_SETFD, FD_CLOEXEC) }
    }

    public func succeeded() {
        send(pipe: "OK\n")
        notifySystemd("READY=1\nSTATUS=Mounted")
    }

    public func failed(_ message: String) {
        send(pipe: "ERR " + message + "\n")
    }

    private func send(pipe message: String) {
        guard let fd = pipeFD else { return }
        _ = message.withCString { write(fd, $0, strlen($0)) }
        close(fd)
    }
}

public func notifySystemd(_ message: String) {
    guard var path = Paths.env("NOTIFY_SOCKET") else { return }
    if path.hasPrefix("@") { path = "\0" + path.dropFirst() } // abstract socket
    let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
    guard fd >= 0 else { return }
    defer { close(fd) }
    var addr = sockaddr_un()
    addr.sun_family = sa_family_t(AF_UNIX)
    let bytes = Array(path.utf8)
    guard bytes.count < MemoryLayout.size(ofValue: addr.sun_path) else { return }
    withUnsafeMutableBytes(of: &addr.sun_path) { raw in
        for (i, b) in bytes.enumerated() { raw[i] = b }
    }
    let length = socklen_t(MemoryLayout<sa_family_t>.size + bytes.count + (path.hasPrefix("\0") ? 0 : 1))
    _ = message.withCString { msg in
        withUnsafePointer(to: &addr) { ptr in
            ptr.withMemoryRebound(to: sockaddr.self, capacity: 1) { sa in
                sendto(fd, msg, strlen(msg), 0, sa, length)
            }
        }
    }
}

/// What a mount daemon serves, and how (the options of `ubiquity mount`, resolved).
public struct DaemonConfiguration: Sendable {
    /// Absolute paths.
    public var mountpoint: String
    public var storeDirectory: String
    /// An absolute directory or a URL (BackingChoice).
    public var backing: String
    /// Selects the retention and key-value limit files (Paths).
    public var container = "default"
    /// This device's name; nil: the stored one, else the hostname.
    public var deviceName: String?
    /// `KEY=VALUE` over the container's retention file.
    public var retentionSettings: [String] = []
    /// `NAME=N` over the container's key-value limits file.
    public var keyValueLimitSettings: [String] = []
    /// A duration (RetentionPolicy.duration) between maintenance runs; nil: the default.
    public var maintenanceEvery: String?
    public var pollSeconds = 1.0
    /// Names of directories kept in memory (`Store.init(cachedNames:)`).
    public var cachedNames = Store.defaultCachedNames
    public var showVersions = false
    /// `--download`, `--fetch-timeout` and `--cache-size` (nil: the container's
    /// configuration, else the default).
    public var download: String?
    public var fetchTimeout: Double?
    public var cacheSize: String?
    /// FUSE mount options (`-o`); auto_unmount is added unless `noauto_unmount` is given.
    public var mountOptions: [String] = []
    /// Where to report "OK" or "ERR message" once mounted or failed (`--ready-fd`).
    public var readyFD: Int32?
    /// An encrypted container's key (ContainerUnlock); nil for a plain container.
    public var unlocked: ContainerUnlock.Unlocked?
    /// The environment's settings for tests (UBQ_TEST_FOSSIL_AGE), read by `serve`.
    public var environment: @Sendable (String) -> String? = { Paths.env($0) }

    public init(mountpoint: String, storeDirectory: String, backing: String) {
        self.mountpoint = mountpoint
        self.storeDirectory = storeDirectory
        self.backing = backing
    }
}

extension Daemon {
    /// Mounts and serves until unmounted: the store, the backing store, the filesystem,
    /// the FUSE session, sync and the control socket, in that order; then stops them. The
    /// readiness pipe and systemd learn when the mount is live, or why it failed.
    public static func serve(_ configuration: DaemonConfiguration) throws {
        // Two malloc arenas, not glibc's eight per core: the chunks a read passes through
        // are allocated by read-ahead jobs and freed by reply threads, and each arena keeps
        // what is freed into it, which a long read would hold (docs/BENCHMARKS.md).
        limitMallocArenas(2)
        let c = configuration
        let mp = c.mountpoint, storeDir = c.storeDirectory, backingDir = c.backing
        let ready = Readiness(pipeFD: c.readyFD)
        do {
            let store = try Store(directory: storeDir, deviceName: c.deviceName, cachedNames: c.cachedNames,
                                  chunker: c.unlocked?.chunker ?? .standard)
            if !BackingChoice.isURL(backingDir) { try makeDirectoriesForCLI(backingDir) }
            let clearStore = try BackingChoice.open(backingDir, check: true)
            try checkEncryption(store: store, backing: backingDir, unlocked: c.unlocked)
            let backingStore = c.unlocked.map { $0.wrap(clearStore) } ?? clearStore
            // `ubiquity fsck --repair` fetches damaged chunks from here by default.
            try store.setSetting("backing", backingDir)
            let downloads = try Paths.downloadSettings(container: c.container, mode: c.download, fetchTimeout: c.fetchTimeout,
                                                       cacheSize: c.cacheSize)
            // `ubiquity status` shows it beside the contents here.
            try store.setSetting("cache_size", downloads.cacheSize.map { String($0) } ?? "none")
            var fsOptions = FileSystem.Options()
            fsOptions.cacheSize = downloads.cacheSize
            fsOptions.showVersions = c.showVersions
            fsOptions.retention = try Paths.retentionPolicy(container: c.container, settings: c.retentionSettings)
            fsOptions.kvLimits = try Paths.keyValueLimits(container: c.container, settings: c.keyValueLimitSettings)
            if let every = c.maintenanceEvery {
                guard let interval = RetentionPolicy.duration(every) else { throw DaemonError.setting("--maintenance-every \(every): not a duration") }
                fsOptions.maintenanceInterval = interval
            }
            // For tests only (t-space.sh): gc's grace under space pressure in seconds
            // instead of a minute, so the space the pressure freed comes back sooner.
            if let text = c.environment("UBQ_TEST_PRESSURE_GRACE"), let seconds = Int64(text), (0...3600).contains(seconds) {
                fsOptions.pressureGrace = seconds * 1_000_000_000
                log("ubiquity: UBQ_TEST_PRESSURE_GRACE: gc's grace under space pressure is \(seconds) s (a test setting)")
            }
            // The space fallocate promised before this mount (or before a crash) is set
            // aside again before the first write can draw on it.
            try store.reservation.start(levels: try store.reservedHoleLevels())
            // From here on the store is used only through the filesystem's `SharedStore`.
            let fs = FileSystem(store: store, options: fsOptions)
            fs.relieveSpacePressure()
            var sessionOptions = FUSESession.Options()
            sessionOptions.fsname = storeDir.contains(",") ? "ubiquity" : storeDir
            sessionOptions.mountOptions = c.mountOptions
            // auto_unmount: if this process dies, fusermount3 removes the mount (no ENOTCONN corpse).
            if !sessionOptions.mountOptions.contains("noauto_unmount") {
                sessionOptions.mountOptions.append("auto_unmount")
            }
            sessionOptions.mountOptions.removeAll { $0 == "noauto_unmount" }
            let session = FUSESession(fs: fs, mountpoint: mp, options: sessionOptions)
            var syncOptions = SyncEngine.Options()
            syncOptions.pollSeconds = c.pollSeconds
            syncOptions.download = downloads.mode
            syncOptions.fetchTimeout = downloads.fetchTimeout
            syncOptions.cacheSize = downloads.cacheSize
            // For tests only (t-backing-gc.sh): a fossil's wait in seconds instead of 7 days;
            // its age counts from the rename's ctime, which a test cannot set back.
            if let text = c.environment("UBQ_TEST_FOSSIL_AGE"), let seconds = Int64(text), seconds >= 0 {
                syncOptions.fossilAge = seconds
                log("ubiquity: UBQ_TEST_FOSSIL_AGE: fossils are deleted after \(seconds) s (a test setting)")
            }
            let sync = SyncEngine(store: fs.store, backing: backingStore, options: syncOptions)
            fs.attach(sync: sync)
            fs.onTreeChange { session.invalidate($0) }
            try session.mount()
            let control = ControlServer(fs: fs, storeDirectory: storeDir)
            do {
                try control.start()
                fs.announce(controlSocket: control.path)
            } catch {
                log("ubiquity: no control socket (`ubiquity kv watch` and `ubiquity query` will not work): \(error)")
            }
            log("ubiquity: mounted \(mp) (store \(storeDir), backing \(backingDir), device \(fs.store.deviceName) \(fs.store.deviceID))")
            ready.succeeded()
            sync.start()
            fs.startMovingChunkFiles()
            let status = session.run()
            sync.stop()
            control.stop()
            log("ubiquity: unmounted \(mp) (loop status \(status)); pending saves committed")
        } catch {
            ready.failed("\(error)")
            throw DaemonError.from(error)
        }
    }
}

/// A device that synced with an encrypted container remembers it (the setting
/// `encrypted_backing`, not a secret): should that container's FORMAT later say it is
/// not encrypted (replaced by whoever holds the backing store), the mount stops instead
/// of writing plaintext there.
func checkEncryption(store: Store, backing: String, unlocked: ContainerUnlock.Unlocked?) throws {
    if let unlocked {
        try store.setSetting("encrypted_backing", backing)
        try store.setSetting("encryption", "aes-256-gcm, key \(unlocked.keyID)")
    } else if try store.setting("encrypted_backing") == backing {
        throw DaemonError.encryption("\(backing) was an encrypted container when this device last synced with it, and now says it is not: nothing is mounted (if you replaced it with a plain container on purpose, use a new store or a new backing path)")
    } else {
        try store.setSetting("encryption", "none")
    }
}

/// Where a background daemon logs: inside its store, so every store has its own log and
/// `ubiquity status` finds it from the mount's source (the store directory).
public func daemonLogPath(store: String) -> String { store + "/daemon.log" }

/// Makes `path` and its missing parents (mode 0755).
public func makeDirectoriesForCLI(_ path: String) throws {
    var prefix = ""
    for c in path.split(separator: "/") {
        prefix += "/" + c
        if mkdir(prefix, 0o755) != 0 && errno != EEXIST {
            throw DaemonError.system("cannot create \(prefix)", errno: errno)
        }
    }
}

/// Background mode without fork (forking a process that has threads is unsafe): start
/// this same binary again with --foreground in a new session, its output in a log file,
/// and wait for it to report over a pipe that the mount is live.
public enum Daemon {
    public static func spawnAndWait(arguments: [String], logPath: String, mountpoint: String) throws {
        var fds: [Int32] = [0, 0]
        guard pipe(&fds) == 0 else { throw DaemonError.system("pipe", errno: errno) }
        let (readFD, writeFD) = (fds[0], fds[1])
        _ = fcntl(readFD, F_SETFD, FD_CLOEXEC)
        try makeDirectoriesForCLI(String(logPath[..<logPath.lastIndex(of: "/")!]))
        let logFD = open(logPath, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o644)
        guard logFD >= 0 else { throw DaemonError.system("cannot open log \(logPath)", errno: errno) }
        let nullFD = open("/dev/null", O_RDONLY | O_CLOEXEC)

        let exe = (try? readLink("/proc/self/exe")) ?? arguments[0]
        let args = [exe] + Array(arguments.dropFirst()) + ["--foreground", "--ready-fd", String(writeFD)]
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        posix_spawn_file_actions_adddup2(&actions, nullFD, 0)
        posix_spawn_file_actions_adddup2(&actions, logFD, 1)
        posix_spawn_file_actions_adddup2(&actions, logFD, 2)
        var attr = posix_spawnattr_t()
        posix_spawnattr_init(&attr)
        let setsid: Int32 = 0x80 // POSIX_SPAWN_SETSID (glibc): survive the terminal closing
        posix_spawnattr_setflags(&attr, Int16(setsid))
        var cargs = args.map { strdup($0) } + [nil]
        var pid: pid_t = 0
        let rc = posix_spawn(&pid, exe, &actions, &attr, &cargs, environ)
        cargs.forEach { free($0) }
        posix_spawn_file_actions_destroy(&actions)
        posix_spawnattr_destroy(&attr)
        close(writeFD); close(logFD); close(nullFD)
        guard rc == 0 else { throw DaemonError.system("cannot start the mount daemon", errno: rc) }

        var reply: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = read(readFD, &buffer, buffer.count)
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { break }
            reply += buffer[0..<n]
            if reply.last == UInt8(ascii: "\n") { break } // one line: "OK" or "ERR message"
        }
        close(readFD)
        let text = String(decoding: reply, as: UTF8.self).trimmingTrailingNewlines()
        if text == "OK" {
            print("Mounted \(mountpoint) (daemon pid \(pid), log \(logPath))")
            return
        }
        var status: Int32 = 0
        waitpid(pid, &status, 0)
        if text.hasPrefix("ERR ") { throw DaemonError.daemon(String(text.dropFirst(4))) }
        throw DaemonError.daemon("the mount daemon exited before mounting; see \(logPath)")
    }
}

public func readLink(_ path: String) throws -> String {
    var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
    let n = readlink(path, &buffer, buffer.count - 1)
    guard n > 0 else { throw DaemonError.system("readlink \(path)", errno: errno) }
    return String(decoding: buffer[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
}

extension String {
    public func trimmingTrailingNewlines() -> String {
        var s = self
        while s.hasSuffix("\n") { s.removeLast() }
        return s
    }
}
