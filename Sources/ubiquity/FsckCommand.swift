import ArgumentParser
import Glibc
import UbiquityStore

struct FsckCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "fsck",
        abstract: "Verify every chunk's hash and every version's chunk references.",
        discussion: "Safe while mounted (read-only). Exit status 1 and a report when anything is damaged.")

    @Option(help: "Store directory. Default: that of --container.")
    var store: String?

    @Option(help: "Container name (selects the default store).")
    var container = "default"

    func run() throws {
        let dir = store.map(Paths.absolute) ?? Paths.dataDirectory(container: container) + "/store"
        let s: Store
        do { s = try Store(directory: dir, readOnly: true) } catch { throw CLIError("\(error)") }
        let progress: (@Sendable (Int, Int) -> Void)? = isatty(STDERR_FILENO) != 0 ? Fsck.terminalProgress : nil
        let report: Fsck.Report
        do { report = try Fsck.run(store: s, progress: progress) } catch { throw CLIError("\(error)") }
        print("checked \(report.chunksChecked) chunks and \(report.versionsChecked) versions in \(dir)")
        for problem in report.problems { print("DAMAGED: \(problem)") }
        if report.problems.isEmpty {
            print("OK: no damage found")
        } else {
            print("\(report.problems.count) problem(s). Damaged chunks are never served (reads fail with EIO); versions that need them cannot be read.")
            throw ExitCode.failure
        }
    }
}
