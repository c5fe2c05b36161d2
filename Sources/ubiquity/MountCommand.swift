import ArgumentParser
import Glibc
import UbiquityDaemon
import UbiquityStore
import UbiquitySync
import UbiquitySystem

struct MountCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "mount",
        abstract: "Mount a container at MOUNTPOINT.",
        discussion: """
        Without --foreground, returns once the mount is live and keeps serving it in the \
        background (log: <store>/daemon.log). Defaults need nothing else: the store and the \
        backing directory live under $XDG_DATA_HOME/ubiquity/<container>/ (~/.local/share/...). \
        --backing s3://BUCKET/PREFIX syncs through S3 instead (credentials from the AWS \
        variables and files).

        Stop it with `ubiquity unmount MOUNTPOINT`, which commits pending saves first. \
        Under systemd (Type=notify) it reports READY=1 once the mount is live.
        """)

    @Argument(help: ArgumentHelp("An empty directory to mount on (created, with its parents, if missing).",
                                 discussion: "Default: $UBIQUITY_MOUNTPOINT if set, else ~/Cloud for container 'default' and ~/Cloud-NAME for container NAME (the same place the systemd unit ubiquity@NAME uses)."))
    var mountpoint: String?

    @Option(help: "Container name: selects the default store and backing directories.")
    var container = "default"

    @Option(help: "Store directory (chunks and metadata). Default: $XDG_DATA_HOME/ubiquity/<container>/store")
    var store: String?

    @Option(help: ArgumentHelp("Where devices meet: a directory every device can open, or s3://BUCKET[/PREFIX].",
                               discussion: "Default: $UBIQUITY_BACKING if set, else $XDG_DATA_HOME/ubiquity/<container>/backing. For S3, credentials, region and endpoint come from the AWS variables and files (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_PROFILE with ~/.aws/credentials and ~/.aws/config, AWS_REGION, AWS_ENDPOINT_URL, AWS_CA_BUNDLE), never from the command line.",
                               valueName: "DIR|s3://BUCKET[/PREFIX]"))
    var backing: String?

    @Option(help: "This device's name, shown in version names. Default: the stored name, else the hostname.")
    var device: String?

    @Option(help: ArgumentHelp("A retention setting, KEY=VALUE, over the container's retention file (repeatable), e.g. --retention keep=everything or --retention keep-deleted-within=60d. See `ubiquity prune --help`.", valueName: "KEY=VALUE"))
    var retention: [String] = []

    @Option(name: .customLong("kv-limit"), help: ArgumentHelp("A key-value store limit, NAME=N (repeatable), over the container's <container>.kv-limits file: keys (default 1024), bytes in all (1048576), value bytes (1048576), key bytes (64). See `ubiquity kv --help`.", valueName: "NAME=N"))
    var kvLimits: [String] = []

    @Option(help: .hidden)
    var maintenanceEvery: String?

    @Option(help: ArgumentHelp("How many names of directories the mount keeps in memory, about 100 bytes each (default 262144). A directory is loaded at its first lookup; past the budget the least recently used go, and one with more than an eighth of the budget is looked up a name at a time.", valueName: "N"))
    var cachedNames: Int?

    @Option(help: "Seconds between sync cycles (local changes out, other devices' changes in). While this device or a peer changed something in the last 5 minutes a cycle runs every 0.5 s at most; when all is quiet the look at the backing store backs off to 40 s.")
    var poll = 1.0

    @Option(help: ArgumentHelp("How file contents come to this device: `all` (the default) downloads every file in the background once its record is in, `on-demand` only what is read. Files show at once either way. Also `download = ...` in ~/.config/ubiquity/<container>.conf.", valueName: "all|on-demand"))
    var download: String?

    @Option(help: ArgumentHelp("Seconds a read of content that is not on this device waits for the backing store before it fails with EIO (default 30).", valueName: "SECONDS"))
    var fetchTimeout: Double?

    @Option(help: ArgumentHelp("The most bytes of file contents kept on this device (e.g. 500M, 20G, none). Past it, the least recently opened files that are uploaded, unpinned and closed give back their local copies (they stay listed and are fetched again when read); space pressure does the same before it prunes history. Pinned files always stay. Also `cache-size = ...` in ~/.config/ubiquity/<container>.conf.", valueName: "SIZE"))
    var cacheSize: String?

    @Flag(help: "List .versions in the mount's root directory. Without it .versions is hidden from listings (so find, du, rsync and backups see only the live tree) but works when named: ls MOUNTPOINT/.versions/FILE/")
    var showVersions = false

    @Flag(help: "Stay in the foreground (for systemd and debugging); log to stderr.")
    var foreground = false

    @Option(name: .customShort("o"), help: "Mount options, comma-separated (e.g. allow_other, ro).")
    var options: String?

    @Option(help: .hidden)
    var readyFD: Int32?

    @Flag(help: ArgumentHelp("Make a new container encrypted: only on an empty backing store (its first use). Every object but FORMAT and keys/ is then sealed with AES-256-GCM under a random key that only the container's passphrases open. Mounting an encrypted container needs no flag, only its passphrase.",
                             discussion: "The passphrase comes from --password-file, --password-command, a systemd credential named ubiquity-passphrase, or a prompt on the terminal; never from the command line. `ubiquity key --help` adds and changes passphrases."))
    var encrypt = false

    @OptionGroup var password: PasswordOptions

    @Option(help: .hidden)
    var keyFD: Int32?

    func validate() throws {
        if let device, device.isEmpty || device.contains("/") { throw ValidationError("--device must be a non-empty name without '/'") }
        if !(poll >= 0.05 && poll <= 3600) { throw ValidationError("--poll must be between 0.05 and 3600 seconds") }
        if let cachedNames, !(cachedNames >= 1024 && cachedNames <= 1 << 30) {
            throw ValidationError("--cached-names must be between 1024 and 1073741824")
        }
        if let download, DownloadMode(rawValue: download) == nil { throw ValidationError("--download must be all or on-demand") }
        if let fetchTimeout, !(fetchTimeout >= 1 && fetchTimeout <= 3600) { throw ValidationError("--fetch-timeout must be between 1 and 3600 seconds") }
        if let cacheSize, cacheSize != "none", (RetentionPolicy.size(cacheSize) ?? 0) <= 0 {
            throw ValidationError("--cache-size must be a size such as 500M, 20G or 1T, or none")
        }
        if let backing, BackingChoice.isURL(backing), !backing.hasPrefix("s3://") {
            // Not a directory path (it would make a directory named "x:"): say what works.
            throw ValidationError("--backing \(backing): give a directory or s3://BUCKET[/PREFIX]")
        }
    }

    func run() throws {
        let mp = Paths.absolute(mountpoint ?? Paths.defaultMountpoint(container: container))
        if mountpoint == nil && Paths.env("UBIQUITY_MOUNTPOINT")?.isEmpty != false { try checkDefaultPlace(mp) }
        let data = Paths.dataDirectory(container: container)
        let storeDir = store.map(Paths.absolute) ?? data + "/store"
        let backingDir = Paths.backing(container: container, named: backing)
        var st = stat()
        clearDeadMount(mp)
        if stat(mp, &st) != 0 {
            try makeDirectoriesForCLI(mp)
        } else if st.st_mode & S_IFMT != S_IFDIR {
            throw CLIError("mount point \(mp) is not a directory")
        }
        if isMountpoint(mp) { throw CLIError("\(mp) is already mounted; `ubiquity unmount \(mp)` first") }
        // The passphrase is asked, and scrypt runs, here (where the terminal is); a
        // daemon started in the background gets the key through a pipe.
        let unlocked: ContainerUnlock.Unlocked?
        if let keyFD {
            unlocked = try ContainerUnlock.receive(fd: keyFD)
        } else {
            if !BackingChoice.isURL(backingDir) { try makeDirectoriesForCLI(backingDir) }
            unlocked = try exitingOnRefusal("mount") {
                try ContainerUnlock.forMount(try BackingChoice.open(backingDir, check: true), encrypt: encrypt, source: password.source)
            }
        }
        if foreground {
            try serve(mountpoint: mp, storeDir: storeDir, backingDir: backingDir, unlocked: unlocked)
        } else {
            var arguments = CommandLine.arguments
            var keyFD: Int32?
            if let unlocked {
                keyFD = try ContainerUnlock.handOff(unlocked)
                arguments += ["--key-fd", String(keyFD!)]
            }
            defer { if let keyFD { close(keyFD) } }
            try Daemon.spawnAndWait(arguments: arguments, logPath: daemonLogPath(store: storeDir), mountpoint: mp)
        }
    }

    private func serve(mountpoint mp: String, storeDir: String, backingDir: String, unlocked: ContainerUnlock.Unlocked?) throws {
        var configuration = DaemonConfiguration(mountpoint: mp, storeDirectory: storeDir, backing: backingDir)
        configuration.container = container
        configuration.deviceName = device
        configuration.retentionSettings = retention
        configuration.keyValueLimitSettings = kvLimits
        configuration.maintenanceEvery = maintenanceEvery
        configuration.pollSeconds = poll
        configuration.cachedNames = cachedNames ?? Store.defaultCachedNames
        configuration.showVersions = showVersions
        configuration.download = download
        configuration.fetchTimeout = fetchTimeout
        configuration.cacheSize = cacheSize
        configuration.mountOptions = (options ?? "").split(separator: ",").map(String.init)
        configuration.readyFD = readyFD
        configuration.unlocked = unlocked
        try Daemon.serve(configuration)
    }
}

/// The default place (~/Cloud, ~/Cloud-NAME) was not named by the user: mounting there
/// must not hide their files or another mount (an older layout mounted containers at
/// ~/Cloud/NAME). A dead ubiquity mount there is cleared first, as always.
func checkDefaultPlace(_ mp: String) throws {
    clearDeadMount(mp)
    if let below = mountEntries().first(where: { $0.mountpoint.hasPrefix(mp + "/") }) {
        throw CLIError("\(below.mountpoint) is mounted inside \(mp), the default place of this container: unmount it first, or name a mount point (`ubiquity mount DIR`)")
    }
    if isMountpoint(mp) { return } // already mounted: the caller says so
    if let names = try? directoryEntries(mp), !names.isEmpty {
        throw CLIError("\(mp), the default place of this container, is not empty (\(names.sorted().prefix(3).joined(separator: ", "))\(names.count > 3 ? ", ..." : "")): move those away, or name a mount point (`ubiquity mount DIR`)")
    }
}

/// A ubiquity daemon that died (crash, SIGKILL) can leave its mount behind answering
/// ENOTCONN; fusermount3's auto_unmount does not clean it for non-root users on libfuse
/// < 3.15 (libfuse issue #586). Such a mount is dead for sure, so clear it; live mounts and
/// other filesystems are never touched.
///
/// Dead is asked with statfs, which always reaches the daemon: stat of the root may be
/// answered from the kernel's attribute cache (5 minutes) long after the daemon died
/// (the systemd unit relies on this: it leaves dead mounts to `ubiquity mount`).
func clearDeadMount(_ mp: String) {
    guard mountEntries().last(where: { $0.mountpoint == mp })?.fstype == "fuse.ubiquity" else { return }
    var fs = statvfs()
    guard statvfs(mp, &fs) != 0 && errno == ENOTCONN else { return }
    if runProcess(["fusermount3", "-u", "-z", mp]) == 0 {
        log("ubiquity: cleared the dead mount a crashed daemon left at \(mp)")
    }
}
