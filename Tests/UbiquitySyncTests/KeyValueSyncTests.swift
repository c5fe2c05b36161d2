import Foundation
import Glibc
import Synchronization
import Testing
import TestSupport
import UbiquityBacking
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

    /// Devices `a` and `b` over one backing directory; `a` set selectedColorIndex to 1 and
    /// `b` took it in.
    static func devicesSharingAKey(_ temp: TempDirectory) throws -> (SimDevice, SimDevice) {
        let backing = temp.path + "/backing"
        mkdir(backing, 0o755)
        let a = try SimDevice(name: "a", root: temp.path, backing: backing, clock: nowNanos)
        let b = try SimDevice(name: "b", root: temp.path, backing: backing, clock: nowNanos)
        try a.kvSet("selectedColorIndex", 1)
        a.cycle()
        b.cycle()
        #expect(b.keyValues()["selectedColorIndex"]?.hasPrefix("1\n") == true)
        return (a, b)
    }

    /// Two devices set the same key while one is cut off from the backing directory: once
    /// both sync, both show the same winner (the later stamp); deletes win the same way.
    @Test func concurrentSetsEndWithOneWinner() throws {
        let temp = TempDirectory(prefix: "ubiquity-kv-sync")
        defer { temp.cleanup() }
        let (a, b) = try Self.devicesSharingAKey(temp)
        unlink(b.link) // b is cut off
        try b.kvSet("selectedColorIndex", 2)
        try a.kvSet("selectedColorIndex", 3) // later: wins
        a.cycle()
        b.cycle()
        #expect(b.keyValues()["selectedColorIndex"]?.hasPrefix("2\n") == true)
        symlink(temp.path + "/backing", b.link)
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
    /// A crash (or a power loss) can take back the generation a publish took while its
    /// PUT landed and was read. The next session's publish must not reuse it: a reader
    /// does not read a generation it has read again, so the new entries would never reach
    /// it. It takes the next one after what the backing store holds.
    @Test func aGenerationLostInACrashIsNotReused() throws {
        let temp = TempDirectory(prefix: "ubiquity-kv-sync")
        defer { temp.cleanup() }
        let (a, b) = try Self.devicesSharingAKey(temp)
        // The crash: the store lost the generation; the next session's engine.
        try a.store.setSetting(SyncEngine.keyValueGenerationKey, "0")
        try a.store.commitBatch()
        let again = SyncEngine(store: a.fs.store, backing: DirectoryStore(root: a.link), options: SimDevice.alwaysPolling)
        try a.kvSet("selectedColorIndex", 2)
        try again.cycle(pushPull: true)
        #expect(try a.store.setting(SyncEngine.keyValueGenerationKey) == "2")
        b.cycle()
        #expect(b.keyValues()["selectedColorIndex"]?.hasPrefix("2\n") == true, "\(b.keyValues())")
    }
    /// Peers list `devices/` only when a segment comes, so a key-value file is followed
    /// by an empty segment. One whose PUT failed is owed: the next cycle sends it, and
    /// the peer then reads the new file.
    @Test func theSegmentAfterAKeyValueFileIsSentAgain() throws {
        let temp = TempDirectory(prefix: "ubiquity-kv-sync")
        defer { temp.cleanup() }
        let store = RecordingStore(MemoryStore())
        let a = try SimDevice(name: "a", root: temp.path, backing: store, clock: nowNanos, options: SimDevice.alwaysPolling)
        let b = try SimDevice(name: "b", root: temp.path, backing: store, clock: nowNanos, options: SimDevice.alwaysPolling)
        try a.kvSet("selectedColorIndex", 1)
        for _ in 0..<2 { a.cycle(); b.cycle() }
        #expect(b.keyValues()["selectedColorIndex"]?.hasPrefix("1\n") == true)
        store.setFault { op, key in op == .put && key.hasPrefix("log/") ? .before(.transient("injected")) : nil }
        try a.kvSet("selectedColorIndex", 2)
        #expect(throws: StoreError.self) { try a.engine.cycle(pushPull: true) }
        store.setFault(nil)
        #expect(try a.store.keyValues.unpublished() == nil, "the key-value file went out")
        a.cycle()
        b.cycle()
        #expect(b.keyValues()["selectedColorIndex"]?.hasPrefix("2\n") == true, "\(b.keyValues())")
    }
    /// When a key-value file's PUT goes out, what it depends on is committed: the
    /// generation it takes (else a batch that failed after it would give the generation
    /// back, and this session's next publish would reuse it), and the values it carries
    /// (in `kv.sqlite`). Read at the moment of the PUT from connections of their own.
    @Test func aPublishCommitsItsGenerationBeforeItsPut() throws {
        let temp = TempDirectory(prefix: "ubiquity-kv-sync")
        defer { temp.cleanup() }
        let store = RecordingStore(MemoryStore())
        let a = try SimDevice(name: "a", root: temp.path, backing: store, clock: nowNanos, options: SimDevice.alwaysPolling)
        let seen = Mutex<[String]>([])
        let directory = a.store.directory
        store.setFault { op, key in
            guard op == .put, key.contains("/keyvalue-") else { return nil }
            let generation = (try? SQLiteDatabase(path: directory + "/meta.sqlite", readOnly: true)).flatMap { meta in
                try? meta.rows("SELECT value FROM settings WHERE key = ?", [.text(SyncEngine.keyValueGenerationKey)]) { $0.text(0) }.first
            }
            let value = (try? SQLiteDatabase(path: directory + "/kv.sqlite", readOnly: true)).flatMap { kv in
                try? kv.rows("SELECT value FROM kv WHERE key = 'selectedColorIndex'", []) { String(decoding: $0.blob(0), as: UTF8.self) }.first
            }
            seen.withLock { $0.append("\(key.suffix(1)) \(generation ?? "none") \(value ?? "none")") }
            return nil
        }
        try a.kvSet("selectedColorIndex", 1)
        a.cycle()
        try a.kvSet("selectedColorIndex", 2)
        a.cycle()
        #expect(seen.withLock { $0 } == ["1 1 1\n", "2 2 2\n"])
    }

    /// The listing of this device's key-value files is the backing store's word: a file
    /// named with the last generation there is makes the publish fail with a reason,
    /// never trap (the next number does not exist). Removed, publishing goes on.
    @Test func aGenerationWithNoSuccessorIsRefused() throws {
        let temp = TempDirectory(prefix: "ubiquity-kv-sync")
        defer { temp.cleanup() }
        let (a, b) = try Self.devicesSharingAKey(temp)
        let planted = temp.path + "/backing/devices/\(a.store.deviceID.hex)/keyvalue-ffffffffffffffff"
        #expect(FileManager.default.createFile(atPath: planted, contents: Data("ubiquity-keyvalue 1\n".utf8)))
        let again = SyncEngine(store: a.fs.store, backing: DirectoryStore(root: a.link), options: SimDevice.alwaysPolling)
        try a.kvSet("selectedColorIndex", 2)
        #expect(throws: StoreError.self) { try again.cycle(pushPull: true) }
        unlink(planted)
        let later = SyncEngine(store: a.fs.store, backing: DirectoryStore(root: a.link), options: SimDevice.alwaysPolling)
        try later.cycle(pushPull: true)
        b.cycle()
        #expect(b.keyValues()["selectedColorIndex"]?.hasPrefix("2\n") == true, "\(b.keyValues())")
    }
}
