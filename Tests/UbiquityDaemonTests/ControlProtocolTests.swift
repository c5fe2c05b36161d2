import FoundationEssentials
import Testing
import UbiquityDaemon
import UbiquityStore

/// The control socket's wire format through Foundation's JSONEncoder / JSONDecoder
/// (JSONLines): every request and reply survives encode → decode, a line is one compact
/// JSON object, the word form of old clients is refused, and hostile request lines are
/// refused with an error, never a crash.
@Suite struct ControlProtocolTests {
    static let requests: [ControlRequest] = [
        .watchKeyValues,
        .query(ControlQuery()),
        .query(ControlQuery(scope: "documents", name: "*.tinypix", hidden: true, watch: true)),
        .query(ControlQuery(scope: "data", name: "naïve \"quoted\" name\n with = and %", hidden: false, watch: true)),
        .files(.download, path: "Documents/sub dir"),
        .files(.evict, path: ""),
        .files(.pin, path: "naïve = %/x"),
        .files(.unpin, path: "a"),
    ]

    static let file = ControlFile(path: "Documents/sub/p.dat", size: 4, mtimeMillis: 1_764_000_000_123,
                                  createdMillis: 1_763_000_000_000, state: "remote")

    static let replies: [ControlReply] = [
        .error("scope is documents, data or all"),
        .watching,
        .overflow,
        .gathered(count: 0),
        .gathered(count: 100_000),
        .file(file),
        .fileEvent(.added, path: file.path, file: file),
        .fileEvent(.conflict, path: "notes.txt", file: ControlFile(path: "notes.txt", size: 0, mtimeMillis: -1000, createdMillis: 0, state: "conflict")),
        .fileEvent(.removed, path: "Documents/a.txt", file: nil),
        .keyValueChanged(ControlKeyChange(key: "theme", type: "string", old: nil, new: AnyPropertyList(.string("dark")),
                                          deleted: false, device: DeviceID(hex: "00000000000000d1")!, name: "alpha", timeMillis: 1_764_000_000_000)),
        .keyValueChanged(ControlKeyChange(key: "gone", type: "integer", old: AnyPropertyList(.integer(-7)), new: nil,
                                          deleted: true, device: DeviceID(hex: "00000000000000d2")!, name: "", timeMillis: 0)),
        .keyValueChanged(ControlKeyChange(
            key: "all", type: "dictionary", old: AnyPropertyList(.array([.double(1.5), .bool(true), .date(1000), .data([0, 255])])),
            new: AnyPropertyList(.dictionary([("a", .array([])), ("b", .dictionary([])), ("c", .string("\u{1}\t/"))])),
            deleted: false, device: DeviceID(hex: "00000000000000d3")!, name: "beta", timeMillis: 42)),
        .progress(files: 3, of: 10, bytes: 1 << 20, ofBytes: 0),
        .result(path: "a/b.txt", result: "refused", bytes: 0, detail: "open for writing, or it has unsaved changes"),
        .finished(files: 10, bytes: 12_345, problems: 1),
        .file(ControlFile(path: "x", size: 9, mtimeMillis: 0, createdMillis: 0, state: "remote", downloaded: "not-downloaded")),
    ]

    @Test(arguments: requests) func requestRoundTrip(_ request: ControlRequest) throws {
        let line = try JSONLines.encode(request)
        #expect(!line.contains("\n"))
        #expect(try JSONLines.decode(ControlRequest.self, from: line) == request)
        #expect(try ControlRequest(line: line) == request)
        // Foundation's coders themselves, configured as they come.
        let data = try JSONEncoder().encode(request)
        #expect(try JSONDecoder().decode(ControlRequest.self, from: data) == request)
    }

    @Test(arguments: replies) func replyRoundTrip(_ reply: ControlReply) throws {
        let line = try JSONLines.encode(reply)
        #expect(!line.contains("\n"))
        #expect(try JSONLines.decode(ControlReply.self, from: line) == reply)
        let data = try JSONEncoder().encode(reply)
        #expect(try JSONDecoder().decode(ControlReply.self, from: data) == reply)
    }

    /// The word form daemons before JSON requests read is gone: such a line is refused, and
    /// the error says what a request is.
    @Test(arguments: ["watch-kv", "query scope=all hidden=0 watch=0", "query scope=documents name=%2A.txt hidden=1 watch=1",
                      "download path=Documents", "evict path="])
    func wordRequestIsRefused(_ line: String) {
        #expect {
            try ControlRequest(line: line)
        } throws: { error in
            (error as? ControlError)?.description
                == #"bad request: not a JSON object (a request is one JSON object per line, such as {"request":"watch-kv"})"#
        }
    }

    /// The spelling of a line: keys in sorted order, `/` as it is, no raw newline. Readers
    /// parse the JSON; this pins one spelling per value (what a daemon sends is stable).
    @Test func wireSpelling() throws {
        #expect(try JSONLines.encode(ControlReply.gathered(count: 3)) == #"{"count":3,"event":"gathered"}"#)
        #expect(try JSONLines.encode(ControlReply.watching) == #"{"event":"watching"}"#)
        #expect(try JSONLines.encode(ControlReply.error("too many connections")) == #"{"error":"too many connections"}"#)
        #expect(try JSONLines.encode(ControlReply.file(Self.file))
                == #"{"created":"2025-11-13T02:13:20.000Z","downloaded":"current","mtime":"2025-11-24T16:00:00.123Z","path":"Documents/sub/p.dat","size":4,"state":"remote"}"#)
        // A line from a daemon before files on demand (no "downloaded") still reads.
        #expect(try JSONLines.decode(ControlReply.self, from: #"{"path":"a","size":1,"mtime":"2025-11-24T16:00:00Z","created":"2025-11-24T16:00:00Z","state":"remote"}"#)
                == .file(ControlFile(path: "a", size: 1, mtimeMillis: 1_764_000_000_000, createdMillis: 1_764_000_000_000, state: "remote")))
        #expect(try JSONLines.encode(ControlReply.progress(files: 1, of: 2, bytes: 3, ofBytes: 4)) == #"{"bytes":3,"event":"progress","files":1,"of":2,"ofBytes":4}"#)
        #expect(try JSONLines.encode(ControlRequest.files(.evict, path: "a b/c")) == #"{"path":"a b/c","request":"evict"}"#)
        #expect(try JSONLines.encode(ControlRequest.query(ControlQuery(scope: "all", name: "*.txt", hidden: false, watch: true)))
                == #"{"hidden":false,"name":"*.txt","request":"query","scope":"all","watch":true}"#)
        #expect(try JSONLines.encode(ControlReply.fileEvent(.removed, path: "Documents/a.txt", file: nil))
                == #"{"event":"removed","path":"Documents/a.txt"}"#)
        #expect(try JSONLines.encode(Self.replies[9])
                == #"{"deleted":false,"device":"00000000000000d1","event":"changed","key":"theme","name":"alpha","new":"dark","time":"2025-11-24T16:00:00.000Z","type":"string"}"#)
        #expect(try JSONLines.encode(Self.replies[10])
                == #"{"deleted":true,"device":"00000000000000d2","event":"changed","key":"gone","name":"","old":-7,"time":"1970-01-01T00:00:00.000Z","type":"integer"}"#)
        #expect(try JSONLines.encode(ControlReply.error("a\nb")) == #"{"error":"a\nb"}"#)
    }

    /// A key-value change's values: data and dates as one-key objects; a double that is
    /// whole is spelled `2` in JSON and read back as a double because the type says so.
    @Test func keyValueValuesOverTheWire() throws {
        let change = ControlKeyChange(key: "k", type: "double", old: AnyPropertyList(.double(1)), new: AnyPropertyList(.double(2)),
                                      deleted: false, device: DeviceID(hex: "00000000000000d1")!, name: "", timeMillis: 0)
        let line = try JSONLines.encode(ControlReply.keyValueChanged(change))
        #expect(line.contains(#""new":2,"#) && line.contains(#""old":1,"#))
        #expect(try JSONLines.decode(ControlReply.self, from: line) == .keyValueChanged(change))
        let data = AnyPropertyList(.array([.data([0, 1]), .date(1_764_000_000_000), .dictionary([("a", .integer(1))])]))
        #expect(try JSONLines.encode(data) == #"[{"$data":"AAE="},{"$date":"2025-11-24T16:00:00.000Z"},{"a":1}]"#)
        #expect(try JSONLines.decode(AnyPropertyList.self, from: JSONLines.encode(data)) == data)
        for bad in [#"{"$data":"not base64"}"#, #"{"$date":"yesterday"}"#] {
            #expect(throws: DecodingError.self, "\(bad)") { try JSONLines.decode(AnyPropertyList.self, from: bad) }
        }
    }

    static let hostile: [String] = [
        "",
        " ",
        "{",
        #"{"request":"query""#,
        #"{"request":"query","scope":"#,
        #"{"request":"query"}}"#,
        #"{"request":5}"#,
        #"{"request":null}"#,
        #"{"request":"query","hidden":"yes"}"#,
        #"{"request":"query","watch":1}"#,
        #"{"request":"query","name":["*"]}"#,
        #"{"request":"query","scope":{"$data":"AAAA"}}"#,
        #"{"request":"drop-tables"}"#,
        #"{}"#,
        #"{"request":"\ud800"}"#,
        "[\"request\"]",
        "{\"request\":\"query\",\"name\":\"\u{0}\"}",
        "drop tables",
        "\u{FEFF}watch-kv",
    ]

    @Test(arguments: hostile) func hostileRequestIsAnError(_ line: String) {
        #expect(throws: ControlError.self) { try ControlRequest(line: line) }
    }

    /// Deep nesting and a huge line (kept out of the arguments above: they would be printed).
    @Test func hugeAndDeepRequestsAreErrors() {
        for line in [String(repeating: "[", count: 100_000), String(repeating: "{\"a\":", count: 10_000),
                     "{\"request\":\"" + String(repeating: "x", count: 1 << 20) + "\"}"] {
            #expect(throws: ControlError.self) { try ControlRequest(line: line) }
        }
    }

    @Test func hostileReplyIsADecodingError() {
        for line in [#"{"event":"gathered"}"#, #"{"event":"gathered","count":"3"}"#, #"{"path":"a"}"#,
                     #"{"event":"added","path":"a","state":"x"}"#, #"{"event":"exploded"}"#, #"{"path":"a","size":1,"mtime":"yesterday","created":"2025-11-24T16:00:00Z","state":"x"}"#,
                     #"{"event":"changed","key":"k"}"#, "[", "", #"{"error":false}"#,
                     #"{"event":"changed","key":"k","type":"string","deleted":true,"device":"D1","name":"","time":"1970-01-01T00:00:00.000Z"}"#] {
            #expect(throws: DecodingError.self, "\(line)") { try JSONLines.decode(ControlReply.self, from: line) }
        }
    }

    @Test func numbersOutOfRangeAreRefusedNotTrapped() throws {
        #expect(throws: EncodingError.self) { try JSONLines.encode([Double.nan]) }
        #expect(throws: DecodingError.self) { try JSONLines.decode(UInt8.self, from: "300") }
        #expect(throws: DecodingError.self) { try JSONLines.decode(Int.self, from: "1e400") }
        #expect(throws: DecodingError.self) { try JSONLines.decode(Int64.self, from: "9223372036854775808") }
        #expect(try JSONLines.decode([Int64].self, from: "[9223372036854775807]") == [Int64.max])
    }
}
