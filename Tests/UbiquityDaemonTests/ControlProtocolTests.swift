import Testing
import UbiquityDaemon
import UbiquityStore

/// The control socket's wire format through Codable (JSONLine): every request and reply
/// survives encode → decode, the bytes are the ones scripts match (the format the
/// hand-built JSON had), and hostile request lines are refused with an error, never a crash.
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
        let line = try JSONLine.encode(request)
        #expect(!line.contains("\n"))
        #expect(try JSONLine.decode(ControlRequest.self, from: line.utf8) == request)
        #expect(try ControlRequest(line: line) == request)
        // The word form older daemons speak reads back the same.
        #expect(try ControlRequest(line: request.wordLine) == request)
    }

    @Test(arguments: replies) func replyRoundTrip(_ reply: ControlReply) throws {
        let line = try JSONLine.encode(reply)
        #expect(!line.contains("\n"))
        #expect(try JSONLine.decode(ControlReply.self, from: line.utf8) == reply)
    }

    /// Byte for byte what the daemon sent before Codable (t-query.sh and scripts match
    /// these as text).
    @Test func wireFormatIsUnchanged() throws {
        #expect(try JSONLine.encode(ControlReply.gathered(count: 3)) == #"{"event":"gathered","count":3}"#)
        #expect(try JSONLine.encode(ControlReply.watching) == #"{"event":"watching"}"#)
        #expect(try JSONLine.encode(ControlReply.error("too many connections")) == #"{"error":"too many connections"}"#)
        #expect(try JSONLine.encode(ControlReply.file(Self.file))
                == #"{"path":"Documents/sub/p.dat","size":4,"mtime":"2025-11-24T16:00:00.123Z","created":"2025-11-13T02:13:20.000Z","state":"remote","downloaded":"current"}"#)
        // A line from a daemon before files on demand (no "downloaded") still reads.
        #expect(try JSONLine.decode(ControlReply.self, from: #"{"path":"a","size":1,"mtime":"2025-11-24T16:00:00Z","created":"2025-11-24T16:00:00Z","state":"remote"}"#.utf8)
                == .file(ControlFile(path: "a", size: 1, mtimeMillis: 1_764_000_000_000, createdMillis: 1_764_000_000_000, state: "remote")))
        #expect(try JSONLine.encode(ControlReply.progress(files: 1, of: 2, bytes: 3, ofBytes: 4)) == #"{"event":"progress","files":1,"of":2,"bytes":3,"ofBytes":4}"#)
        #expect(try JSONLine.encode(ControlRequest.files(.evict, path: "a b")) == #"{"request":"evict","path":"a b"}"#)
        #expect(try JSONLine.encode(ControlReply.fileEvent(.added, path: Self.file.path, file: Self.file))
                .hasPrefix(#"{"event":"added","path":"Documents/sub/p.dat","size":4,"#))
        #expect(try JSONLine.encode(ControlReply.fileEvent(.removed, path: "Documents/a.txt", file: nil))
                == #"{"event":"removed","path":"Documents/a.txt"}"#)
        #expect(try JSONLine.encode(Self.replies[9])
                == #"{"event":"changed","key":"theme","type":"string","new":"dark","deleted":false,"device":"00000000000000d1","name":"alpha","time":"2025-11-24T16:00:00.000Z"}"#)
        #expect(try JSONLine.encode(Self.replies[10])
                == #"{"event":"changed","key":"gone","type":"integer","old":-7,"deleted":true,"device":"00000000000000d2","name":"","time":"1970-01-01T00:00:00.000Z"}"#)
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
        #"{"request":"query","request":"query"}"#,
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
            #expect(throws: DecodingError.self, "\(line)") { try JSONLine.decode(ControlReply.self, from: line.utf8) }
        }
    }

    @Test func integersOutOfRangeAreRefusedNotTrapped() throws {
        #expect(throws: EncodingError.self) { try JSONLine.encode([UInt64.max]) }
        #expect(throws: EncodingError.self) { try JSONLine.encode([Double.nan]) }
        #expect(throws: DecodingError.self) { try JSONLine.decode(UInt8.self, from: "300".utf8) }
        #expect(throws: DecodingError.self) { try JSONLine.decode(Int.self, from: "1e400".utf8) }
        #expect(try JSONLine.decode([Int64].self, from: "[9223372036854775807]".utf8) == [Int64.max])
    }
}
