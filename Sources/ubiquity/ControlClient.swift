import Glibc
import UbiquitySystem

/// A connection to a mount's daemon through its control socket (ControlServer): the
/// socket the mount root's `user.ubiquity.socket` names.
struct ControlClient {
    let fd: Int32

    /// Connects to the daemon of `mountpoint` and sends `request` (one line).
    init(mountpoint: String, request: String) throws {
        let path: String
        do { path = try readXattr(mountpoint, "user.ubiquity.socket") } catch {
            throw CLIError("\(mountpoint): its daemon has no control socket (\(error.reason)); a daemon started before this version needs a remount")
        }
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw CLIError("socket: \(errnoText(errno))") }
        do {
            try withSocketAddress(path) { (addr, len) throws(SystemError) in
                guard connect(fd, addr, len) == 0 else { throw .last("connect \(path)") }
            }
        } catch {
            Glibc.close(fd)
            throw CLIError("cannot reach the daemon of \(mountpoint): \(error)")
        }
        self.fd = fd
        var bytes = Array((request + "\n").utf8)
        let n = bytes.withUnsafeMutableBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        guard n == bytes.count else { Glibc.close(fd); throw CLIError("cannot send to the daemon of \(mountpoint)") }
    }

    /// Calls `body` with each line the daemon sends until it closes the connection or
    /// `body` returns false.
    func lines(_ body: (String) throws -> Bool) throws {
        var pending: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { return }
            pending += buffer[0..<n]
            var start = 0
            while let nl = pending[start...].firstIndex(of: UInt8(ascii: "\n")) {
                let line = String(decoding: pending[start..<nl], as: UTF8.self)
                start = nl + 1
                if try !body(line) { return }
            }
            pending.removeFirst(start)
        }
    }

    func close() { _ = Glibc.close(fd) }
}

/// Writes one line to standard output at once (unbuffered: a pipe reader sees each event
/// as it comes).
func emitLine(_ text: String) {
    try? writeAll(STDOUT_FILENO, Array((text + "\n").utf8), path: "standard output")
}
