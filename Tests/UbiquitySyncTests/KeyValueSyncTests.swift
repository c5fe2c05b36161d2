import Glibc
import Testing
import TestSupport
import UbiquitySystem
@testable import UbiquityFS
@testable import UbiquityStore
@testable import UbiquitySync

/// The key-value files in the backing directory: untrusted input like journals (every bad
/// line rejected with a reason, never half-applied), and two devices that set the same
/// key while one is cut off end with the same winner.
@Suite struct KeyValueSyncTests {
    static let device = DeviceID(hex: "0123456789abcdef")!

    @Test func filesRoundTripAndBadLinesAreRejected() throws {
        let entries = [
            KVEntry(key: "a b/%", type: .string, value: Array("x\ny".utf8), stamp: KVStamp(time: 5, device: Self.device, deviceName: "lap top"),
                    isTombstone: false),
            KVEntry(key: "gone", type: .integer, value: [], stamp: KVStamp(time: 6, device: Self.device, deviceName: "lap top"),
                    isTombstone: true),
        ]
        let bytes = KeyValueCodec.encode(entries)
        let (decoded, rejected) = KeyValueCodec.decode(bytes, device: Self.device)
        #expect(rejected.isEmpty)
        #expect(decoded == entries)
        #expect(decoded.first?.stamp.deviceName == "lap top")
        // Entries are the file's device's, whatever a line says.
        let other = DeviceID(hex: "ffffffffffffffff")!
        #expect(KeyValueCodec.decode(bytes, device: other).entries.allSatisfy { $0.stamp.device == other })

        // One byte of the first entry's line changed ("type=string" -> "type=strinG").
        var changed = bytes
        let needle = Array("type=string".utf8)
        let at = try #require((0...(bytes.count - needle.count)).first { Array(bytes[$0..<$0 + needle.count]) == needle })
        changed[at + needle.count - 1] = UInt8(ascii: "G")
        let damaged = KeyValueCodec.decode(changed, device: Self.device)
        #expect(damaged.entries.count == 1 && damaged.rejected == ["line 2: checksum mismatch"])
        #expect(KeyValueCodec.decode(Array("ubiquity-keyvalue 2\n".utf8), device: Self.device).rejected == ["not a key-value file of format 1"])
        let torn = KeyValueCodec.decode(Array(bytes.dropLast(3)), device: Self.device)
        #expect(torn.entries.count == 1 && torn.rejected.count == 2) // no final newline, and the torn line
        for body in ["key=a type=string stamp=0 value=41", "key=a type=nope stamp=1 value=41", "key=a type=string stamp=1 value=4",
                     "key=a type=string stamp=1 tomb=1 value=41", "key=a key=b type=string stamp=1 value=41", "type=string stamp=1"] {
            let line = "K1 \(RecordCodec.checksum(Array(body.utf8), hexDigits: 32)) \(body)\n"
            let result = KeyValueCodec.decode(Array((KeyValueCodec.header + line).utf8), device: Self.device)
            #expect(result.entries.isEmpty && result.rejected.count == 1, "\(body)")
        }
    }

    /// Two devices set the same key while one is cut off from the backing directory: once
    /// both sync, both show the same winner (the later stamp); deletes win the same way.
    @Test func concurrentSetsEndWithOneWinner() throws {
        let temp = TempDirectory(prefix: "ubiquity-kv-sync")
        defer { temp.cleanup() }
        let backing = temp.path + "/backing"
        mkdir(backing, 0o755)
        let a = try SimDevice(name: "a", root: temp.path, backing: backing, clock: nowNanos)
        let b = try SimDevice(name: "b", root: temp.path, backing: backing, clock: nowNanos)
        try a.kvSet("selectedColorIndex", 1)
        a.cycle()
        b.cycle()
        #expect(b.keyValues()["selectedColorIndex"]?.hasPrefix("1\n") == true)
        unlink(b.link) // b is cut off
        try b.kvSet("selectedColorIndex", 2)
        try a.kvSet("selectedColorIndex", 3) // later: wins
        a.cycle()
        b.cycle()
        #expect(b.keyValues()["selectedColorIndex"]?.hasPrefix("2\n") == true)
        symlink(backing, b.link)
        for _ in 0..<2 { b.cycle(); a.cycle() }
        #expect(a.keyValues() == b.keyValues())
        #expect(a.keyValues()["selectedColorIndex"]?.hasPrefix("3\n") == true)
        // A delete wins the same way, and a key set again after it comes back.
        try b.fs.unlink(parent: KeyValueDoor.root, name: "selectedColorIndex")
        b.cycle(); a.cycle()
        #expect(a.keyValues().isEmpty && b.keyValues().isEmpty)
        try a.kvSet("selectedColorIndex", 0)
        a.cycle(); b.cycle()
        #expect(b.keyValues()["selectedColorIndex"]?.hasPrefix("0\n") == true)
    }
}
