import Glibc
import UbiquitySystem

/// A client's connection to a ControlServer: one request, then its reply lines.
public struct ControlConnection {
    public let fd: Int32

    /// Connects to the socket at `socketPath` and sends `request` as one JSON line.
    public init(socketPath: String, request: ControlRequest) throws(SystemError) {
        let line: String
        do { line = try JSONLines.encode(request) } catch {
            throw SystemError(EINVAL, "cannot encode the request: \(error)")
        }
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw .last("socket") }
        do throws(SystemError) {
            try withSocketAddress(socketPath) { (addr, len) throws(SystemError) in
                guard connect(fd, addr, len) == 0 else { throw .last("connect \(socketPath)") }
            }
            var bytes = Array((line + "\n").utf8)
            var sent = 0
            while sent < bytes.count {
                let n = bytes.withUnsafeMutableBytes { send(fd, $0.baseAddress! + sent, $0.count - sent, Int32(MSG_NOSIGNAL)) }
                if n < 0 && errno == EINTR { continue }
                guard n > 0 else { throw .last("send to \(socketPath)") }
                sent += n
            }
        } catch {
            Glibc.close(fd)
            throw error
        }
        self.fd = fd
    }

    /// Calls `body` with each line the server sends (without its newline) and its reply,
    /// until the server closes the connection or `body` returns false. The reply is nil for
    /// a line that is not one this version reads (a newer daemon's): the caller may show it
    /// as it is, or skip it.
    public func lines(_ body: (_ line: String, _ reply: ControlReply?) throws -> Bool) throws {
        try Self.readLines(fd) { line in try body(line, try? JSONLines.decode(ControlReply.self, from: line)) }
    }

    /// Each reply, decoded (a line that is not a ControlReply ends with DecodingError).
    public func replies(_ body: (ControlReply) throws -> Bool) throws {
        try Self.readLines(fd) { line in try body(try JSONLines.decode(ControlReply.self, from: line)) }
    }

    private static func readLines(_ fd: Int32, _ body: (String) throws -> Bool) throws {
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

    public func close() { _ = Glibc.close(fd) }
}
