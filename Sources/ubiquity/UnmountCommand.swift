import ArgumentParser
import Glibc
import UbiquityDaemon
import UbiquitySystem

struct UnmountCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "unmount",
        abstract: "Commit pending saves, then unmount MOUNTPOINT.",
        discussion: "Waits until the daemon has committed everything and exited. Fails (and leaves the mount alone) while programs still use it.")

    @Argument(help: "The mount point.")
    var mountpoint: String

    @Option(help: "Seconds to wait for the daemon to finish committing.")
    var timeout: Double = 120

    func run() throws {
        let mp = Paths.absolute(mountpoint)
        guard let entry = mountEntries().last(where: { $0.mountpoint == mp }) else {
            throw CLIError("\(mp) is not mounted")
        }
        guard entry.fstype == "fuse.ubiquity" else { throw CLIError("\(mp) is a \(entry.fstype) mount, not ubiquity") }
        let pid = daemonPID(store: entry.source)
        let status = runProcess(["fusermount3", "-u", mp])
        if status != 0 {
            throw CLIError("cannot unmount \(mp): it is busy or not yours. Close the programs using it (`fuser -vm \(mp)`) and try again.")
        }
        if let pid {
            var waited = 0.0
            while kill(pid, 0) == 0 && waited < timeout {
                usleep(50_000)
                waited += 0.05
            }
            if kill(pid, 0) == 0 { throw CLIError("unmounted, but the daemon (pid \(pid)) is still committing after \(Int(timeout)) s; it will finish on its own") }
        }
        print("Unmounted \(mp)")
    }
}

/// The daemon's pid from the store's lock file (written by the process holding it).
func daemonPID(store: String) -> pid_t? {
    guard store.hasPrefix("/"), let bytes = try? readFile(store + "/lock", limit: 64) else { return nil }
    guard let pid = Int32(String(decoding: bytes, as: UTF8.self).trimmingTrailingNewlines()), pid > 0 else { return nil }
    return pid
}

/// Runs a program from PATH and returns its exit status.
func runProcess(_ args: [String]) -> Int32 {
    var pid: pid_t = 0
    var cargs = args.map { strdup($0) } + [nil]
    defer { cargs.forEach { free($0) } }
    guard posix_spawnp(&pid, args[0], nil, nil, &cargs, environ) == 0 else { return 127 }
    var status: Int32 = 0
    while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
    return (status & 0x7f) == 0 ? (status >> 8) & 0xff : 128 + (status & 0x7f)
}
