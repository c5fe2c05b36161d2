import ArgumentParser
import Glibc
import UbiquityDaemon
import UbiquitySystem

struct VersionsCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "versions",
        abstract: "List the versions of a file in a mount, oldest first.",
        discussion: "The names are those under MOUNTPOINT/.versions/<path>/; pass one to `ubiquity restore`.")

    @Argument(help: "A file inside a mount (it may have been deleted).")
    var path: String

    func run() throws {
        let dir = try versionsDirectory(of: path)
        let names = try listDirectory(dir).sorted()
        if names.isEmpty { print("No versions of \(path)."); return }
        for name in names {
            var st = stat()
            let size = stat(dir + "/" + name, &st) == 0 ? "\(st.st_size)" : "?"
            print("\(name)\t\(size) bytes")
        }
    }
}

struct RestoreCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "restore",
        abstract: "Make an old version of a file current again (as a new version).",
        discussion: "Same as `cp MOUNTPOINT/.versions/<path>/VERSION PATH`. Nothing is lost: the version it replaces stays in the history.")

    @Argument(help: "A file inside a mount.")
    var path: String

    @Argument(help: "A version name from `ubiquity versions PATH`.")
    var version: String

    func run() throws {
        guard !version.contains("/") else { throw ValidationError("VERSION is a name from `ubiquity versions`, without '/'") }
        let source = try versionsDirectory(of: path) + "/" + version
        guard access(source, R_OK) == 0 else { throw CLIError("no version \(version) of \(path); see `ubiquity versions \(path)`") }
        try copyFile(from: source, to: Paths.absolute(path))
        print("Restored \(path) from \(version)")
    }
}

func versionsDirectory(of path: String) throws -> String {
    guard let (entry, relative) = Paths.mount(containing: path) else {
        throw CLIError("\(Paths.absolute(path)) is not inside a ubiquity mount")
    }
    guard !relative.isEmpty else { throw CLIError("give a file inside the mount, not its root") }
    return entry.mountpoint + "/.versions/" + relative
}

func listDirectory(_ path: String) throws -> [String] {
    do throws(SystemError) { return try directoryEntries(path) } catch {
        throw CLIError(error.code == ENOENT ? "no history at \(path)" : "\(path): \(errnoText(error.code))")
    }
}

/// Copies through the mount with one open/write/close, so the filesystem commits exactly
/// one new version.
func copyFile(from source: String, to target: String) throws {
    let input = open(source, O_RDONLY | O_CLOEXEC)
    guard input >= 0 else { throw CLIError("open \(source): \(errnoText(errno))") }
    defer { close(input) }
    let output = open(target, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
    guard output >= 0 else { throw CLIError("open \(target): \(errnoText(errno))") }
    var buffer = [UInt8](repeating: 0, count: 1 << 20)
    while true {
        let n = read(input, &buffer, buffer.count)
        if n < 0 { if errno == EINTR { continue }; close(output); throw CLIError("read \(source): \(errnoText(errno))") }
        if n == 0 { break }
        var done = 0
        while done < n {
            let w = buffer.withUnsafeBytes { write(output, $0.baseAddress! + done, n - done) }
            if w < 0 { if errno == EINTR { continue }; close(output); throw CLIError("write \(target): \(errnoText(errno))") }
            done += w
        }
    }
    if close(output) != 0 { throw CLIError("saving \(target) failed: \(errnoText(errno))") }
}
