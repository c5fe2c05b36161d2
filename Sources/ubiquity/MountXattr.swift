import ArgumentParser
import Glibc
import UbiquityDaemon
import UbiquitySystem

// The CLI talks to a running daemon through its mount: extended attributes on the mount
// point (`user.ubiquity.control` to command, `user.ubiquity.sync` to read status) and on
// files, plus the hidden `.conflicts/` and `.kv/` trees. Only what a file cannot carry (a
// streamed snapshot, events as they happen: `query`, `kv watch`) goes through the control
// socket the mount root's `user.ubiquity.socket` names (ControlClient), which lives in the
// store directory: its owner's alone.

// MARK: - Extended attributes

/// The value of attribute `name` of `path`, as text. `noFollow` reads a symlink itself
/// (lgetxattr) rather than what it points to, which may be outside the mount.
func readXattr(_ path: String, _ name: String, noFollow: Bool = false) throws(SystemError) -> String {
    String(decoding: try UbiquitySystem.getXattr(path, name, noFollow: noFollow), as: UTF8.self)
}

func writeXattr(_ path: String, _ name: String, _ value: String) throws(SystemError) {
    try setXattr(path, name, Array(value.utf8))
}

/// As `readXattr`, failures as a message for the user.
func getXattr(_ path: String, _ name: String) throws -> String {
    do { return try readXattr(path, name) } catch { throw CLIError("\(error)") }
}

// MARK: - The daemon's sync status

/// The daemon's sync status, `user.ubiquity.sync` on the mount point: `key=value` lines
/// (state, pending, last-sync, conflicts, error, backing, device, device-id, and whatever
/// a newer daemon adds). Kept in the daemon's order so unknown keys print as they came.
struct SyncStatus {
    static let attribute = "user.ubiquity.sync"

    let lines: [String]

    init(text: String) {
        lines = text.split(separator: "\n").map(String.init)
    }

    static func read(mountpoint: String) throws -> SyncStatus {
        SyncStatus(text: try readXattr(mountpoint, attribute))
    }

    /// Each line as (key, value); a line without `=` is all key, with an empty value.
    var fields: [(key: String, value: String)] {
        lines.map { line -> (key: String, value: String) in
            guard let eq = line.firstIndex(of: "=") else { return (line, "") }
            return (String(line[..<eq]), String(line[line.index(after: eq)...]))
        }
    }

    subscript(key: String) -> String? {
        fields.first { $0.key == key }?.value
    }

    /// "0 pending, 1 conflict": the two numbers a user acts on.
    var summary: String {
        let pending = self["pending"] ?? "?"
        let conflicts = self["conflicts"] ?? "?"
        let conflictWord = conflicts == "1" ? "conflict" : "conflicts"
        return "\(pending) pending, \(conflicts) \(conflictWord)"
    }
}

// MARK: - Finding the mount

/// Ubiquity mounts in this mount namespace, each mount point once (the topmost mount
/// when several are stacked on one point).
func ubiquityMounts() -> [MountEntry] {
    var seen = Set<String>()
    var result: [MountEntry] = []
    for entry in mountEntries().reversed() where entry.fstype == "fuse.ubiquity" {
        if seen.insert(entry.mountpoint).inserted { result.append(entry) }
    }
    return result.reversed()
}

/// The mount a command acts on. With `path`: the mount containing it (its mount point or
/// anything inside), and `path` relative to the mount's root. Without: the only ubiquity
/// mount; none or several is an error that says how to go on.
func selectMount(_ path: String?, command: String) throws -> (entry: MountEntry, relative: String) {
    let mounts = ubiquityMounts()
    if let path {
        let abs = Paths.absolute(path)
        if let found = Paths.mount(containing: abs) { return found }
        if mounts.isEmpty { throw fail(command, "\(abs) is not inside a ubiquity mount, and none is mounted; start one with `ubiquity mount ~/Cloud`") }
        throw fail(command, "\(abs) is not inside a ubiquity mount. Mounted:\n" + mounts.map { "  \($0.mountpoint)" }.joined(separator: "\n"))
    }
    switch mounts.count {
    case 0:
        throw fail(command, "no ubiquity mount found; start one with `ubiquity mount ~/Cloud`")
    case 1:
        return (mounts[0], "")
    default:
        throw fail(command, "\(mounts.count) ubiquity mounts; name one, e.g. `ubiquity \(command) \(mounts[0].mountpoint)`. Mounted:\n"
            + mounts.map { "  \($0.mountpoint)" }.joined(separator: "\n"))
    }
}

/// The ubiquity mount whose mount point is the longest prefix of the absolute `path`, and
/// `path` relative to its root. Unlike `Paths.mount(containing:)`, `path` is taken as it
/// is (no realpath), so a final symlink or a name that does not exist stays itself.
func ubiquityMount(containingAbsolute path: String) -> (entry: MountEntry, relative: String)? {
    let best = ubiquityMounts()
        .filter { path == $0.mountpoint || path.hasPrefix($0.mountpoint == "/" ? "/" : $0.mountpoint + "/") }
        .max { $0.mountpoint.count < $1.mountpoint.count }
    guard let best else { return nil }
    let rel = String(path.dropFirst(best.mountpoint.count)).drop { $0 == "/" }
    return (best, String(rel))
}

/// `path` made absolute with its directory resolved (realpath), its last component kept as
/// given: a symlink stays the link, and a name that is gone can still be named.
func absolutePathKeepingName(_ path: String) -> String {
    var p = path
    while p.count > 1 && p.hasSuffix("/") { p.removeLast() }
    let dir: String
    let base: String
    if let slash = p.lastIndex(of: "/") {
        dir = slash == p.startIndex ? "/" : String(p[..<slash])
        base = String(p[p.index(after: slash)...])
    } else {
        dir = "."
        base = p
    }
    if base.isEmpty || base == "." || base == ".." || base == "~" { return Paths.absolute(p) }
    let resolved = Paths.absolute(dir)
    return resolved == "/" ? "/" + base : resolved + "/" + base
}

/// Where the daemon serving `entry` explains failures: daemon.log in its store when
/// started by `ubiquity mount`, the journal when started by systemd. The mount's source is
/// its store directory; the default store `<data>/<container>/store` names the container.
func daemonLogHint(_ entry: MountEntry) -> String {
    let store = entry.source
    guard store.hasPrefix("/") else {
        return "see the daemon log (daemon.log in its store, or `journalctl --user -u 'ubiquity@*'`)"
    }
    let container = store.hasSuffix("/store") ? store.split(separator: "/").dropLast().last.map(String.init) : nil
    return "see the daemon log (\(daemonLogPath(store: store)) or `journalctl --user -u ubiquity@\(container ?? "NAME")`)"
}

// MARK: - Output

/// Prints "ubiquity COMMAND: message" on stderr and returns the exit status to throw (1).
/// Used instead of throwing `CLIError` where the message must name the subcommand.
func fail(_ command: String, _ message: String) -> ExitCode {
    let line = "ubiquity \(command): \(message)\n"
    _ = line.withCString { write(STDERR_FILENO, $0, strlen($0)) }
    return ExitCode.failure
}

/// "1 conflict version", "2 conflict versions".
func counted(_ n: Int, _ singular: String) -> String {
    "\(n) \(singular)\(n == 1 ? "" : "s")"
}

/// True when `path` is a directory itself (a symlink to one is not).
func isDirectory(_ path: String) -> Bool {
    var st = stat()
    return lstat(path, &st) == 0 && st.st_mode & S_IFMT == S_IFDIR
}
