import ArgumentParser
import Glibc
import UbiquityDaemon
import UbiquitySystem

struct ConflictsCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "conflicts",
        abstract: "List conflicted files (edited on two devices before syncing).",
        discussion: """
        When two devices change the same file before they sync, nothing is merged and \
        nothing is lost: the version saved last stays current, and each other one appears \
        as a conflict version under MOUNTPOINT/.conflicts/<path>/, named like the versions \
        under .versions/ (2026-11-22T13.45.01.123Z@desktop.txt: time, device, extension). \
        Read or compare them with any tool, then settle each file with `ubiquity resolve`:

          cd ~/Cloud
          ubiquity conflicts
          diff notes.txt .conflicts/notes.txt/2026-11-22T13.45.01.123Z@desktop.txt
          ubiquity resolve notes.txt --take 2026-11-22T13.45.01.123Z@desktop.txt

        With a directory inside a mount, lists only the conflicts below it. With --paths, \
        prints just the conflict versions' full paths, one per line (nothing when there \
        are none), for scripts.
        """)

    @Argument(help: "A mount point, or a directory or file inside one. Default: the only ubiquity mount.")
    var path: String?

    @Flag(help: "Print only the full path of each conflict version, one per line.")
    var paths = false

    func run() throws {
        let (entry, relative) = try selectMount(path, command: "conflicts")
        let root = entry.mountpoint
        var start = relative
        if start == ".conflicts" {
            start = ""
        } else if start.hasPrefix(".conflicts/") {
            start = String(start.dropFirst(".conflicts/".count))
        } else if start == ".versions" || start.hasPrefix(".versions/") {
            throw fail("conflicts", "give a path in the mount, not under .versions/ (e.g. `ubiquity conflicts \(root)`)")
        }
        let files: [ConflictedFile]
        do { files = try conflictedFiles(root: root, under: start) } catch { throw fail("conflicts", "\(error); \(daemonLogHint(entry))") }

        if paths {
            for file in files {
                for name in file.versions { print(root + "/.conflicts/" + file.path + "/" + name) }
            }
            return
        }
        let scope = start.isEmpty ? root : root + "/" + start
        if files.isEmpty { print("no conflicts in \(scope)"); return }
        for file in files {
            let current = root + "/" + file.path
            print(current)
            print("  current:  \(describeCurrent(current))")
            for name in file.versions {
                print("  conflict: \(name)\(sizeNote(root + "/.conflicts/" + file.path + "/" + name))")
            }
        }
        let versionCount = files.reduce(0) { $0 + $1.versions.count }
        print("""
            \(counted(files.count, "file")) with \(counted(versionCount, "conflict version")). \
            Take one: `ubiquity resolve PATH --take NAME`; keep the current: `ubiquity resolve PATH --keep-current`.
            """)
    }

    /// "<version id> by <device>" for the file shown at the conflicted path, or what is
    /// there instead (a path can be a directory on one device and a file on another).
    private func describeCurrent(_ file: String) -> String {
        var st = stat()
        guard lstat(file, &st) == 0 else {
            return errno == ENOENT ? "none (no file at this path now)" : "? (\(errnoText(errno)))"
        }
        if st.st_mode & S_IFMT == S_IFDIR { return "a directory (these versions are files that lost the name to it)" }
        let version = (try? readXattr(file, "user.ubiquity.version", noFollow: true)) ?? "?"
        let device = (try? readXattr(file, "user.ubiquity.device", noFollow: true)) ?? "?"
        return "\(version) by \(device)"
    }

    private func sizeNote(_ path: String) -> String {
        var st = stat()
        return stat(path, &st) == 0 ? "  (\(st.st_size) bytes)" : ""
    }
}

/// A path with unresolved conflict versions.
struct ConflictedFile {
    /// Relative to the mount's root.
    let path: String
    /// Names under `.conflicts/<path>/`, sorted (that is, by time).
    let versions: [String]
}

/// Conflicted files below `.conflicts/<start>` ("" for all), sorted by path. A directory
/// there that holds version files stands for the file at the same path in the mount; its
/// subdirectories hold the conflicts of paths below it (a path can be a file on one device
/// and a directory on another, so one directory can have both). No `.conflicts/` (a daemon
/// from before sync) or no such `<start>` means no conflicts.
func conflictedFiles(root: String, under start: String) throws -> [ConflictedFile] {
    var result: [ConflictedFile] = []
    var pending = [start]
    while let rel = pending.popLast() {
        let dir = root + "/.conflicts" + (rel.isEmpty ? "" : "/" + rel)
        let names: [String]
        do throws(SystemError) {
            names = try directoryEntries(dir)
        } catch {
            if error.code == ENOENT || error.code == ENOTDIR { continue }
            throw CLIError("\(error)")
        }
        var versions: [String] = []
        for name in names {
            if isDirectory(dir + "/" + name) {
                pending.append(rel.isEmpty ? name : rel + "/" + name)
            } else {
                versions.append(name)
            }
        }
        if !rel.isEmpty && !versions.isEmpty { result.append(ConflictedFile(path: rel, versions: versions.sorted())) }
    }
    return result.sorted { $0.path < $1.path }
}

/// The conflict version names of one path: the non-directory entries of
/// `<root>/.conflicts/<path>/`, sorted; empty when it has none.
func conflictVersionNames(in directory: String) throws -> [String] {
    do throws(SystemError) {
        return try directoryEntries(directory).filter { !isDirectory(directory + "/" + $0) }.sorted()
    } catch {
        if error.code == ENOENT || error.code == ENOTDIR { return [] }
        throw CLIError("\(error)")
    }
}
