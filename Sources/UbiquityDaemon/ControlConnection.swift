import Glibc
import UbiquitySystem

/// A client's connection to a ControlServer: one request, then its reply lines.
public struct ControlConnection {
    public let fd: Int32
    private let path: String
    private let request: ControlRequest

    /// Connects to the socket at `socketPath` and sends `request` as one JSON line.
    public init(socketPath: String, request: ControlRequest) throws(SystemError) {
        let line: String
        do { line = try JSONLine.encode(request) } catch {
            throw SystemError(EINVAL, "cannot encode the request: \(error)")
        }
        try self.init(socketPath: socketPath, line: line, request: request)
    }

    private init(socketPath: String, line: String, request: ControlRequest) throws(SystemError) {
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
        path = socketPath
        self.request = request
    }

    /// Calls `body` with each line the server sends (without its newline) until the
    /// server closes the connection or `body` returns false.
    ///
    /// A daemon started before requests were JSON answers a JSON request with
    /// `{"error":"unknown request {..."}`: the request is then sent again in the word form
    /// it knows, on a new connection (closed before this returns), and its lines are the ones
    /// `body` sees.
    public func lines(_ body: (String) throws -> Bool) throws {
        var first = true
        var retried: ControlConnection?
        defer { retried?.close() }
        try Self.readLines(fd) { line in
            defer { first = false }
            if first, line.hasPrefix(#"{"error":"unknown request {"#) {
                retried = try ControlConnection(socketPath: path, line: request.wordLine, request: request)
                return false
            }
            return try body(line)
        }
        if let retried { try Self.readLines(retried.fd, body) }
    }

    /// Each reply, decoded (a line that is not a ControlReply ends with DecodingError).
    public func replies(_ body: (ControlReply) throws -> Bool) throws {
        try lines { line in try body(try JSONLine.decode(ControlReply.self, from: line.utf8)) }
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
