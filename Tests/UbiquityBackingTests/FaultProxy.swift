import Glibc
import Synchronization
import UbiquitySystem

/// A TCP proxy on loopback between an S3 client and the real server, that breaks
/// connections on purpose (issue 23: "a fault-injecting proxy on loopback (5xx, resets,
/// stalls)"). Each accepted connection gets one fault from `plan` (by connection number):
/// pass it through, reset it once the request has arrived, answer 503 SlowDown, stall
/// (say nothing, hold it open), or answer garbage (a 200 whose XML is nonsense and whose
/// Content-Length lies). One thread per connection; `stop()` ends them all.
final class FaultProxy: @unchecked Sendable {
    enum Fault: Sendable { case pass, reset, slowDown, stall, garbage }

    let port: Int
    private let listener: Int32
    private let target: Int
    private let plan: @Sendable (Int) -> Fault
    private let state = Mutex<(count: Int, stopped: Bool, sockets: [Int32])>((0, false, []))

    init(targetPort: Int, plan: @escaping @Sendable (Int) -> Fault) throws {
        target = targetPort
        self.plan = plan
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        var addr = Self.loopback(port: 0)
        let bound = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        guard bound == 0, listen(fd, 64) == 0 else { close(fd); throw ProxyError.setup(errno) }
        var got = sockaddr_in(), length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &got) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) } }
        listener = fd
        port = Int(UInt16(bigEndian: got.sin_port))
        acceptThread.withLock { $0 = JoinableThread { [self] in acceptLoop() } }
    }

    private let acceptThread = Mutex<JoinableThread?>(nil)

    enum ProxyError: Error { case setup(Int32) }

    var connections: Int { state.withLock { $0.count } }

    /// Ends every connection and the listener. The sockets are shut down under the lock
    /// under which they are closed (`untrack`), and the listener is closed only after the
    /// accept loop ended: a shutdown or accept on a descriptor number that another proxy
    /// (two seeds run at once) got meanwhile made that proxy's accept fail with EINVAL
    /// forever, and its test hang (a CI run sat there for 15 minutes).
    func stop() {
        state.withLock { s in
            s.stopped = true
            for fd in s.sockets { shutdown(fd, Int32(SHUT_RDWR)) }
        }
        shutdown(listener, Int32(SHUT_RDWR))
        acceptThread.withLock { $0 }?.join()
        close(listener)
    }

    private func untrack(_ fd: Int32) {
        state.withLock { s in
            s.sockets.removeAll { $0 == fd }
            close(fd)
        }
    }

    static func loopback(port: Int) -> sockaddr_in {
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = UInt16(port).bigEndian
        addr.sin_addr.s_addr = UInt32(0x7f00_0001).bigEndian
        return addr
    }

    private func track(_ fd: Int32) -> Bool {
        state.withLock { s in
            if s.stopped { return false }
            s.sockets.append(fd)
            return true
        }
    }

    private func acceptLoop() {
        while true {
            let client = accept(listener, nil, nil)
            if client < 0 {
                let code = errno // before the lock, which may change it
                if state.withLock({ $0.stopped }) || code == EINVAL || code == EBADF { return }
                continue
            }
            guard track(client) else { close(client); return }
            let n = state.withLock { s -> Int in s.count += 1; return s.count }
            let fault = plan(n)
            _ = JoinableThread { [self] in serve(client, fault) }
        }
    }

    private func serve(_ client: Int32, _ fault: Fault) {
        defer { untrack(client) }
        switch fault {
        case .pass:
            let upstream = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            var addr = Self.loopback(port: target)
            let ok = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(upstream, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
            guard ok == 0, track(upstream) else { close(upstream); return }
            defer { untrack(upstream) }
            // One request per connection (the request says `Connection: close`), so that
            // the client's connection reuse does not route everything past the faults.
            guard let (head, rest) = Self.requestHead(client) else { return }
            let lines = String(decoding: head, as: UTF8.self).split(separator: "\r\n", omittingEmptySubsequences: false)
                .filter { !$0.lowercased().hasPrefix("connection:") && !$0.isEmpty }
            Self.send(upstream, lines.joined(separator: "\r\n") + "\r\nConnection: close\r\n\r\n")
            _ = rest.withUnsafeBytes { write(upstream, $0.baseAddress, $0.count) }
            let back = JoinableThread { Self.pump(from: upstream, to: client) }
            Self.pump(from: client, to: upstream)
            shutdown(upstream, Int32(SHUT_WR))
            back.join()
        case .reset:
            _ = Self.readRequestHead(client)
            var linger = linger(l_onoff: 1, l_linger: 0) // RST, not FIN
            setsockopt(client, SOL_SOCKET, SO_LINGER, &linger, socklen_t(MemoryLayout<linger>.size))
        case .slowDown:
            _ = Self.readRequestHead(client)
            Self.send(client, "HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nContent-Length: 96\r\nConnection: close\r\n\r\n"
                + "<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>" + String(repeating: " ", count: 9))
        case .stall:
            _ = Self.readRequestHead(client)
            while !state.withLock({ $0.stopped }) { usleep(100_000) }
        case .garbage:
            _ = Self.readRequestHead(client)
            Self.send(client, "HTTP/1.1 200 OK\r\nContent-Length: 500\r\nConnection: close\r\n\r\n<ListBucketResult><IsTruncated>maybe</Is")
        }
    }

    /// The request head (without its blank line) and whatever body bytes came with it.
    private static func requestHead(_ fd: Int32) -> (head: [UInt8], rest: [UInt8])? {
        var seen: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        let marker = Array("\r\n\r\n".utf8)
        while seen.count < 1 << 20 {
            let n = read(fd, &buffer, buffer.count)
            if n <= 0 { return nil }
            seen += buffer[0..<n]
            if let end = seen.firstRange(of: marker) {
                return (Array(seen[..<end.lowerBound]), Array(seen[end.upperBound...]))
            }
        }
        return nil
    }

    private static func readRequestHead(_ fd: Int32) -> Bool { requestHead(fd) != nil }

    private static func send(_ fd: Int32, _ text: String) {
        let bytes = Array(text.utf8)
        _ = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
    }

    private static func pump(from: Int32, to: Int32) {
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = read(from, &buffer, buffer.count)
            if n <= 0 { return }
            var done = 0
            while done < n {
                let w = buffer[done..<n].withUnsafeBytes { write(to, $0.baseAddress, $0.count) }
                if w <= 0 { return }
                done += w
            }
        }
    }
}
