import Testing
import TestSupport
import UbiquitySystem
@testable import UbiquityStore
@testable import UbiquitySync

/// Journal lines are untrusted input from a shared directory: every hostile or damaged
/// line must be rejected with a reason, never crash, never name a path outside the tree.
@Suite struct RecordCodecTests {
    static let device = DeviceID(hex: "0123456789abcdef")!

    static func sample(path: String = "notes/a.txt") -> SyncRecord {
        var chunks = ChunkList()
        chunks.append(ChunkID(hashing: Array("hello".utf8)), size: 5)
        return SyncRecord(id: VersionID(hex: String(repeating: "a", count: 32))!, node: .file(FileID(hex: String(repeating: "b", count: 32))!),
                          kind: .file, parents: [VersionID(hex: String(repeating: "c", count: 32))!], deviceID: device, deviceName: "lap top, 1",
                          committed: 1, mtime: 2, mode: 0o644, isTombstone: false, isMeta: false, path: path,
                          chunks: chunks, xattrs: [XattrEntry(name: "color:x", value: [0, 255])])
    }

    static func decode(_ line: String, device: DeviceID = device) -> Result<SyncRecord, RecordCodec.Rejection> {
        RecordCodec.decode(Array(line.utf8.dropLast())[...], journalDevice: device)
    }

    /// A line with a correct checksum around any body (what a hostile writer can make).
    static func signed(_ body: String) -> String {
        "U1 \(RecordCodec.sha256Hex(Array(body.utf8))) \(body)\n"
    }

    /// Hex is the encoding of every id and hash on disk: the contiguous fast path and the
    /// generic one must give the same digits, and decode must invert both.
    @Test func hexEncodesEveryByteValue() {
        let all = (0...255).map { UInt8($0) }
        let expected = all.map { String($0, radix: 16) }.map { $0.count == 1 ? "0" + $0 : $0 }.joined()
        #expect(Hex.encode(all) == expected)
        #expect(Hex.encode(all.lazy.map { $0 }) == expected) // not contiguous
        #expect(Hex.encode(all[10..<12]) == "0a0b")
        #expect(Hex.encode([UInt8]()) == "")
        #expect(Hex.decode(expected) == all)
        #expect(RecordCodec.sha256Hex(Array("abc".utf8)) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
    }

    @Test func roundTrips() throws {
        for record in [Self.sample(), Self.sample(path: "ünï cødé/ with spaces %20.txt")] {
            let decoded = try Self.decode(RecordCodec.encode(record)).get()
            #expect(decoded == record)
        }
        var link = Self.sample(path: "l")
        link.kind = .symlink; link.node = .symlink("l"); link.chunks = ChunkList(); link.target = "../x y"; link.xattrs = []
        #expect(try Self.decode(RecordCodec.encode(link)).get() == link)
        link.isTombstone = true; link.target = nil
        #expect(try Self.decode(RecordCodec.encode(link)).get() == link)
    }

    /// Format 3: small chunks travel inside the record (`inline=<index>:<hex>`), checked
    /// against their ids; format 4 writes them as the chunk item itself (`=<hex>`, the id
    /// is their hash). A reader takes both.
    @Test func inlineChunksRoundTripAndAreChecked() throws {
        var record = Self.sample()
        let hello = Array("hello".utf8)
        let id = ChunkID(hashing: hello)
        record.inline[id] = hello
        let line = RecordCodec.encode(record)
        #expect(line.contains(" chunks==68656c6c6f "))
        #expect(!line.contains(id.hex))
        let decoded = try Self.decode(line).get()
        #expect(decoded == record)
        // Store format 14: a chunk of at most 64 bytes lands in the list itself.
        #expect(decoded.chunks.inline == [id: hello] && decoded.chunks.chunks.isEmpty)
        // A list keeping it inline (a version row) writes it the same way.
        var fromRow = Self.sample()
        fromRow.chunks = ChunkList()
        fromRow.chunks.appendInline(hello)
        #expect(RecordCodec.encode(fromRow) == line)
        let body = String(line.dropFirst(36).dropLast())
        for bad in ["==68656c6c", "==zz", "==", "==" + String(repeating: "00", count: 1025), "==6", "=68656c6c6f",
                    "==68656c6c6f,\(id.hex):4"] { // the same chunk again with another size
            let changed = body.split(separator: " ").map { $0.hasPrefix("chunks=") ? "chunks" + bad : String($0) }.joined(separator: " ")
            guard case .failure = Self.decode(Self.signed(changed)) else {
                Issue.record("accepted chunks\(bad)")
                continue
            }
        }
        // Format 3's inline key.
        let format3 = body.split(separator: " ").map { $0.hasPrefix("chunks=") ? "chunks=\(id.hex):5" : String($0) }.joined(separator: " ")
        #expect(try Self.decode(Self.signed(format3 + " inline=0:68656c6c6f")).get().chunks.inline == [id: hello])
        for (bad, why) in [("inline=0:68656c6c6e", "do not match"), ("inline=1:68656c6c6f", "bad inline"),
                           ("inline=0:68656c6c", "bad inline"), ("inline=0:zz", "bad inline"),
                           ("inline=0:68656c6c6f,0:68656c6c6f", "bad inline")] {
            let result = Self.decode(Self.signed(format3 + " " + bad))
            guard case .failure(let rejection) = result else {
                Issue.record("accepted \(bad)")
                continue
            }
            #expect(rejection.description.contains(why), "\(bad): \(rejection)")
        }
    }

    /// Format 4 leaves out keys at their defaults (kind=file, tomb=0, meta=0, the device
    /// of the journal, a linear context) and checks 128 bits of SHA-256: a tiny file's
    /// version is about 300 bytes.
    @Test func format4LinesAreShort() throws {
        var record = Self.sample()
        record.xattrs = []
        let hello = Array("hello".utf8)
        record.inline[ChunkID(hashing: hello)] = hello
        record.lineage.insert(device: Self.device, counter: 1)
        record.lineage.insert(device: Self.device, counter: 2)
        record.lineage.dot = 3
        let line = RecordCodec.encode(record)
        for key in [" kind=", " tomb=", " meta=", " device=", " context=", " inline="] {
            #expect(!line.contains(key), "\(key) in \(line)")
        }
        #expect(line.hasPrefix("U2 ") && line.contains(" dot=3"))
        #expect(line.utf8.count < 300, "\(line.utf8.count) bytes")
        #expect(try Self.decode(line).get() == record)
        record.isTombstone = true; record.chunks = ChunkList(); record.inline = [:]
        #expect(try Self.decode(RecordCodec.encode(record)).get() == record)
    }

    /// Format 4: the record's dot and context travel (`dot`, `context`); a record without
    /// them is an older one; a bad one, or one whose context holds its own dot, is refused.
    @Test func lineageRoundTripsAndIsChecked() throws {
        var record = Self.sample()
        record.lineage.insert(device: DeviceID(hex: "00000000000000aa")!, counter: 3)
        record.lineage.insert(device: Self.device, counter: 1)
        record.lineage.insert(device: Self.device, counter: 4)
        record.lineage.dot = 5
        let line = RecordCodec.encode(record)
        #expect(line.contains(" dot=5 context=00000000000000aa:3:1-2,\(Self.device):4:2-3"))
        #expect(try Self.decode(line).get() == record)
        #expect(try Self.decode(RecordCodec.encode(Self.sample())).get().lineage.isEmpty)
        let body = String(line.dropFirst(36).dropLast())
        for (key, bad) in [("dot", "dot=0"), ("dot", "dot=x"), ("dot", "dot=4"), ("context", "context=zz:1"), ("dot", "noise=1")] {
            let changed = body.split(separator: " ").map { $0.hasPrefix(key + "=") ? bad : String($0) }.joined(separator: " ")
            guard case .failure = Self.decode(Self.signed(changed)) else {
                Issue.record("accepted \(bad)")
                continue
            }
        }
    }

    @Test func holesRoundTrip() throws {
        var record = Self.sample()
        var chunks = ChunkList()
        chunks.appendHole(1 << 50)
        chunks.append(ChunkID(hashing: Array("x".utf8)), size: 1)
        chunks.appendHole(7)
        record.chunks = chunks
        let line = RecordCodec.encode(record)
        #expect(line.contains("chunks=hole:1125899906842624,"))
        #expect(line.utf8.count < 600)
        #expect(try Self.decode(line).get() == record)
        let hole = "hole:\(1 << 62)"
        let base = "id=\(String(repeating: "a", count: 32)) kind=file node=\(String(repeating: "b", count: 32)) parents= device=\(Self.device) name=x committed=1 mtime=1 mode=420 tomb=0 path=p"
        for (chunkText, size) in [("hole:0", "0"), ("hole:-5", "-5"), ("\(hole),\(hole)", "0"), ("hole:\(Int64.max)", "\(Int64.max)"),
                                  ("hole:99999999999999999999", "1"), ("hole:12:3", "12")] {
            guard case .failure = Self.decode(Self.signed(base + " size=\(size) chunks=\(chunkText)")) else {
                Issue.record("accepted chunks=\(chunkText)")
                continue
            }
        }
        #expect(try Self.decode(Self.signed(base + " size=\(1 << 62) chunks=\(hole)")).get().chunks.totalSize == 1 << 62)
    }

    /// Names are bytes: any byte string survives string form and back, and travels.
    @Test(arguments: [31, UInt64.random(in: 100...UInt64.max)])
    func namesOfAnyBytesRoundTrip(seed: UInt64) throws {
        var gen = SplitMix64(seed: seed)
        let special: [[UInt8]] = [[0xFF], [0xC3], [0xF4, 0x8F, 0xBF, 0xBF], [0xF4, 0x8F, 0xBE, 0x80], [0xED, 0xA0, 0x80], Array("é".utf8), [0x0A], [0xF4, 0x80, 0x80, 0x80], Array("\u{FFFD}".utf8)]
        for i in 0..<2000 {
            var bytes: [UInt8] = []
            for _ in 0..<gen.int(1..<12) {
                if gen.int(0..<3) == 0 { bytes += special[gen.int(0..<special.count)] }
                else { bytes.append(UInt8(gen.int(1..<256))) }
            }
            bytes = bytes.filter { $0 != UInt8(ascii: "/") }
            if bytes.isEmpty || bytes == [0x2E] || bytes == [0x2E, 0x2E] { continue }
            let name = NameCodec.string(bytes)
            #expect(NameCodec.bytes(name) == bytes, "seed \(seed) #\(i): \(bytes)")
            #expect(bytes.withUnsafeBytes { NameCodec.string($0) } == name, "seed \(seed) #\(i): \(bytes)")
            #expect(NameCodec.byteCount(name) == bytes.count, "seed \(seed) #\(i)")
            let record = Self.sample(path: "dir/" + name)
            if LocalOnly.contains(record.path) { continue } // editor scratch names never travel
            #expect(try Self.decode(RecordCodec.encode(record)).get().path == record.path, "seed \(seed) #\(i): \(bytes)")
        }
    }

    @Test func rejectsDamagedLines() throws {
        let line = RecordCodec.encode(Self.sample())
        var flipped = Array(line.utf8)
        flipped[80] ^= 1
        let damaged = [
            "", "garbage\n", String(line.prefix(40)) + "\n", String(decoding: flipped, as: UTF8.self),
            line.replacingOccurrences("U2 ", "U1 "), line.replacingOccurrences("U2 ", "U3 "),
        ]
        for bad in damaged {
            guard case .failure = Self.decode(bad) else { Issue.record("accepted \(bad.prefix(60))"); continue }
        }
        // Another device's record in this journal: impersonation.
        let body = String(line.dropFirst(36).dropLast()) + " device=\(Self.device)"
        #expect(try Self.decode(Self.signed(body)).get() == Self.sample())
        guard case .failure = Self.decode(Self.signed(body), device: DeviceID(hex: "fedcba9876543210")!) else { Issue.record("accepted another device's record"); return }
    }

    @Test func rejectsHostilePaths() {
        let hostile = ["..", "../escape", "a/../../b", "/etc/passwd", "a//b", "a/", ".", "./a", ".versions/x", ".conflicts",
                       "a\u{0}b", String(repeating: "n", count: 256), String(repeating: "a/", count: 2100) + "a",
                       "x.nosync/f", "f.swp", "dir/.#lock"]
        for path in hostile {
            guard case .failure = Self.decode(RecordCodec.encode(Self.sample(path: path))) else {
                Issue.record("accepted path \(path.prefix(40))"); continue
            }
        }
        // Raw bytes that are not UTF-8, and broken escapes, even with a valid checksum.
        let id = String(repeating: "a", count: 32), node = String(repeating: "b", count: 32)
        for path in ["%FF%FE", "%2", "a%2Fb%00", "%2E%2E"] {
            let body = "id=\(id) kind=file node=\(node) parents= device=\(Self.device) name=x committed=1 mtime=1 mode=420 tomb=0 path=\(path) size=0 chunks="
            guard case .failure = Self.decode(Self.signed(body)) else { Issue.record("accepted raw path \(path)"); continue }
        }
    }

    @Test func rejectsBadFields() {
        let id = String(repeating: "a", count: 32), node = String(repeating: "b", count: 32)
        let base = "id=\(id) kind=file node=\(node) parents= device=\(Self.device) name=x committed=1 mtime=1 tomb=0 path=a"
        let bodies = [
            base + " mode=420 size=6 chunks=" + String(repeating: "0", count: 64) + ":5",      // sizes do not add up
            base + " mode=99999 size=0 chunks=",                                                 // mode out of range
            base + " mode=420 size=0 chunks= mode=420",                                          // repeated key
            base.replacingOccurrences("kind=file", "kind=socket") + " mode=420 size=0 chunks=",   // unknown kind
            base + " mode=420 size=5000000 chunks=" + String(repeating: "0", count: 64) + ":5000000", // chunk too big
            base.replacingOccurrences("parents=", "parents=zz") + " mode=420 size=0 chunks=",     // bad parent id
            base + " mode=420 size=0",                                                           // missing key
        ]
        for body in bodies {
            guard case .failure = Self.decode(Self.signed(body)) else { Issue.record("accepted \(body.suffix(60))"); continue }
        }
        // A fuzz pass: random bytes and random truncations never crash and never pass.
        var rng = SplitMix64(seed: 7)
        let good = Array(RecordCodec.encode(Self.sample()).utf8)
        for _ in 0..<2000 {
            // Without its newline the whole line is valid: cut at least one more byte, or
            // change at least one.
            let cut = Int(rng.next() % UInt64(good.count))
            var bytes = Array(good.prefix(cut))
            let changes = cut >= good.count - 1 ? 1 + Int(rng.next() % 3) : Int(rng.next() % 4)
            for _ in 0..<changes where !bytes.isEmpty { bytes[Int(rng.next() % UInt64(bytes.count))] ^= UInt8(1 + rng.next() % 255) }
            if case .success = RecordCodec.decode(bytes[...], journalDevice: Self.device) {
                Issue.record("accepted a damaged line")
            }
        }
    }
}

extension String {
    func replacingOccurrences(_ target: String, _ replacement: String) -> String {
        split(separator: target, omittingEmptySubsequences: false).joined(separator: replacement)
    }
}
