import Dispatch
import Glibc
import UbiquityFS
import UbiquityStore
import UbiquitySystem

/// The daemon's control socket, `<store>/control.sock` (owner only), for what a mount's
/// files cannot carry: a consistent listing of a big container streamed as it is read,
/// and events as they happen. The mount root's `user.ubiquity.socket` names it.
///
/// One request line per connection (ControlRequest), then JSON lines back (ControlReply;
/// docs/ARCHITECTURE.md, "control socket"). A request the server cannot read is answered
/// with one `{"error":...}` line. Each connection has its own thread, which sleeps in poll(2) while
/// nothing happens.
public final class ControlServer: @unchecked Sendable {
    public static let fileName = "control.sock"

    public let path: String
    private let fs: FileSystem
    private let storeDirectory: String
    private var listenFD: Int32 = -1
    private var acceptor: JoinableThread?
    private let connections = DispatchGroup()
    private let open = Locked<Set<Int32>>([])
    private let stopping = Locked(false)
    /// Connections served at once; more are closed at once (each holds a thread).
    static let maxConnections = 64
    /// Seconds a client may take to send its request, and to take a piece of the answer:
    /// one that stops reading must not hold a snapshot (and the WAL behind it) for good.
    static let requestTimeout = 10, sendTimeout = 30

    /// A server for `fs`, whose store is in `storeDirectory`; its socket is
    /// `<socketDirectory>/control.sock` (default: the store directory).
    public init(fs: FileSystem, storeDirectory: String, socketDirectory: String? = nil) {
        self.fs = fs
        self.storeDirectory = storeDirectory
        path = (socketDirectory ?? storeDirectory) + "/" + Self.fileName
    }

    public func start() throws(SystemError) {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw .last("socket") }
        unlink(path) // a socket a crashed daemon left
        do throws(SystemError) {
            try withSocketAddress(path) { (addr, len) throws(SystemError) in
                guard bind(fd, addr, len) == 0 else { throw .last("bind \(path)") }
            }
            chmod(path, 0o600)
            guard listen(fd, 16) == 0 else { throw .last("listen \(path)") }
        } catch {
            close(fd)
            throw error
        }
        listenFD = fd
        acceptor = JoinableThread { [self] in acceptLoop(fd) }
    }

    /// Ends the listener and every connection (unmount), and waits for their threads.
    public func stop() {
        guard listenFD >= 0 else { return }
        stopping.withLock { $0 = true }
        fs.feed.close()
        shutdown(listenFD, Int32(SHUT_RDWR))
        acceptor?.join()
        close(listenFD)
        listenFD = -1
        open.withLock { for fd in $0 { shutdown(fd, Int32(SHUT_RDWR)) } }
        connections.wait()
        unlink(path)
    }

    private func acceptLoop(_ fd: Int32) {
        while true {
            let client = accept(fd, nil, nil)
            if client < 0 {
                if stopping.withLock({ $0 }) { return }
                // Out of descriptors or memory for a moment: wait, and go on serving.
                if errno != EINTR && errno != ECONNABORTED { usleep(100_000) }
                continue
            }
            _ = fcntl(client, F_SETFD, FD_CLOEXEC)
            Self.setTimeout(client, SO_RCVTIMEO, seconds: Self.requestTimeout)
            Self.setTimeout(client, SO_SNDTIMEO, seconds: Self.sendTimeout)
            let admitted = open.withLock { set -> Bool in
                guard set.count < Self.maxConnections else { return false }
                set.insert(client)
                return true
            }
            guard admitted else {
                _ = send(client, .error("too many connections"))
                close(client)
                continue
            }
            connections.enter()
            DispatchQueue.global().async { [self] in
                serve(client)
                open.withLock { _ = $0.remove(client) }
                close(client)
                connections.leave()
            }
        }
    }

    // MARK: requests

    private func serve(_ fd: Int32) {
        let request: ControlRequest
        switch readLine(fd) {
        case .none: return // the client sent nothing, or went away
        case .tooLong: _ = send(fd, .error("request longer than \(ControlRequest.maxLineBytes) bytes")); return
        case .line(let line):
            do { request = try ControlRequest(line: line) } catch {
                _ = send(fd, .error(error.description))
                return
            }
        }
        switch request {
        case .watchKeyValues: watchKeyValues(fd)
        case .query(let q): query(fd, q)
        case .files(let action, let path): files(fd, action, path)
        }
    }

    /// A files request: each file at or below `path` in turn, progress every 0.2 s at most,
    /// a result line for each file that did not go (and each eviction), then `finished`.
    /// A client that goes away ends it after the file in hand.
    private func files(_ fd: Int32, _ action: ControlFilesAction, _ path: String) {
        let targets: [(ino: InodeNumber, path: String, absent: Int64)]
        do { targets = try fs.keepTargets(at: path) } catch {
            _ = send(fd, .error("\(path.isEmpty ? "/" : path): \(error == .notFound ? "no such file or directory" : "\(error)")"))
            return
        }
        let fetching = action == .download || action == .pin
        let ofBytes = fetching ? targets.reduce(Int64(0)) { $0.addingClamped($1.absent) } : 0
        var (done, bytes, problems) = (0, Int64(0), 0)
        var lastProgress = Int64(0)
        func progress(force: Bool) -> Bool {
            let now = nowNanos()
            guard force || now - lastProgress > 200_000_000 else { return true }
            lastProgress = now
            return send(fd, .progress(files: done, of: targets.count, bytes: bytes, ofBytes: ofBytes))
        }
        guard progress(force: true) else { return }
        // Chunks pinned and open files use, worked out once for the whole eviction.
        let inUse = action == .evict ? try? fs.chunksInUse() : nil
        for target in targets {
            var outcome = FileSystem.KeepOutcome.done(bytes: 0)
            do {
                switch action {
                case .download: outcome = fs.download(target.ino) { bytes += $0; _ = progress(force: false) }
                case .pin:
                    try fs.setKeep(target.ino, .pinned)
                    outcome = fs.download(target.ino) { bytes += $0; _ = progress(force: false) }
                case .unpin: try fs.setKeep(target.ino, .automatic)
                case .evict:
                    outcome = fs.evict(target.ino, keeping: inUse)
                    if case .done(let freed) = outcome { bytes += freed }
                }
            } catch {
                outcome = .failed("\(error)")
            }
            done += 1
            let line: ControlReply?
            switch outcome {
            case .refused(let why): problems += 1; line = .result(path: target.path, result: "refused", bytes: 0, detail: why)
            case .failed(let why): problems += 1; line = .result(path: target.path, result: "failed", bytes: 0, detail: why)
            case .done(let freed): line = action == .evict ? .result(path: target.path, result: "done", bytes: freed, detail: "") : nil
            }
            if let line, !send(fd, line) { return }
            if !progress(force: false) || peerClosed(fd) { return }
        }
        _ = progress(force: true)
        _ = send(fd, .finished(files: done, bytes: bytes, problems: problems))
    }

    private func watchKeyValues(_ fd: Int32) {
        guard let subscription = try? fs.feed.subscribe() else { return }
        defer { subscription.cancel() }
        guard send(fd, .watching) else { return }
        relay(subscription, to: fd) { event in
            guard case .keyValue(let change) = event else { return nil }
            return .keyValueChanged(ControlKeyChange(change))
        }
    }

    /// Sends the subscription's events as `reply` renders them (nil: not for this client),
    /// and `overflow` when some were lost, until the client or the feed goes away.
    private func relay(_ subscription: Subscription, to fd: Int32, _ reply: (FeedEvent) -> ControlReply?) {
        while true {
            switch subscription.wait(other: fd) {
            case .closed: return
            case .other: if peerClosed(fd) { return }
            case .events: break
            }
            let (events, lost, closed) = subscription.take()
            var out = lost ? Self.line(.overflow) : ""
            for event in events { if let r = reply(event) { out += Self.line(r) } }
            if !out.isEmpty && !send(fd, out) { return }
            if closed { return }
        }
    }

    private func query(_ fd: Int32, _ request: ControlQuery) {
        var filter = QueryFilter()
        guard let scope = QueryFilter.Scope(rawValue: request.scope) else {
            _ = send(fd, .error("scope is documents, data or all"))
            return
        }
        filter.scope = scope
        filter.name = request.name
        filter.includeHidden = request.hidden
        // The snapshot and the subscription start at one instant, under the filesystem's
        // lock: every change is either in the listing or an event after it.
        let started: (Store, Subscription?)
        do {
            // Opened before the lock (it makes directories and connections); under it only
            // the commit, the read transaction's start and the subscription.
            let snapshot = try Store(directory: storeDirectory, readOnly: true, cachedInodes: 64)
            started = try fs.withStoreSnapshot { () throws(StoreError) -> (Store, Subscription?) in
                try snapshot.beginSnapshot()
                return (snapshot, request.watch ? try? fs.feed.subscribe() : nil)
            }
        } catch {
            _ = send(fd, .error("\(error)"))
            return
        }
        let (snapshot, subscription) = started
        defer { subscription?.cancel() }
        var count = 0
        var buffer = ""
        var failed = false
        do {
            try snapshot.forEachQueryItem(filter) { (item) throws(StoreError) in
                count += 1
                buffer += Self.line(.file(ControlFile(item)))
                if buffer.utf8.count > 64 << 10 {
                    if !send(fd, buffer) { throw .io(errno: EPIPE, "the client went away") }
                    buffer = ""
                }
            }
        } catch {
            failed = true
        }
        try? snapshot.endSnapshot()
        if failed { return }
        guard send(fd, buffer + Self.line(.gathered(count: count))), let subscription else { return }
        relay(subscription, to: fd) { event in
            guard case .file(let event) = event, filter.matches(event.path) else { return nil }
            let kind = ControlFileEvent(rawValue: event.kind.rawValue) ?? .changed
            return .fileEvent(kind, path: event.path, file: event.item.map(ControlFile.init))
        }
    }

    /// `reply` as one line with its newline. Nothing the server sends fails to encode; were
    /// it to, the client gets an error line instead of nothing.
    static func line(_ reply: ControlReply) -> String {
        do { return try JSONLines.encode(reply) + "\n" } catch {
            return (try? JSONLines.encode(ControlReply.error("cannot encode a reply: \(error)"))).map { $0 + "\n" } ?? ""
        }
    }

    // MARK: socket I/O

    private static func setTimeout(_ fd: Int32, _ option: Int32, seconds: Int) {
        var tv = timeval(tv_sec: seconds, tv_usec: 0)
        _ = setsockopt(fd, SOL_SOCKET, option, &tv, socklen_t(MemoryLayout<timeval>.size))
    }

    enum Request: Equatable { case line(String), tooLong }

    /// One line of at most ControlRequest.maxLineBytes (a request); nil if the client sent
    /// none (it went away, or stayed silent past requestTimeout).
    private func readLine(_ fd: Int32) -> Request? {
        var bytes: [UInt8] = []
        var one: UInt8 = 0
        while bytes.count < ControlRequest.maxLineBytes {
            let n = recv(fd, &one, 1, 0)
            if n < 0 && errno == EINTR { continue }
            guard n == 1 else { return nil }
            if one == UInt8(ascii: "\n") { return .line(String(decoding: bytes, as: UTF8.self)) }
            bytes.append(one)
        }
        return .tooLong
    }

    /// Whether a readable socket is at its end (the watcher went away).
    private func peerClosed(_ fd: Int32) -> Bool {
        var byte: UInt8 = 0
        let n = recv(fd, &byte, 1, Int32(MSG_DONTWAIT))
        return n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)
    }

    private func send(_ fd: Int32, _ reply: ControlReply) -> Bool { send(fd, Self.line(reply)) }

    /// Sends all of `text`; false when the client went away (no SIGPIPE).
    private func send(_ fd: Int32, _ text: String) -> Bool {
        var bytes = Array(text.utf8)
        var sent = 0
        while sent < bytes.count {
            let n = bytes.withUnsafeMutableBytes { Glibc.send(fd, $0.baseAddress! + sent, $0.count - sent, Int32(MSG_NOSIGNAL)) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { return false }
            sent += n
        }
        return true
    }
}

/// Calls `body` with a sockaddr_un for `path`. A path too long for sun_path (108 bytes)
/// is reached through its directory's descriptor (/proc/self/fd/N/name).
public func withSocketAddress<T>(_ path: String, _ body: (UnsafePointer<sockaddr>, socklen_t) throws(SystemError) -> T) throws(SystemError) -> T {
    var target = path
    var dirFD: Int32 = -1
    defer { if dirFD >= 0 { close(dirFD) } }
    if path.utf8.count >= 108, let slash = path.lastIndex(of: "/") {
        dirFD = open(String(path[..<slash]), O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard dirFD >= 0 else { throw .last("open \(path[..<slash])") }
        target = "/proc/self/fd/\(dirFD)/" + path[path.index(after: slash)...]
    }
    var addr = sockaddr_un()
    addr.sun_family = sa_family_t(AF_UNIX)
    let bytes = Array(target.utf8)
    guard bytes.count < MemoryLayout.size(ofValue: addr.sun_path) else { throw SystemError(ENAMETOOLONG, "socket path \(path)") }
    withUnsafeMutableBytes(of: &addr.sun_path) { raw in
        for (i, b) in bytes.enumerated() { raw[i] = b }
        raw[bytes.count] = 0
    }
    return try withUnsafePointer(to: &addr) { (p) throws(SystemError) -> T in
        try p.withMemoryRebound(to: sockaddr.self, capacity: 1) { (sa) throws(SystemError) -> T in
            try body(sa, socklen_t(MemoryLayout<sockaddr_un>.size))
        }
    }
}
