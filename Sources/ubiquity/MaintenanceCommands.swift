import ArgumentParser
import Glibc
import UbiquityDaemon
import UbiquityFS
import UbiquityStore
import UbiquitySystem

/// `ubiquity prune` and `ubiquity gc`: on a mounted container they ask its daemon (the
/// control attribute, as `sync` does) and print its report; with `--store` they open an
/// unmounted store themselves.
struct PruneCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "prune",
        abstract: "Drop old versions that the retention policy does not keep.",
        discussion: """
        The policy (README, "Versions and retention"): every version for 24 hours, then one per \
        hour for 7 days, one per day for 90 days, one per week after that; a deleted file's \
        history for at least 30 days. Current versions, unresolved conflict versions and \
        versions not yet uploaded are never pruned. Set it per container in \
        $XDG_CONFIG_HOME/ubiquity/<container>.retention (~/.config/...), or `keep = \
        everything` there to keep every version. The daemon prunes by itself once a day, \
        then runs gc; pruned versions vanish from .versions/ at once, their space is freed \
        by gc (`ubiquity gc`).

          ubiquity prune --dry-run                  # what would go, and how much
          ubiquity prune ~/Cloud/photos             # only histories at or below it
          ubiquity prune --keep-within 7d           # keep everything of the last 7 days, nothing older
          ubiquity prune --store DIR                # a store that is not mounted
        """)

    @Argument(help: "A mount point, or a path inside one: prune only the histories shown there or below. Default: the only mounted container, all of it.")
    var path: String?

    @Flag(help: "Print what would be pruned; change nothing.")
    var dryRun = false

    @Option(help: "For this run: keep every version younger than this (e.g. 12h, 7d, 2w) and none older, instead of the staggered windows.")
    var keepWithin: String?

    @Option(help: "For this run: how long a deleted file's history is kept (e.g. 1s, 7d) instead of the policy's.")
    var keepDeletedWithin: String?

    @Option(help: "An unmounted store directory to prune directly.")
    var store: String?

    @Option(help: "Container name (with --store: whose retention file to read).")
    var container = "default"

    func validate() throws {
        for value in [keepWithin, keepDeletedWithin].compactMap({ $0 }) where RetentionPolicy.duration(value) == nil {
            throw ValidationError("`\(value)` is not a duration (a whole number and s, m, h, d or w: 30s, 12h, 7d, 2w)")
        }
    }

    func run() throws {
        if let store {
            let fs = try openUnmounted(store: store, container: container)
            defer { fs.drain() }
            var policy = fs.options.retention
            policy.apply(keepWithin: keepWithin.flatMap(RetentionPolicy.duration),
                         keepDeletedWithin: keepDeletedWithin.flatMap(RetentionPolicy.duration))
            let report: FileSystem.PruneReport
            do { report = try fs.prune(policy: policy, now: nowNanos(), under: path ?? "", dryRun: dryRun) } catch {
                throw CLIError("prune: \(errnoText(error.code))")
            }
            print(report.text(dryRun: dryRun, limit: .max), terminator: "")
            if !dryRun && !report.versions.isEmpty { print("run `ubiquity gc --store \(store)` to free their space") }
            return
        }
        let (entry, relative) = try selectMount(path, command: "prune")
        var words = ["prune"]
        if dryRun { words.append("dry-run") }
        if let keepWithin { words.append("keep-within=" + keepWithin) }
        if let keepDeletedWithin { words.append("keep-deleted-within=" + keepDeletedWithin) }
        if !relative.isEmpty { words.append("path=" + relative) } // last: the path may hold spaces
        try sendControl(words.joined(separator: " "), to: entry, command: "prune")
        print(try waitForMaintenance(entry.mountpoint, FileSystem.pruneAttribute, command: "prune", progress: false), terminator: "")
        if !dryRun { print("the daemon's gc frees their space within a day; `ubiquity gc \(entry.mountpoint)` does it now") }
    }
}

struct GcCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "gc",
        abstract: "Delete the chunks no version needs any more, and report the space freed.",
        discussion: """
        Safe while the container is in use: a chunk is deleted only when no version names \
        it and nothing wrote or reused it during the grace period (default 1h, at least 1s), so a save \
        that reuses an old chunk never loses it. The daemon runs gc after its daily prune.

        On a mount that syncs, gc then collects the backing store (directory or S3): this \
        device writes a checkpoint of its live records once a quarter of the last one are \
        pruned (or its log grew by a quarter), its segments a checkpoint covers go after a \
        day, and packs no record names get a fossil marker and are deleted a week later \
        (docs/FORMAT.md). With --store only the store is collected.

          ubiquity gc                    # the only mounted container
          ubiquity gc --store DIR        # a store that is not mounted
        """)

    @Argument(help: "The mount point, or any path inside it. Default: the only ubiquity mount.")
    var mountpoint: String?

    @Option(help: "Keep unreferenced chunks written or used more recently than this (e.g. 10m, 1h).")
    var grace: String?

    @Option(help: "An unmounted store directory to collect directly.")
    var store: String?

    @Option(help: "Container name (with --store).")
    var container = "default"

    func validate() throws {
        if let grace, RetentionPolicy.duration(grace) == nil {
            throw ValidationError("`\(grace)` is not a duration (a whole number and s, m, h, d or w: 30s, 10m, 1h)")
        }
    }

    func run() throws {
        let terminal = isatty(STDERR_FILENO) != 0
        if let store {
            let fs = try openUnmounted(store: store, container: container)
            defer { fs.drain() }
            let report: FileSystem.GcReport
            do {
                report = try fs.collectGarbage(grace: grace.flatMap(RetentionPolicy.duration) ?? FileSystem.gcGrace,
                                               policy: fs.options.retention) { phase, done, total in
                    if terminal { progressLine("gc: \(phase) \(done)/\(total)") }
                }
            } catch {
                throw CLIError("gc: \(errnoText(error.code))")
            }
            if terminal { progressLine("") }
            print(report.summary)
            return
        }
        let (entry, _) = try selectMount(mountpoint, command: "gc")
        let mp = entry.mountpoint
        try sendControl("gc" + (grace.map { " grace=" + $0 } ?? ""), to: entry, command: "gc")
        print(try waitForMaintenance(mp, FileSystem.gcAttribute, command: "gc", progress: terminal), terminator: "")
    }
}

/// The report of a prune or gc the daemon runs in the background (the control write
/// returns at once): polls `attribute` until it no longer says `<command>: running`,
/// showing the progress on a terminal. A failed run is an error.
func waitForMaintenance(_ mountpoint: String, _ attribute: String, command: String, progress: Bool) throws -> String {
    while true {
        let text = try getXattr(mountpoint, attribute)
        if text.hasPrefix("\(command): running") {
            if progress { progressLine(text.trimmingTrailingNewlines()) }
            usleep(200_000)
            continue
        }
        if progress { progressLine("") }
        if text.hasPrefix("\(command): failed") { throw CLIError(text.trimmingTrailingNewlines()) }
        return text
    }
}

/// A store no daemon uses, with the container's retention policy: for `--store`.
func openUnmounted(store: String, container: String) throws -> FileSystem {
    let dir = Paths.absolute(store)
    do {
        let s = try Store(directory: dir)
        var options = FileSystem.Options()
        options.retention = try Paths.retentionPolicy(container: container)
        return FileSystem(store: s, options: options)
    } catch let error as StoreError {
        if case .locked = error { throw CLIError("\(error); on a mounted container run it without --store") }
        throw CLIError("\(error)")
    }
}

/// Rewrites the current terminal line on stderr ("" clears it).
func progressLine(_ text: String) {
    let line = "\r\u{1B}[K" + text
    _ = line.withCString { write(STDERR_FILENO, $0, strlen($0)) }
}
