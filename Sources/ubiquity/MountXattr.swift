import ArgumentParser
import Glibc
import UbiquityFUSE

// The CLI talks to a running daemon only through its mount: extended attributes on the
// mount point (`user.ubiquity.control` to command, `user.ubiquity.sync` to read status)
// and on files, plus the hidden `.conflicts/` tree. No socket, no access to the store, so
// whatever permission the mount grants is the only permission these commands need.

/// A failed system call, with its errno kept so callers can tell "no such attribute"
/// (ENODATA) or "daemon too old" (EPERM) from a real failure.
struct SystemCallError: Error, CustomStringConvertible {
    let code: Int32
    /// What failed, e.g. "opendir /home/u/Cloud/.conflicts"; may be empty.
    let context: String

    init(_ code: Int32, _ context: String = "") {
        self.code = code
        self.context = context
    }

    /// strerror(code), e.g. "Input/output error".
    var reason: String { String(cString: strerror(code)) }
    var description: String { context.isEmpty ? reason : "\(context): \(reason)" }
}

// MARK: - Extended attributes

/// The value of attribute `name` of `path`, as text. `noFollow` reads a symlink itself
/// (lgetxattr) rather than what it points to, which may be outside the mount.
func readXattr(_ path: String, _ name: String, noFollow: Bool = false) throws -> String {
    var capacity = 4096
    while true {
        var buffer = [UInt8](repeating: 0, count: capacity)
        let n = buffer.withUnsafeMutableBytes { raw -> Int in
            noFollow ? c_lgetxattr(path, name, raw.baseAddress, raw.count) : c_getxattr(path, name, raw.baseAddress, raw.count)
        }
        if n >= 0 { return String(decoding: buffer[0..<n], as: UTF8.self) }
        let code = errno
        if code == EINTR { continue }
        guard code == ERANGE else { throw SystemCallError(code, "getxattr \(name)") }
        // The value grew between calls: ask for its size and try again.
        let size = noFollow ? c_lgetxattr(path, name, nil, 0) : c_getxattr(path, name, nil, 0)
        guard size >= 0 else { throw SystemCallError(errno, "getxattr \(name)") }
        capacity = max(size, capacity * 2)
    }
}

/// Sets attribute `name` of `path`. On `user.ubiquity.control` this is the call that waits
/// for the daemon (a `sync` returns when the cycle is done), so it is not retried on EINTR:
/// the daemon's answer, whatever it is, is the result.
func writeXattr(_ path: String, _ name: String, _ value: String) throws {
    let bytes = Array(value.utf8)
    let result = bytes.withUnsafeBytes { raw -> Int32 in
        c_setxattr(path, name, raw.baseAddress, raw.count, 0)
    }
    guard result == 0 else { throw SystemCallError(errno, "setxattr \(name)") }
}

func listXattrs(_ path: String) throws -> [String] {
    let size = c_listxattr(path, nil, 0)
    guard size >= 0 else { throw CLIError("listxattr \(path): \(String(cString: strerror(errno)))") }
    var buffer = [CChar](repeating: 0, count: size + 1)
    let n = c_listxattr(path, &buffer, size)
    guard n >= 0 else { throw CLIError("listxattr \(path): \(String(cString: strerror(errno)))") }
    return buffer[0..<n].split(separator: 0).map { String(decoding: $0.map { UInt8(bitPattern: $0) }, as: UTF8.self) }
}

func getXattr(_ path: String, _ name: String) throws -> String {
    do { return try readXattr(path, name) } catch { throw CLIError("\(error)") }
}

// <sys/xattr.h> is not part of the Glibc module; the CFuse shim has it, but only the FUSE
// layer may import CFuse.
@_silgen_name("listxattr")
private func c_listxattr(_ path: UnsafePointer<CChar>, _ list: UnsafeMutablePointer<CChar>?, _ size: Int) -> Int
@_silgen_name("getxattr")
private func c_getxattr(_ path: UnsafePointer<CChar>, _ name: UnsafePointer<CChar>, _ value: UnsafeMutableRawPointer?, _ size: Int) -> Int
@_silgen_name("lgetxattr")
private func c_lgetxattr(_ path: UnsafePointer<CChar>, _ name: UnsafePointer<CChar>, _ value: UnsafeMutableRawPointer?, _ size: Int) -> Int
@_silgen_name("setxattr")
private func c_setxattr(_ path: UnsafePointer<CChar>, _ name: UnsafePointer<CChar>, _ value: UnsafeRawPointer?, _ size: Int, _ flags: Int32) -> Int32

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

/// Where the daemon serving `entry` explains failures: daemon.log next to its store when
/// started by `ubiquity mount`, the journal when started by systemd. The mount's source is
/// its store directory; the default store `<data>/<container>/store` names the container.
func daemonLogHint(_ entry: MountEntry) -> String {
    let store = entry.source
    guard store.hasPrefix("/"), let slash = store.lastIndex(of: "/") else {
        return "see the daemon log (daemon.log next to its store, or `journalctl --user -u 'ubiquity@*'`)"
    }
    let data = String(store[..<slash])
    let container = store.hasSuffix("/store") ? data.split(separator: "/").last.map(String.init) : nil
    return "see the daemon log (\(data)/daemon.log or `journalctl --user -u ubiquity@\(container ?? "NAME")`)"
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

/// The entries of directory `path` except `.` and `..`, unsorted.
func directoryEntries(_ path: String) throws -> [String] {
    guard let dir = opendir(path) else { throw SystemCallError(errno, path) }
    defer { closedir(dir) }
    var names: [String] = []
    while let e = readdir(dir) {
        let name = withUnsafeBytes(of: e.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
        if name != "." && name != ".." { names.append(name) }
    }
    return names
}

/// True when `path` is a directory itself (a symlink to one is not).
func isDirectory(_ path: String) -> Bool {
    var st = stat()
    return lstat(path, &st) == 0 && st.st_mode & S_IFMT == S_IFDIR
}
