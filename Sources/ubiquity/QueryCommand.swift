import ArgumentParser
import Glibc
import UbiquityDaemon
import UbiquityStore
import UbiquitySystem

/// `ubiquity query`: the container's live query (iCloud's NSMetadataQuery), answered by
/// the daemon from one consistent snapshot of its store, then from its change feed.
struct QueryCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "query",
        abstract: "List the container's files with their sync state; --watch: then report changes as they happen.",
        discussion: """
        The listing is one consistent snapshot, streamed as the daemon reads it (a \
        100,000-file container is never copied into memory): one line per file, \
        STATE  DOWNLOAD  SIZE  MODIFIED  PATH. States: uploaded, pending (saved here, not in \
        the backing directory yet), remote (the current version came from another device), \
        conflict (see `ubiquity conflicts`), local-only (a name that never syncs). \
        DOWNLOAD: current, partial or not-downloaded (files on demand). \
        Hidden files (a name starting with '.') only with --all.

        --watch then prints "-- gathered N" and one line per change as it happens, made \
        here or synced from another device: added, changed, removed, conflict, and \
        download (only the DOWNLOAD column changed: content arrived or was evicted). A watch \
        costs the daemon nothing while nothing changes. (inotify on the mount sees only \
        changes made through it: not what sync brings in. This does.)

        --json: one object per line (keys in sorted order): {"created":...,"downloaded":..., \
        "mtime":...,"path":...,"size":...,"state":...}, then {"count":N,"event":"gathered"}, \
        then events such as {...,"event":"added",...,"path":...,...}; {"event":"overflow"} \
        means events were skipped.

          ubiquity query                                 # every file
          ubiquity query --scope documents --name '*.tinypix'
          ubiquity query --watch --json | jq .
        """)

    @Option(name: .customLong("mount"), help: ArgumentHelp("The mount (or a path inside it). Default: the only ubiquity mount.", valueName: "dir"))
    var mount: String?

    @Option(help: ArgumentHelp("documents (under Documents/), data (the rest) or all.", valueName: "scope"))
    var scope: String = "all"

    @Option(help: ArgumentHelp("Only files whose name matches this shell pattern (e.g. '*.txt').", valueName: "glob"))
    var name: String?

    @Flag(help: "Include hidden files.")
    var all = false

    @Flag(help: "After the listing, report changes until interrupted.")
    var watch = false

    @Flag(help: "Print JSON, one object per line.")
    var json = false

    func validate() throws {
        if QueryFilter.Scope(rawValue: scope) == nil { throw ValidationError("--scope is documents, data or all") }
    }

    func run() throws {
        let (entry, _) = try selectMount(mount, command: "query")
        let request = ControlRequest.query(ControlQuery(scope: scope, name: name, hidden: all, watch: watch))
        let client = try connectToDaemon(mountpoint: entry.mountpoint, request: request)
        defer { client.close() }
        var failure: String?
        try client.lines { line, reply in
            if case .error(let message)? = reply { failure = message; return false }
            // --json: the daemon's lines as they are (JSONLines already).
            if json { emitLine(line); return true }
            emitLine(reply.flatMap { Self.describe($0, watching: watch) } ?? line)
            return true
        }
        if let failure { throw CLIError("query failed: \(failure)") }
    }

    /// A line for a person: "STATE  SIZE  MODIFIED  PATH", "-- gathered N", "added PATH";
    /// nil for a reply a query does not send (its line is shown as it is).
    static func describe(_ reply: ControlReply, watching: Bool) -> String? {
        func row(_ f: ControlFile) -> String { "\(f.state)\t\(f.downloaded)\t\(f.size)\t\(ISODate.format(millis: f.mtimeMillis))\t\(f.path)" }
        switch reply {
        case .gathered(let count): return "-- gathered \(count)" + (watching ? " (watching for changes; ^C ends)" : "")
        case .overflow: return "-- some changes were skipped (too many at once): run the query again"
        case .file(let file): return row(file)
        case .fileEvent(let kind, let path, let file): return "\(kind.rawValue)\t" + (file.map(row) ?? "\t\t\t\(path)")
        case .error, .watching, .keyValueChanged, .progress, .result, .finished: return nil
        }
    }
}
