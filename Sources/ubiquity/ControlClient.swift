import Glibc
import UbiquityDaemon
import UbiquitySystem

/// Connects to the daemon of `mountpoint` through its control socket (ControlServer): the
/// socket the mount root's `user.ubiquity.socket` names.
func connectToDaemon(mountpoint: String, request: ControlRequest) throws -> ControlConnection {
    let path: String
    do { path = try readXattr(mountpoint, "user.ubiquity.socket") } catch {
        throw CLIError("\(mountpoint): its daemon has no control socket (\(error.reason)); a daemon started before this version needs a remount")
    }
    do { return try ControlConnection(socketPath: path, request: request) } catch {
        throw CLIError("cannot reach the daemon of \(mountpoint): \(error)")
    }
}

/// Writes one line to standard output at once (unbuffered: a pipe reader sees each event
/// as it comes).
func emitLine(_ text: String) {
    try? writeAll(STDOUT_FILENO, Array((text + "\n").utf8), path: "standard output")
}

/// Prints `value` as one line of JSON (JSONLines: Foundation's JSONEncoder, keys sorted):
/// the form of every `--json` output.
func printJSON(_ value: some Encodable) throws {
    let line: String
    do { line = try JSONLines.encode(value) } catch {
        throw CLIError("cannot write JSON: \(error)")
    }
    print(line)
}
