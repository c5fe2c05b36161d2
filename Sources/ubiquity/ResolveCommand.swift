import ArgumentParser
import Glibc
import UbiquitySystem

struct ResolveCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "resolve",
        abstract: "Settle a file's conflict: keep the current version, or take another.",
        discussion: """
        --keep-current discards every conflict version of PATH, the same as removing the \
        files in MOUNTPOINT/.conflicts/<path>/. --take NAME makes that conflict version \
        the current one, the same as `mv MOUNTPOINT/.conflicts/<path>/NAME PATH`; any \
        other conflict versions stay until you resolve them too. The resolution syncs to \
        the other devices like any change. Names come from `ubiquity conflicts`.

          cd ~/Cloud
          ubiquity conflicts
          ubiquity resolve notes.txt --take 2026-11-22T13.45.01.123Z@desktop.txt
          ubiquity resolve notes.txt --keep-current
        """)

    @Argument(help: "The conflicted file, inside a mount (absolute or relative).")
    var path: String

    @Flag(help: "Keep the current version of PATH and discard all its conflict versions.")
    var keepCurrent = false

    @Option(help: ArgumentHelp("Make this conflict version of PATH the current one.", valueName: "VERSION-NAME"))
    var take: String?

    func validate() throws {
        if keepCurrent && take != nil {
            throw ValidationError("give either --keep-current or --take VERSION-NAME, not both")
        }
        if !keepCurrent && take == nil {
            throw ValidationError("say how to resolve: --keep-current (discard the conflict versions) or --take VERSION-NAME (make one current); `ubiquity conflicts` lists the names")
        }
        if let take, take.isEmpty { throw ValidationError("--take needs a version name, e.g. 2026-11-22T13.45.01.123Z@desktop.txt") }
    }

    func run() throws {
        let abs = absolutePathKeepingName(path)
        guard let (entry, rel) = ubiquityMount(containingAbsolute: abs) else {
            throw fail("resolve", "\(abs) is not inside a ubiquity mount")
        }
        let root = entry.mountpoint
        guard !rel.isEmpty else { throw fail("resolve", "give a file inside \(root), not the mount point itself") }
        if rel == ".conflicts" || rel.hasPrefix(".conflicts/") {
            throw fail("resolve", conflictPathAdvice(root: root, rel: rel))
        }
        if rel == ".versions" || rel.hasPrefix(".versions/") {
            throw fail("resolve", "give the file's own path in the mount, not a path under .versions/ (see `ubiquity conflicts \(root)`)")
        }
        let file = root + "/" + rel
        let directory = root + "/.conflicts/" + rel
        let names: [String]
        do { names = try conflictVersionNames(in: directory) } catch { throw fail("resolve", "\(error); \(daemonLogHint(entry))") }

        if let take {
            try takeVersion(take, names: names, file: file, directory: directory, entry: entry)
        } else {
            try discardAll(names, file: file, directory: directory, entry: entry)
        }
    }

    /// --take: rename the conflict version onto the file, which makes it current.
    private func takeVersion(_ given: String, names: [String], file: String, directory: String, entry: MountEntry) throws {
        let name = try versionName(given, directory: directory)
        guard names.contains(name) else {
            if names.isEmpty { throw fail("resolve", "\(file) has no conflict versions; `ubiquity conflicts` lists the files that have") }
            throw fail("resolve", "\(file) has no conflict version \(name). Its conflict versions:\n"
                + names.map { "  \($0)" }.joined(separator: "\n"))
        }
        let source = directory + "/" + name
        if rename(source, file) != 0 {
            let code = errno
            var message = "cannot take \(name) as \(file): \(errnoText(code))"
            if code == EISDIR || code == ENOTEMPTY || code == ENOTDIR {
                message += ". \(file) is a directory now; copy the version out instead, e.g. `cp '\(source)' '\(file).conflict'`"
            } else {
                message += "; \(daemonLogHint(entry))"
            }
            throw fail("resolve", message)
        }
        print("took \(name) as the current version of \(file); \(remaining(file: file, directory: directory)) left")
    }

    /// --keep-current: remove every conflict version (each `unlink` discards one).
    private func discardAll(_ names: [String], file: String, directory: String, entry: MountEntry) throws {
        if names.isEmpty {
            print("\(file) has no conflict versions; nothing to do")
            return
        }
        var failures: [String] = []
        for name in names {
            if unlink(directory + "/" + name) != 0 {
                failures.append("  \(name): \(errnoText(errno))")
            }
        }
        let discarded = names.count - failures.count
        let left = remaining(file: file, directory: directory)
        guard failures.isEmpty else {
            throw fail("resolve", "discarded \(discarded) of \(names.count) conflict versions of \(file); \(left) left. Failed:\n"
                + failures.joined(separator: "\n") + "\n\(daemonLogHint(entry))")
        }
        print("kept the current version of \(file), discarded \(counted(discarded, "conflict version")); \(left) left")
    }

    /// The version name `--take` means: a bare name, or the full path of a conflict
    /// version (as `ubiquity conflicts --paths` prints, or a shell completes) of this file.
    private func versionName(_ given: String, directory: String) throws -> String {
        guard given.contains("/") else { return given }
        let abs = absolutePathKeepingName(given)
        if let slash = abs.lastIndex(of: "/"), String(abs[..<slash]) == directory {
            return String(abs[abs.index(after: slash)...])
        }
        throw fail("resolve", "--take wants a version name such as 2026-11-22T13.45.01.123Z@desktop.txt, or a path in \(directory)/; see `ubiquity conflicts`")
    }

    /// The conflict versions still unresolved, as the daemon counts them
    /// (`user.ubiquity.conflicts`), else as the directory shows them.
    private func remaining(file: String, directory: String) -> String {
        if let text = try? readXattr(file, "user.ubiquity.conflicts", noFollow: true),
           let n = Int(String(text.filter { !$0.isWhitespace })) {
            return counted(n, "conflict version")
        }
        if let names = try? conflictVersionNames(in: directory) { return counted(names.count, "conflict version") }
        return "? conflict versions"
    }

    /// Advice when PATH is a conflict version itself: the command that takes it.
    private func conflictPathAdvice(root: String, rel: String) -> String {
        let inner = String(rel.dropFirst(".conflicts".count).drop { $0 == "/" })
        guard let slash = inner.lastIndex(of: "/"), !isDirectory(root + "/" + rel) else {
            return "give the conflicted file's own path, not a directory under .conflicts/ (see `ubiquity conflicts \(root)`)"
        }
        let file = root + "/" + String(inner[..<slash])
        let name = String(inner[inner.index(after: slash)...])
        return "give the conflicted file's own path: `ubiquity resolve '\(file)' --take '\(name)'` or `ubiquity resolve '\(file)' --keep-current`"
    }
}
