import Testing
import UbiquitySystem
@testable import UbiquityStore
@testable import UbiquitySync

/// The exact bytes of a journal line: every device decodes what every other one wrote, so
/// a faster encoder must write the lines the format fixes, field for field (these were
/// written by the encoder that built each field as a string and joined them).
@Suite struct RecordLineTests {
    static let device = DeviceID(hex: "0123456789abcdef")!
    static let other = DeviceID(hex: "fedcba9876543210")!

    static func id(_ c: Character) -> VersionID { VersionID(hex: String(repeating: c, count: 32))! }

    /// Records that use every field and every rule for leaving one out.
    static var records: [SyncRecord] {
        var plain = SyncRecord(id: id("a"), node: .file(FileID(hex: String(repeating: "b", count: 32))!), kind: .file,
                               parents: [id("c"), id("d")], deviceID: device, deviceName: "lap top, 1 ü",
                               committed: 1_796_166_425_758_259_959, mtime: -5, mode: 0o100644, isTombstone: false, isMeta: false,
                               path: "notes/ä b%c/x.txt")
        let big = ChunkID(hashing: Array("a chunk kept in a pack".utf8))
        let placed = ChunkID(hashing: Array("a chunk kept elsewhere".utf8))
        let small = (0..<100).map { UInt8($0 * 7 & 0xff) }
        plain.chunks.append(big, size: 70_000)
        plain.chunks.appendHole(4096)
        plain.chunks.append(ChunkID(hashing: small), size: small.count)
        plain.inline[ChunkID(hashing: small)] = small
        plain.chunks.append(placed, size: 9)
        plain.places[placed] = ChunkPlace(pack: String(repeating: "9", count: 32), offset: 123_456)
        plain.chunks.append(big, size: 70_000) // again: no bytes or place the second time
        plain.chunks.appendInline([0, 1, 254, 255])
        plain.xattrs = [XattrEntry(name: "color:x y", value: [0, 255]), XattrEntry(name: "z", value: [])]
        plain.lineage.dot = 7
        plain.lineage.insert(device: device, counter: 6)
        plain.lineage.insert(device: other, counter: 3)

        var linear = plain
        linear.xattrs = []; linear.inline = [:]; linear.places = [:]; linear.isMeta = true
        linear.lineage = Lineage(); linear.lineage.dot = 3; linear.lineage.context = Lineage.linear(device: device, dot: 3)

        var directory = SyncRecord(id: id("e"), node: .directory("dir/sub"), kind: .directory, parents: [], deviceID: device,
                                   deviceName: "d", committed: 2, mtime: 3, mode: 0o40755, isTombstone: true, isMeta: false, path: "dir/sub")
        directory.lineage.dot = 1

        let link = SyncRecord(id: id("f"), node: .symlink("l"), kind: .symlink, parents: [id("a")], deviceID: device,
                              deviceName: "d", committed: 4, mtime: 5, mode: 0o777, isTombstone: false, isMeta: false,
                              path: "l", target: "../x y/ü")
        return [plain, linear, directory, link]
    }

    @Test func linesAreTheFormatsBytes() throws {
        for (record, expected) in zip(Self.records, Self.lines) {
            let line = RecordCodec.encode(record)
            #expect(line == expected)
            let decoded = try RecordCodec.decode(Array(line.utf8.dropLast())[...], journalDevice: Self.device).get()
            #expect(RecordCodec.encode(decoded) == expected)
        }
    }

    static let lines: [String] = [
        "U2 71625906b419f652a9f8057d97b696bb id=aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
            + " node=bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
            + " parents=cccccccccccccccccccccccccccccccc,dddddddddddddddddddddddddddddddd"
            + " name=lap%20top%2C%201%20%C3%BC committed=1796166425758259959 mtime=-5 mode=420"
            + " path=notes/%C3%A4%20b%25c/x.txt size=144209"
            + " chunks=274de0203aba35b769a85f876cf476709b14817be0847151571d2f904ad89831:70000,hole:4096,=00070e151c"
            + "232a31383f464d545b626970777e858c939aa1a8afb6bdc4cbd2d9e0e7eef5fc030a11181f262d343b424950575e656c737a"
            + "81888f969da4abb2b9c0c7ced5dce3eaf1f8ff060d141b222930373e454c535a61686f767d848b9299a0a7aeb5,24f5234c3"
            + "e697095a36ab23e45ef6fadccea2adce345340040b9f29afe5cce84:9@99999999999999999999999999999999:123456,27"
            + "4de0203aba35b769a85f876cf476709b14817be0847151571d2f904ad89831:70000,=0001feff"
            + " xattrs=color%3Ax%20y:00ff,z: dot=7 context=0123456789abcdef:6:1-5,fedcba9876543210:3:1-2\n",
        "U2 e0f678968d789a10f25c6eea9d3f9a78 id=aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
            + " node=bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
            + " parents=cccccccccccccccccccccccccccccccc,dddddddddddddddddddddddddddddddd"
            + " name=lap%20top%2C%201%20%C3%BC committed=1796166425758259959 mtime=-5 mode=420"
            + " path=notes/%C3%A4%20b%25c/x.txt meta=1 size=144209"
            + " chunks=274de0203aba35b769a85f876cf476709b14817be0847151571d2f904ad89831:70000,hole:4096,56fee4b12b2"
            + "80ea1e7c1b550002bb18b342ccbd7229cd4b147ea07aa1a691294:100,24f5234c3e697095a36ab23e45ef6fadccea2adce3"
            + "45340040b9f29afe5cce84:9,274de0203aba35b769a85f876cf476709b14817be0847151571d2f904ad89831:70000,=000"
            + "1feff dot=3\n",
        "U2 117caa8ff8c0d42dd13a88afd9149c68 id=eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee kind=dir parents= name=d"
            + " committed=2 mtime=3 mode=493 tomb=1 path=dir/sub dot=1\n",
        "U2 f975dd9a015d2a5d62cbfcd76e809c19 id=ffffffffffffffffffffffffffffffff kind=link"
            + " parents=aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa name=d committed=4 mtime=5 mode=511 path=l"
            + " target=../x%20y/%C3%BC\n",
    ]
}
