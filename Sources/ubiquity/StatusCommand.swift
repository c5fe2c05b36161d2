import ArgumentParser
import Glibc
import UbiquitySystem
import UbiquityStore

struct StatusCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "status",
        abstract: "Show mounted containers and their sync state, or the status of one file.",
        discussion: """
        Without PATH: each mounted container, its store and daemon, and the daemon's \
        sync state (syncing, paused or offline; pending uploads; last sync; conflicts; \
        last error). With a PATH inside a mount: its user.ubiquity.* attributes \
        (version, versions, conflicts, uploaded, ...).

          ubiquity status
          ubiquity status ~/Cloud/notes.txt
        """)

    @Argument(help: "A file inside a mount (optional).")
    var path: String?

    func run() throws {
        if let path {
            let abs = Paths.absolute(path)
            guard Paths.mount(containing: abs) != nil else { throw CLIError("\(abs) is not inside a ubiquity mount") }
            let names = try UbiquitySystem.listXattrs(abs).filter { $0.hasPrefix("user.ubiquity.") }
            print(abs)
            for name in names where name != "user.ubiquity.control" {
                let key = name.dropFirst("user.ubiquity.".count)
                let value = (try? getXattr(abs, name)) ?? "?"
                if value.contains("\n") {
                    // Multi-line values (the sync status on a mount point): one line each.
                    print("  \(key):")
                    for line in value.split(separator: "\n") { print("    \(line)") }
                } else {
                    print("  \(key): \(value)")
                }
            }
            return
        }
        let mounts = mountEntries().filter { $0.fstype == "fuse.ubiquity" }
        if mounts.isEmpty { print("No ubiquity mounts. Start one with `ubiquity mount ~/Cloud`."); return }
        for m in mounts {
            print(m.mountpoint)
            print("  store: \(m.source)")
            if let store = try? Store(directory: m.source, readOnly: true) {
                print("  device: \(store.deviceName) (\(store.deviceID))")
                print("  versions: \(store.versionCount)")
            }
            if let pid = daemonPID(store: m.source) { print("  daemon pid: \(pid)") }
            let log = daemonLogPath(store: m.source)
            print("  log: " + (access(log, F_OK) == 0 ? log : "the journal (`journalctl --user -u 'ubiquity@*'`) or the daemon's stderr"))
            printSyncStatus(mountpoint: m.mountpoint)
        }
    }
}

/// The daemon's sync status (`user.ubiquity.sync` on the mount point), one `key: value`
/// line each under "sync:", in the daemon's order; keys this CLI does not know print as
/// they are. An empty `error` is left out. "sync: unknown" when the daemon does not report
/// it (one from before sync answers ENODATA), with the reason for any other failure.
func printSyncStatus(mountpoint: String) {
    let status: SyncStatus
    do {
        status = try SyncStatus.read(mountpoint: mountpoint)
    } catch let error as SystemError where error.code == ENODATA {
        print("  sync: unknown")
        return
    } catch {
        print("  sync: unknown (\((error as? SystemError)?.reason ?? "\(error)"))")
        return
    }
    print("  sync:")
    for line in status.lines where line != "error=" {
        if let eq = line.firstIndex(of: "=") {
            print("    \(line[..<eq]): \(line[line.index(after: eq)...])")
        } else {
            print("    \(line)")
        }
    }
}
