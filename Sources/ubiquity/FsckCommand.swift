import ArgumentParser
import Glibc
import UbiquityDaemon
import UbiquityStore
import UbiquitySync

struct FsckCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "fsck",
        abstract: "Verify every chunk's hash and every version's chunk references; repair from the backing store.",
        discussion: """
        Safe while mounted. Without --repair it changes nothing: exit status 1 and a \
        report when anything is damaged. With --repair, chunks that versions need and \
        that are missing or damaged are fetched from the backing store's packs (each verified \
        by its hash and size before use) and the store is checked again; what could not \
        be repaired is listed, and the exit status is 1 unless everything is whole.

          ubiquity fsck
          ubiquity fsck --repair
          ubiquity fsck --repair --store DIR --backing DIR
          ubiquity fsck --repair --store DIR --backing s3://BUCKET/PREFIX

        With --backing and without --repair, the backing store is checked as well (or \
        alone, with --backing-only): every pack's index, every segment and every device's \
        newest checkpoint parse; each device's segments follow on; every chunk place in a \
        record names a chunk its pack's index holds there. --full also reads every chunk \
        of every pack and checks its hash. Nothing is changed.

          ubiquity fsck --backing s3://BUCKET/PREFIX --backing-only
        """)

    @Option(help: "Store directory. Default: that of --container.")
    var store: String?

    @Option(help: "Container name (selects the default store).")
    var container = "default"

    @Flag(help: "Fetch missing or damaged chunks from the backing store.")
    var repair = false

    @Option(help: "Backing store for --repair (a directory or s3://BUCKET[/PREFIX]). Default: the one the store last synced with. Without --repair: check it too.")
    var backing: String?

    @Flag(help: "Check only the backing store named by --backing (no local store needed).")
    var backingOnly = false

    @Flag(help: "With --backing: read and verify every chunk of every pack too.")
    var full = false

    @OptionGroup var password: PasswordOptions

    func validate() throws {
        if backingOnly && backing == nil { throw ValidationError("--backing-only needs --backing DIR or s3://BUCKET[/PREFIX]") }
        if backingOnly && repair { throw ValidationError("--backing-only checks the backing store; --repair fixes a local store: pick one") }
    }

    /// Checks the backing store; returns its problem count (printed).
    private func checkBacking(_ named: String) throws -> Int {
        let location = BackingChoice.isURL(named) ? named : Paths.absolute(named)
        let report: BackingCheck.Report
        do {
            let store = try password.openUnlocked(location, check: true, command: "fsck")
            var progress: ((String, Int, Int) -> Void)?
            if isatty(STDERR_FILENO) != 0 {
                progress = { what, done, total in
                    let line = "\rchecking \(what): \(done)/\(total)" + (done == total ? "\n" : "")
                    _ = line.withCString { write(STDERR_FILENO, $0, strlen($0)) }
                }
            }
            report = try BackingCheck.run(store: store, full: full, progress: progress)
        } catch let error as CLIError { throw error } catch let error as DaemonError { throw error } catch let exit as ExitCode {
            throw exit
        } catch { throw CLIError("\(location): \(error)") }
        for problem in report.problems { print("BACKING: \(problem)") }
        print("backing store \(location): \(report.summary): " + (report.problems.isEmpty ? "OK" : "\(report.problems.count) problem(s)"))
        return report.problems.count
    }

    func run() throws {
        if backingOnly, let backing {
            if try checkBacking(backing) > 0 { throw ExitCode.failure }
            return
        }
        let dir = store.map(Paths.absolute) ?? Paths.dataDirectory(container: container) + "/store"
        let s: Store
        do { s = try Store(directory: dir, readOnly: true) } catch { throw CLIError("\(error)") }
        var report = try check(s, dir)
        if repair && !report.damaged.isEmpty {
            let backingDir: String
            if let backing {
                backingDir = BackingChoice.isURL(backing) ? backing : Paths.absolute(backing)
            } else if let last = try? s.setting("backing") {
                backingDir = last
            } else {
                throw CLIError("\(dir) does not know its backing store (it never mounted with this version): pass --backing DIR or s3://BUCKET/PREFIX")
            }
            print("repairing \(report.damaged.count) chunk(s) from \(backingDir)")
            let result: Repair.Report
            do {
                // The store may be mounted: its daemon takes in the repaired copies when it
                // next reads one of these chunks (`ChunkStore.read`).
                let chunks = try ChunkStore(directory: dir + "/chunks", othersMayWrite: true)
                var progress: ((Int, Int) -> Void)?
                if isatty(STDERR_FILENO) != 0 { progress = Self.repairProgress }
                let places = try s.chunkPlaces(report.damaged.keys)
                let store = try password.openUnlocked(backingDir, check: false, command: "fsck")
                result = try Repair.run(damaged: report.damaged, chunks: chunks, backing: store, places: places, progress: progress)
            } catch let exit as ExitCode { throw exit } catch { throw CLIError("\(error)") }
            print("repaired \(result.repaired.count) chunk(s)")
            for (id, why) in result.unrepaired { print("NOT REPAIRED: chunk \(id): \(why)") }
            print("checking again")
            // A store opened again: a read-only one opened before the repair does not see a
            // small-chunk database the repair had to create.
            let again: Store
            do { again = try Store(directory: dir, readOnly: true) } catch { throw CLIError("\(error)") }
            report = try check(again, dir)
        }
        for problem in report.problems { print("DAMAGED: \(problem)") }
        let backingProblems = (backing != nil && !repair) ? try checkBacking(backing!) : 0
        if report.problems.isEmpty && backingProblems > 0 { throw ExitCode.failure }
        if report.problems.isEmpty {
            print("OK: no damage found")
        } else {
            print("\(report.problems.count) problem(s). Damaged chunks are never served (reads fail with EIO); versions that need them cannot be read."
                  + (repair ? "" : " `ubiquity fsck --repair` fetches them from the backing store if it has them."))
            throw ExitCode.failure
        }
    }

    private static func repairProgress(_ done: Int, _ total: Int) {
        let line = "\rrepairing: \(done)/\(total)" + (done == total ? "\n" : "")
        _ = line.withCString { write(STDERR_FILENO, $0, strlen($0)) }
    }

    private func check(_ s: Store, _ dir: String) throws -> Fsck.Report {
        let progress: (@Sendable (Int, Int) -> Void)? = isatty(STDERR_FILENO) != 0 ? Fsck.terminalProgress : nil
        let report: Fsck.Report
        do { report = try Fsck.run(store: s, progress: progress) } catch { throw CLIError("\(error)") }
        print("checked \(report.chunksChecked) chunks and \(report.versionsChecked) versions in \(dir)")
        if !report.notLocal.isEmpty {
            // Files on demand: not damage, and --repair does not fetch them (a read does).
            let bytes = report.notLocal.values.reduce(0, +)
            print("not local: \(report.notLocal.count) chunk(s), \(bytes) bytes, are in the backing store only (fetched when read)")
        }
        return report
    }
}
