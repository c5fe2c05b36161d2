import Glibc
import Testing
import TestSupport
import UbiquityDaemon
import UbiquityFS
import UbiquityStore
import UbiquitySystem

/// A real ControlServer on a temporary store's socket, asked through the client's own code
/// (ControlConnection): a query's consistent listing, a watch's events, and hostile
/// requests answered with an error line while the server goes on serving.
@Suite(.serialized) struct ControlServerTests {
    final class Daemon {
        let dir: String
        let fs: FileSystem
        let server: ControlServer
        let me = Caller(uid: 1000, gid: 1000)

        init() throws {
            dir = TempDirectory(prefix: "ubiquity-daemon").path
            fs = FileSystem(store: try Store(directory: dir, deviceName: "unit"))
            server = ControlServer(fs: fs, storeDirectory: dir)
            try server.start()
        }

        deinit {
            server.stop()
            fs.drain()
            removeTree(dir)
        }

        func save(_ name: String, _ text: String, in parent: InodeNumber = Store.rootInode) throws {
            let (a, h) = try fs.create(parent: parent, name: name, mode: 0o644, flags: OpenFlags(O_WRONLY), caller: me)
            _ = a
            let bytes = Array(text.utf8)
            _ = try bytes.withUnsafeBytes { try fs.write(h, offset: 0, data: $0) }
            try fs.flush(h)
            try fs.release(h)
            // What the FUSE session's group commit does every 0.1 s: a query's snapshot opens
            // its own connection, which waits while the writer's transaction is open.
            fs.commitMetadata()
        }

        func replies(_ request: ControlRequest, until stop: (ControlReply) -> Bool = { _ in false }) throws -> [ControlReply] {
            let connection = try ControlConnection(socketPath: server.path, request: request)
            defer { connection.close() }
            var all: [ControlReply] = []
            try connection.replies { reply in
                all.append(reply)
                return !stop(reply)
            }
            return all
        }

        /// Sends `bytes` as they are (no newline added), ends its side, and reads every line back.
        func raw(_ bytes: [UInt8]) throws -> [String] {
            let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
            #expect(fd >= 0)
            defer { close(fd) }
            try withSocketAddress(server.path) { (addr, len) throws(SystemError) in
                guard connect(fd, addr, len) == 0 else { throw .last("connect") }
            }
            var sent = 0
            while sent < bytes.count {
                let n = bytes.withUnsafeBytes { send(fd, $0.baseAddress! + sent, $0.count - sent, Int32(MSG_NOSIGNAL)) }
                if n <= 0 { break } // the server stopped reading (a line too long): fine
                sent += n
            }
            shutdown(fd, Int32(SHUT_WR))
            var out: [UInt8] = []
            var buffer = [UInt8](repeating: 0, count: 4096)
            while true {
                let n = recv(fd, &buffer, buffer.count, 0)
                if n < 0 && errno == EINTR { continue }
                guard n > 0 else { break }
                out += buffer[0..<n]
            }
            return String(decoding: out, as: UTF8.self).split(separator: "\n").map(String.init)
        }
    }

    @Test func queryListsTheStoreThroughTheClient() throws {
        let d = try Daemon()
        let docs = try d.fs.mkdir(parent: Store.rootInode, name: "Documents", mode: 0o755, caller: d.me).ino
        d.fs.commitMetadata()
        try d.save("a.txt", "doc", in: docs)
        try d.save("notes.txt", "note")
        try d.save(".hidden", "no")

        let all = try d.replies(.query(ControlQuery()))
        #expect(all.last == .gathered(count: 2))
        let files = all.compactMap { if case .file(let f) = $0 { f } else { nil } }
        #expect(Set(files.map(\.path)) == ["Documents/a.txt", "notes.txt"])
        #expect(files.allSatisfy { $0.state == "pending" })
        #expect(files.first { $0.path == "notes.txt" }?.size == 4)

        #expect(try d.replies(.query(ControlQuery(hidden: true))).last == .gathered(count: 3))
        let documents = try d.replies(.query(ControlQuery(scope: "documents")))
        #expect(documents.count == 2 && documents.last == .gathered(count: 1))
        #expect(try d.replies(.query(ControlQuery(name: "*.txt"))).last == .gathered(count: 2))
        #expect(try d.replies(.query(ControlQuery(scope: "everything"))) == [.error("scope is documents, data or all")])
    }

    @Test func aWatchingQueryReportsAChangeAfterItsListing() throws {
        let d = try Daemon()
        try d.save("before.txt", "1")
        let connection = try ControlConnection(socketPath: d.server.path, request: .query(ControlQuery(watch: true)))
        defer { connection.close() }
        var seen: [ControlReply] = []
        var kinds: [ControlFileEvent] = []
        try connection.replies { reply in
            seen.append(reply)
            if reply == .gathered(count: 1) { try d.save("after.txt", "22") }
            if case .fileEvent(let kind, "after.txt", let file) = reply {
                kinds.append(kind)
                return file?.size != 2 // created empty, then written
            }
            return true
        }
        #expect(kinds.first == .added)
        #expect(seen.first.map { if case .file(let f) = $0 { f.path == "before.txt" } else { false } } == true)
        #expect(seen.dropFirst().first == .gathered(count: 1))
    }

    @Test func aKeyValueWatchStartsWithWatching() throws {
        let d = try Daemon()
        #expect(try d.replies(.watchKeyValues) { $0 == .watching } == [.watching])
    }

    /// The word form older clients sent is refused with one error line; the server goes on.
    @Test func wordRequestsAreRefused() throws {
        let d = try Daemon()
        try d.save("x.txt", "x")
        for word in ["query scope=all hidden=0 watch=0\n", "watch-kv\n"] {
            let lines = try d.raw(Array(word.utf8))
            #expect(lines.count == 1)
            guard let line = lines.first else { continue }
            guard case .error(let message) = try JSONLines.decode(ControlReply.self, from: line) else {
                Issue.record("not an error: \(line)")
                continue
            }
            #expect(message.hasPrefix("bad request: not a JSON object"))
        }
        // A JSON request on the raw socket: its lines parse as JSON (keys in any order).
        let lines = try d.raw(Array(#"{"request":"query","scope":"all"}"#.utf8) + [10])
        #expect(try lines.last.map { try JSONLines.decode(ControlReply.self, from: $0) } == .gathered(count: 1))
    }

    @Test func hostileRequestsGetAnErrorLineAndTheServerGoesOn() throws {
        let d = try Daemon()
        try d.save("x.txt", "x")
        let hostile: [[UInt8]] = [
            Array(#"{"request":"query""#.utf8) + [10],
            Array(#"{"request":"query","hidden":"yes"}"#.utf8) + [10],
            Array(#"{"request":7}"#.utf8) + [10],
            Array("{\"request\":\"query\",\"name\":\"\u{FFFD}\0\"}\n".utf8),
            Array(String(repeating: "[", count: 3000).utf8) + [10],
            [0xFF, 0xFE, 0x00, 0x7B, 10],
            Array("launch-missiles now\n".utf8),
            Array(repeating: UInt8(ascii: "{"), count: 1 << 20), // a huge line, never ended
            Array(repeating: UInt8(ascii: "x"), count: ControlRequest.maxLineBytes) + [10],
        ]
        for bytes in hostile {
            let lines = try d.raw(bytes)
            #expect(lines.count == 1, "\(bytes.prefix(40))")
            guard let line = lines.first else { continue }
            guard case .error(let message) = try JSONLines.decode(ControlReply.self, from: line) else {
                Issue.record("not an error: \(line)")
                continue
            }
            #expect(!message.isEmpty)
        }
        // A client that says nothing at all and leaves gets nothing, and harms nothing.
        #expect(try d.raw([]) == [])
        #expect(try d.replies(.query(ControlQuery())).last == .gathered(count: 1))
    }
}
