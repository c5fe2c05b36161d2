import Glibc
import Testing
import TestSupport
import UbiquityBacking
import UbiquitySystem
@testable import UbiquityFS
@testable import UbiquityStore
@testable import UbiquitySync

/// A segment's name is reserved in the store (setting `log_reserved`) before its PUT
/// (docs/FORMAT.md, "Writing"): after a crash, or an answer lost, the next open of the
/// log looks whether it landed. If it did, its records are out and its seq is not written
/// again; if not, it is written with the same seq. No seq is ever skipped or written twice.
@Suite struct SegmentRecoveryTests {
    /// Every seq of `device`'s segments in the log, in order, repeats included.
    static func seqs(_ store: any BackingStore, _ device: DeviceID) -> [UInt64] {
        store.keys("log/").compactMap { SegmentLog.SegmentName(key: BackingKey(checked: $0)) }
            .filter { $0.device == device }.map(\.seq).sorted()
    }

    static func setting(_ d: SimDevice, _ key: String) throws -> String? {
        try d.fs.withMetaLock { (_, store) throws(StoreError) in try store.setting(key) }
    }

    /// Records `d` has made and not sent, as lines of a segment (small chunks inline).
    static func pendingLines(_ d: SimDevice) throws -> (ids: [VersionID], bytes: [UInt8]) {
        try d.engine.cycle(pushPull: false)
        let records = try d.fs.withMetaLock { (_, store) throws(StoreError) in try store.pendingUploads(limit: 1000) }
        var bytes: [UInt8] = []
        for var record in records {
            for (id, _) in record.chunks.chunks { record.inline[id] = try d.fs.chunks.read(id) }
            bytes += Array(RecordCodec.encode(record).utf8)
        }
        return (records.map(\.id), bytes)
    }

    @Test func aReservedSegmentThatLandedIsNotWrittenAgain() throws {
        let temp = TempDirectory()
        defer { temp.cleanup() }
        let memory = MemoryStore()
        let options = SimDevice.alwaysPolling
        let a = try SimDevice(name: "a", root: temp.path, backing: memory, clock: nowNanos, options: options)
        let me = a.store.deviceID
        try a.save("one.txt", "1")
        try a.engine.cycle(pushPull: true)
        #expect(Self.seqs(memory, me) == [1])
        // A push that stopped after its PUT: the segment is there, the name reserved, the
        // records not marked.
        try a.save("two.txt", "2")
        try a.save("three.txt", "3")
        let (ids, bytes) = try Self.pendingLines(a)
        #expect(ids.count == 2)
        let name = SegmentLog.SegmentName(time: Int64(time(nil)) * 1000, device: me, seq: 2)
        try memory.put(name.key, bytes, ifAbsent: true)
        try a.fs.withMetaLock { (_, store) throws(StoreError) in try store.setSetting(SyncEngine.reservedKey, "\(name.time)-2") }

        // The next session finds it: its records are out, seq 2 is not written again.
        let again = SyncEngine(store: a.fs.store, backing: memory, options: options)
        try again.cycle(pushPull: true)
        #expect(a.store.pendingUploadCount == 0)
        #expect(Self.seqs(memory, me) == [1, 2])
        #expect(try memory.get(name.key) == bytes)
        #expect(try Self.setting(a, SyncEngine.seqKey) == "2" && Self.setting(a, SyncEngine.reservedKey) == "")
        try a.save("four.txt", "4")
        try again.cycle(pushPull: true)
        #expect(Self.seqs(memory, me) == [1, 2, 3])

        let b = try SimDevice(name: "b", root: temp.path, backing: memory, clock: nowNanos, options: options)
        b.cycle()
        #expect(try b.tree() == ["one.txt": "file 1", "two.txt": "file 2", "three.txt": "file 3", "four.txt": "file 4"])
    }

    @Test func aReservedSegmentThatDidNotLandIsWrittenWithItsSeq() throws {
        let temp = TempDirectory()
        defer { temp.cleanup() }
        let memory = MemoryStore()
        let options = SimDevice.alwaysPolling
        let a = try SimDevice(name: "a", root: temp.path, backing: memory, clock: nowNanos, options: options)
        let me = a.store.deviceID
        try a.save("one.txt", "1")
        try a.engine.cycle(pushPull: true)
        try a.save("two.txt", "2")
        try a.engine.cycle(pushPull: false)
        // Reserved, then the process died before the PUT.
        let t = Int64(time(nil)) * 1000 - 5000
        try a.fs.withMetaLock { (_, store) throws(StoreError) in try store.setSetting(SyncEngine.reservedKey, "\(t)-2") }
        let again = SyncEngine(store: a.fs.store, backing: memory, options: options)
        try again.cycle(pushPull: true)
        #expect(Self.seqs(memory, me) == [1, 2])
        #expect(a.store.pendingUploadCount == 0)
        #expect(try Self.setting(a, SyncEngine.reservedKey) == "")
        let b = try SimDevice(name: "b", root: temp.path, backing: memory, clock: nowNanos, options: options)
        b.cycle()
        #expect(try b.tree() == ["one.txt": "file 1", "two.txt": "file 2"])
    }

    /// In one session: a PUT of a segment that landed but whose answer was lost (a
    /// timeout), directly and behind a RetryingStore (whose retry then answers "exists"),
    /// and one that did not land.
    @Test func aLostAnswerNeitherRepeatsNorSkipsASeq() throws {
        let temp = TempDirectory()
        defer { temp.cleanup() }
        let memory = MemoryStore()
        let recording = RecordingStore(memory)
        let options = SimDevice.alwaysPolling
        let a = try SimDevice(name: "a", root: temp.path, backing: recording, clock: nowNanos, options: options)
        let retrying = try SimDevice(name: "r", root: temp.path,
                                     backing: RetryingStore(recording, attempts: 3, sleep: { _ in }), clock: nowNanos, options: options)
        let b = try SimDevice(name: "b", root: temp.path, backing: memory, clock: nowNanos, options: options)
        func failNextSegmentPut(_ fault: RecordingStore.Fault) {
            let once = Locked(false)
            recording.setFault { op, key in
                guard op == .put, key.hasPrefix("log/") else { return nil }
                return once.withLock { done in
                    defer { done = true }
                    return done ? nil : fault
                }
            }
        }
        var expected: [String: String] = [:]
        for (round, d) in [a, retrying].enumerated() {
            // Landed, answer lost.
            try d.save("landed\(round).txt", "x")
            expected["landed\(round).txt"] = "file x"
            failNextSegmentPut(.after(.transient("timed out")))
            #expect(throws: StoreError.self) { try d.engine.cycle(pushPull: true) }
            #expect(Self.seqs(memory, d.store.deviceID) == [1])
            try d.engine.cycle(pushPull: true)
            #expect(Self.seqs(memory, d.store.deviceID) == [1])
            #expect(d.store.pendingUploadCount == 0)
            // Not landed.
            try d.save("lost\(round).txt", "y")
            expected["lost\(round).txt"] = "file y"
            failNextSegmentPut(.before(.permanent("refused")))
            #expect(throws: StoreError.self) { try d.engine.cycle(pushPull: true) }
            #expect(Self.seqs(memory, d.store.deviceID) == [1])
            try d.engine.cycle(pushPull: true)
            #expect(Self.seqs(memory, d.store.deviceID) == [1, 2])
            #expect(d.store.pendingUploadCount == 0)
        }
        b.cycle()
        #expect(try b.tree() == expected)
    }
}
