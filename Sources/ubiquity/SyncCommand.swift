import ArgumentParser
import Glibc
import UbiquityDaemon
import UbiquitySystem

struct SyncCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sync",
        abstract: "Sync a mount now, and wait until the cycle is done.",
        discussion: """
        Runs one full cycle: uploads this device's pending versions to the backing \
        directory, then applies what other devices wrote there. Returns when the cycle is \
        done and prints what is left, e.g. "synced /home/u/Cloud: 0 pending, 1 conflict". \
        The daemon also syncs on its own; use this before shutting a laptop, or to see \
        another device's changes at once.

        If the backing store cannot be reached (an unmounted disk or network share, a \
        bucket that fails or does not answer), \
        it fails with exit status 1 and the daemon's log says why; pending versions stay \
        queued.

          ubiquity sync                  # the only mounted container
          ubiquity sync ~/Cloud
        """)

    @Argument(help: "The mount point, or any path inside it. Default: the only ubiquity mount.")
    var mountpoint: String?

    func run() throws {
        let (entry, _) = try selectMount(mountpoint, command: "sync")
        try sendControl("sync", to: entry, command: "sync")
        let mp = entry.mountpoint
        guard var status = try? SyncStatus.read(mountpoint: mp) else {
            print("synced \(mp)")
            return
        }
        // The daemon runs the cycle in the background; wait for one that covers this
        // request (every request received before a cycle starts is covered by it). A
        // daemon from before that reports no counts: its cycle was done on return.
        if let asked = status["requests"].flatMap({ Int($0) }) {
            while (status["requests-done"].flatMap { Int($0) } ?? asked) < asked {
                usleep(50_000)
                status = try SyncStatus.read(mountpoint: mp)
            }
            if let error = status["error"], !error.isEmpty {
                let kind = status["error-kind"].map { " (\($0))" } ?? ""
                let advice = status["error-advice"].map { "; \($0)" } ?? ""
                throw CLIError("sync of \(mp) failed\(kind): \(error)\(advice); \(daemonLogHint(entry))")
            }
        }
        var line = "synced \(mp): \(status.summary)"
        if let conflicts = status["conflicts"], let n = Int(conflicts), n > 0 {
            line += " (see `ubiquity conflicts \(mp)`)"
        }
        print(line)
    }
}

struct PauseCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "pause",
        abstract: "Stop syncing a mount (Airplane Mode) until `ubiquity resume`.",
        discussion: """
        The mount keeps working: every save is still a version, kept locally and counted \
        as pending. Nothing is uploaded or downloaded until `ubiquity resume`, which sends \
        and fetches everything that waited. `ubiquity status` shows the state.

          ubiquity pause ~/Cloud
          ubiquity resume ~/Cloud
        """)

    @Argument(help: "The mount point, or any path inside it. Default: the only ubiquity mount.")
    var mountpoint: String?

    func run() throws {
        let (entry, _) = try selectMount(mountpoint, command: "pause")
        try sendControl("pause", to: entry, command: "pause")
        let mp = entry.mountpoint
        let pending = pendingNote(mp)
        print("paused syncing of \(mp)\(pending); saves are kept until `ubiquity resume \(mp)`")
    }
}

struct ResumeCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "resume",
        abstract: "Start syncing a paused mount again.",
        discussion: """
        Undoes `ubiquity pause`: the daemon syncs on its own again, starting with what \
        waited. It returns at once; `ubiquity sync` waits until a cycle is done.

          ubiquity resume ~/Cloud
          ubiquity sync ~/Cloud          # optional: wait until everything is up
        """)

    @Argument(help: "The mount point, or any path inside it. Default: the only ubiquity mount.")
    var mountpoint: String?

    func run() throws {
        let (entry, _) = try selectMount(mountpoint, command: "resume")
        try sendControl("resume", to: entry, command: "resume")
        let mp = entry.mountpoint
        let pending = pendingNote(mp)
        print("resumed syncing of \(mp)\(pending)")
    }
}

/// " (3 pending)" from the daemon's sync status, or "" when it does not say.
private func pendingNote(_ mountpoint: String) -> String {
    guard let status = try? SyncStatus.read(mountpoint: mountpoint), let pending = status["pending"] else { return "" }
    return " (\(pending) pending)"
}

/// Sends one control word (`sync`, `pause`, `resume`) to the daemon serving `entry`: a
/// setxattr of `user.ubiquity.control` on the mount point, answered when the daemon has
/// done it. On failure prints why and where the daemon logs, and exits 1.
func sendControl(_ word: String, to entry: MountEntry, command: String) throws {
    let mp = entry.mountpoint
    do throws(SystemError) {
        try writeXattr(mp, "user.ubiquity.control", word)
    } catch {
        let code = error.code
        var message = "\(mp): \(errnoText(code)); \(daemonLogHint(entry))"
        if code == EBUSY {
            // prune and gc run one at a time each, in the background.
            throw fail(command, "\(mp): a \(command) is running already; wait for it (`ubiquity status`, or the attribute user.ubiquity.\(command) on \(mp))")
        }
        if code == EAGAIN {
            // The daemon refuses to sync while paused (Airplane Mode means no traffic).
            throw fail(command, "\(mp) is paused; `ubiquity resume \(mp)` first (pending saves are kept)")
        }
        if code == ENOTCONN {
            // A crashed daemon leaves a dead mount; `ubiquity mount` clears it (clearDeadMount).
            message += ". The daemon is gone: `ubiquity mount \(mp)` mounts it again"
        } else if code == EPERM || code == EOPNOTSUPP {
            // A daemon from before sync refuses writes to user.ubiquity.* with EPERM.
            message += ". If the daemon predates sync, remount: `ubiquity unmount \(mp)`, then mount again"
        }
        throw fail(command, message)
    }
}
