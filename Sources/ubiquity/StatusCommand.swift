import ArgumentParser
import Glibc
import UbiquityDaemon
import UbiquityFS
import UbiquityStore
import UbiquitySystem

struct StatusCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "status",
        abstract: "Show mounted containers and their sync state, or the status of one file.",
        discussion: """
        Without PATH: each mounted container, its store and daemon, and the daemon's \
        sync state (syncing, paused or offline; pending uploads; last sync; conflicts; \
        last error). With a PATH inside a mount: its user.ubiquity.* status attributes \
        (version, versions, conflicts, uploaded, ...). Those are readable by name only \
        (`getfattr -n user.ubiquity.version FILE`): listxattr and `getfattr -d` show only \
        your own attributes, so backups (rsync -aX, cp -a, tar --xattrs) do not copy them.

          ubiquity status
          ubiquity status ~/Cloud/notes.txt
        """)

    @Argument(help: "A file inside a mount (optional).")
    var path: String?

    func run() throws {
        if let path {
            let abs = Paths.absolute(path)
            guard Paths.mount(containing: abs) != nil else { throw CLIError("\(abs) is not inside a ubiquity mount") }
            guard access(abs, F_OK) == 0 else { throw CLIError("\(abs): \(String(cString: strerror(errno)))") }
            print(abs)
            // Status attributes are not listed (so backups do not copy them): ask each by name.
            for name in FileSystem.statusAttributeNames {
                guard let value = try? getXattr(abs, name) else { continue }
                let key = name.dropFirst("user.ubiquity.".count)
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
            // The daemon commits what it holds in its group-commit batch first, so the
            // counts read from the database below include every save made before this.
            let committed = try? getXattr(m.mountpoint, FileSystem.committedAttribute)
            if let store = try? Store(directory: m.source, readOnly: true) {
                print("  as of: " + (committed ?? "\(isoTime(nowNanos())) (the daemon did not commit first: the last 0.1 s of changes may be missing)"))
                print("  device: \(store.deviceName) (\(store.deviceID))")
                print("  versions: \(store.versionCount)")
                if let encryption = (try? store.setting("encryption")) ?? nil { print("  encryption: \(encryption)") }
                printSpace(store)
                printContents(store)
            }
            if let pid = daemonPID(store: m.source) { print("  daemon pid: \(pid)") }
            let log = daemonLogPath(store: m.source)
            print("  log: " + (access(log, F_OK) == 0 ? log : "the journal (`journalctl --user -u 'ubiquity@*'`) or the daemon's stderr"))
            printSyncStatus(mountpoint: m.mountpoint)
        }
    }
}

/// The current contents here against the container's (files on demand), from the totals the
/// store keeps (O(1)), and the cache limit the daemon runs with.
func printContents(_ store: Store) {
    guard let t = store.contentTotals() else { return }
    let apparent = t.size != t.allocated ? " (apparent size \(byteText(t.size)))" : ""
    let absent = t.absentFiles == 0 ? "all here" : "\(t.absentFiles) not all here"
    var line = "  contents: \(byteText(t.here)) here of \(byteText(t.allocated))\(apparent); \(t.files) files, \(absent)"
    if let limit = ((try? store.setting("cache_size")) ?? nil).flatMap({ Int64($0) }) { line += "; cache-size \(byteText(limit))" }
    print(line)
}

/// The store's size now (its databases: O(1)), and what the last gc measured: the chunk
/// files, the content only history uses, and how much of it the retention policy would
/// prune.
func printSpace(_ store: Store) {
    let (metadata, small) = store.databaseBytes
    var fields: [String: Int64] = [:]
    for item in ((try? store.setting("space")) ?? nil)?.split(separator: " ") ?? [] {
        let parts = item.split(separator: "=", maxSplits: 1)
        if parts.count == 2, let value = Int64(parts[1]) { fields[String(parts[0])] = value }
    }
    guard let measured = fields["measured"] else {
        print("  store: \(byteText(metadata + small)) in databases (metadata \(byteText(metadata)), small chunks \(byteText(small))), "
              + "chunk files not measured yet (the daemon's daily gc measures them; `ubiquity gc` does now)")
        return
    }
    let files = fields["chunk_files"] ?? 0
    print("  store: \(byteText(metadata.addingClamped(small).addingClamped(files))) (metadata \(byteText(metadata)), small chunks \(byteText(small)), "
          + "chunk files \(byteText(files)) at the last gc, \(isoTime(measured)))")
    print("  content: \(byteText(fields["current"] ?? 0)) in current versions, \(byteText(fields["history"] ?? 0)) only in older versions")
    print("  reclaimable: \(byteText(fields["prunable"] ?? 0)) by `ubiquity prune` then `ubiquity gc` (the retention policy, at the last gc)")
}

/// The daemon's sync status (`user.ubiquity.sync` on the mount point), one `key: value`
/// line each under "sync:", in the daemon's order; keys this CLI does not know print as
/// they are. A failure prints as `error (KIND): MESSAGE` and what to do about it, where
/// KIND says whether sync's own retries can end it; empty error fields are left out.
/// "sync: unknown" when the daemon does not report it (ENODATA), with the reason for any
/// other failure.
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
    for (key, value) in status.fields {
        switch key {
        case "error-kind", "error-advice": continue
        case "error":
            guard !value.isEmpty else { continue }
            print("    error (\(status["error-kind"] ?? "unknown kind")): \(value)")
            if let advice = status["error-advice"], !advice.isEmpty { print("    what to do: \(advice)") }
        default:
            print("    \(key): \(value)")
        }
    }
}
