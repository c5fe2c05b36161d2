import ArgumentParser
import Glibc
import UbiquityDaemon
import UbiquitySystem

/// `ubiquity download`, `evict`, `pin`, `unpin` (files on demand): one files request per
/// path to the daemon of the mount that holds it (ControlServer), with progress on a
/// terminal and a line for each file that did not go.
struct DownloadCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "download",
        abstract: "Make files' contents local (recursive); returns when they are here.",
        discussion: """
        Apple's startDownloadingUbiquitousItem. Each PATH is a file or a directory in a \
        mount (everything below it). Progress goes to standard error on a terminal; a file \
        that could not be fetched is named with the reason, and the exit status is 1.

          ubiquity download ~/Cloud/Photos
        """)

    @Argument(help: ArgumentHelp("Files or directories inside a ubiquity mount.", valueName: "path"))
    var paths: [String]

    func run() throws { try runFilesRequest(.download, paths, verb: "downloading") }
}

struct EvictCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "evict",
        abstract: "Drop the local copies of files whose current version is uploaded (recursive).",
        discussion: """
        Apple's evictUbiquitousItem. The files stay listed with their sizes; a read fetches \
        them again, and the background download (--download all) leaves them alone until \
        then. Refused, with the reason, for a file open for writing or with unsaved \
        changes, one whose current version is not uploaded yet, a local-only file and a \
        pinned one; before it deletes anything it checks that the backing store holds the \
        packs. Small chunks (at most 1 KiB) stay: they travel inside records.

          ubiquity evict ~/Cloud/Videos/2019
        """)

    @Argument(help: ArgumentHelp("Files or directories inside a ubiquity mount.", valueName: "path"))
    var paths: [String]

    func run() throws { try runFilesRequest(.evict, paths, verb: "evicting") }
}

struct PinCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "pin",
        abstract: "Always keep files on this device (recursive): downloads them now, and their new versions as they come.",
        discussion: "A pinned file is downloaded in either --download mode and never evicted (`ubiquity unpin` undoes it).")

    @Argument(help: ArgumentHelp("Files or directories inside a ubiquity mount.", valueName: "path"))
    var paths: [String]

    func run() throws { try runFilesRequest(.pin, paths, verb: "pinning") }
}

struct UnpinCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "unpin",
        abstract: "Undo `ubiquity pin` (recursive): the files are kept as the mount's --download mode says.")

    @Argument(help: ArgumentHelp("Files or directories inside a ubiquity mount.", valueName: "path"))
    var paths: [String]

    func run() throws { try runFilesRequest(.unpin, paths, verb: "unpinning") }
}

/// Sends `action` for each path and reports; exit status 1 when any file did not go.
func runFilesRequest(_ action: ControlFilesAction, _ paths: [String], verb: String) throws {
    let terminal = isatty(STDERR_FILENO) != 0
    var problems = 0
    for path in paths {
        let (entry, relative) = try selectMount(path, command: action.rawValue)
        let client = try connectToDaemon(mountpoint: entry.mountpoint, request: .files(action, path: relative))
        defer { client.close() }
        var failure: String?
        var finished = false
        try client.lines { _, reply in
            guard let reply else { return true }
            switch reply {
            case .error(let message): failure = message; return false
            case .progress(let files, let of, let bytes, let ofBytes):
                if terminal {
                    let amount = ofBytes > 0 ? "\(byteText(bytes)) of \(byteText(ofBytes))" : byteText(bytes)
                    let text = "\r\(verb): \(files)/\(of) files, \(amount)   "
                    _ = text.withCString { write(STDERR_FILENO, $0, strlen($0)) }
                }
            case .result(let file, let result, let bytes, let detail):
                let shown = entry.mountpoint + (file.isEmpty ? "" : "/" + file)
                if result == "done" {
                    emitLine("evicted \(shown) (\(byteText(bytes)) freed)")
                } else {
                    if terminal { _ = "\r".withCString { write(STDERR_FILENO, $0, 1) } }
                    log("ubiquity \(action.rawValue): \(shown): \(result): \(detail)")
                }
            case .finished(let files, let bytes, let count):
                problems += count
                finished = true
                if terminal { _ = "\n".withCString { write(STDERR_FILENO, $0, 1) } }
                let what = action == .evict ? "\(byteText(bytes)) freed" : action == .unpin ? "unpinned" : "\(byteText(bytes)) fetched"
                emitLine("\(entry.mountpoint + (relative.isEmpty ? "" : "/" + relative)): \(files) file(s), \(what)" + (count > 0 ? ", \(count) did not go" : ""))
                return false
            default: break
            }
            return true
        }
        if let failure { throw CLIError("\(action.rawValue) \(path): \(failure)") }
        if !finished { throw CLIError("\(action.rawValue) \(path): the daemon ended the request before it finished (see its log)") }
    }
    if problems > 0 { throw ExitCode.failure }
}
