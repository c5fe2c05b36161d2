import Glibc
import Testing
import TestSupport
import UbiquityBacking
import UbiquitySystem
@testable import UbiquityFS
@testable import UbiquityStore
@testable import UbiquitySync

/// Upgrade from backing format 4 (docs/FORMAT.md, "Upgrade from format 4"): a device
/// whose records went out in format 4 (a journal `devices/<id>/journal` of record lines,
/// chunks in `objects/xx/<sha256>`) writes a checkpoint of them (chunks into packs) before
/// FORMAT says 5; a fresh device reads them from that checkpoint, never from the journal
/// or objects/, which the device's gc deletes afterwards.
@Suite struct UpgradeTests {
    /// What a format-4 program leaves after `d` synced: its records as journal lines and
    /// its large chunks as objects in the directory, the records marked uploaded in its
    /// store (and FORMAT 4 if `format` is set). `d`'s engine has not opened the store.
    static func pushAsFormat4(_ d: SimDevice, into dir: DirectoryStore, format: Bool) throws {
        try d.engine.cycle(pushPull: false) // local changes become records
        let (records, chunks) = try d.fs.withMetaLock { (_, store) throws(StoreError) -> ([SyncRecord], ChunkStore) in
            (try store.pendingUploads(limit: 10_000), store.chunks)
        }
        #expect(!records.isEmpty)
        var journal = ""
        for var record in records {
            for (id, size) in record.chunks.chunks {
                let bytes = try chunks.read(id)
                if size <= RecordCodec.maxInline {
                    record.inline[id] = bytes
                } else {
                    try dir.put(BackingKey(checked: "objects/\(id.hex.prefix(2))/\(id.hex)"), bytes)
                }
            }
            journal += RecordCodec.encode(record)
        }
        try dir.put(BackingKey(checked: "devices/\(d.store.deviceID)/journal"), Array(journal.utf8))
        try d.fs.withMetaLock { (_, store) throws(StoreError) in try store.markUploaded(records.map(\.id)) }
        if format { try dir.put(Backing.formatKey, Array("ubiquity-backing 4\n".utf8)) }
    }

    @Test func aFormat4DirectoryIsUpgradedAndAFreshDeviceReadsTheCheckpoints() throws {
        let temp = TempDirectory(prefix: "ubiquity-upgrade")
        defer { temp.cleanup() }
        let backing = temp.path + "/backing"
        mkdir(backing, 0o755)
        let dir = DirectoryStore(root: backing)
        print("UpgradeTests seed 4")
        var rng = SplitMix64(seed: 4)
        let big = randomText(200_000, &rng), other = randomText(50_000, &rng)
        let options = SimDevice.alwaysPolling
        let a = try SimDevice(name: "a", root: temp.path, backing: backing, clock: nowNanos, options: options)
        let b = try SimDevice(name: "b", root: temp.path, backing: backing, clock: nowNanos, options: options)
        try a.save("notes.txt", "from a")
        try a.save("docs/big.bin", big)
        try b.save("b.txt", "from b")
        try b.save("other.bin", other)
        try Self.pushAsFormat4(a, into: dir, format: true)
        try Self.pushAsFormat4(b, into: dir, format: false)
        let objects = dir.keys("objects/")
        #expect(objects.count >= 3)
        #expect(dir.text("FORMAT") == "ubiquity-backing 4\n")

        // a upgrades: a checkpoint of its records (its chunks into a pack), then FORMAT 5.
        let recording = RecordingStore(dir)
        let engine = SyncEngine(store: a.fs.store, backing: recording, options: options)
        try engine.cycle(pushPull: true)
        #expect(dir.text("FORMAT") == "ubiquity-backing 5\n")
        let formatPut = try #require(recording.calls.lastIndex { $0.op == .put && $0.key == "FORMAT" })
        let endPut = try #require(recording.calls.firstIndex { $0.op == .put && $0.key.hasSuffix("/end") })
        #expect(endPut < formatPut, "the checkpoint is complete before FORMAT says 5")
        #expect(recording.count(.put, "packs/") == 1 && recording.count(.put, "log/") == 0, "\(recording.calls)")
        #expect(recording.count(.get, "objects/") == 0 && recording.count(.get, "devices/") == 0)
        let listing = try Backing(store: dir, deviceID: a.store.deviceID).devices()
        #expect(listing.newestCheckpoint(of: a.store.deviceID)?.seq == 0)
        #expect(try Backing(store: dir, deviceID: a.store.deviceID).checkpointEnd(a.store.deviceID, seq: 0)?.records == 3)

        // b (upgraded later) opens a format-5 store: its records, only in its format-4
        // journal so far, go into its checkpoint before its first segment.
        try b.save("b2.txt", "after the upgrade")
        b.cycle()
        let bListing = try Backing(store: dir, deviceID: b.store.deviceID).devices()
        #expect(bListing.newestCheckpoint(of: b.store.deviceID)?.seq == 0)
        #expect(try Backing(store: dir, deviceID: b.store.deviceID).checkpointEnd(b.store.deviceID, seq: 0)?.records == 2)
        #expect(dir.keys("log/").count == 1) // b's segment 1: b2.txt
        #expect(try b.tree()["notes.txt"] == "file from a" && b.tree()["docs/big.bin"] == "file " + big)

        // A fresh device: everything from the checkpoints and the log, nothing from
        // format 4's journal or objects.
        let fresh = RecordingStore(dir)
        let c = try SimDevice(name: "c", root: temp.path, backing: fresh, clock: nowNanos, options: options)
        c.cycle()
        let expected = ["notes.txt": "file from a", "docs": "dir 755", "docs/big.bin": "file " + big,
                        "b.txt": "file from b", "other.bin": "file " + other, "b2.txt": "file after the upgrade"]
        #expect(try c.tree() == expected)
        #expect(fresh.count(.get, "objects/") == 0 && fresh.calls.allSatisfy { !$0.key.hasSuffix("/journal") }, "\(fresh.calls)")
        try engine.cycle(pushPull: true)
        #expect(try a.tree() == expected)

        // Each device's gc deletes its own journal; objects/ goes with the last journal.
        let collectorA = BackingCollector(backing: Backing(store: dir, deviceID: a.store.deviceID))
        var report = try collectorA.run(now: Int64(time(nil)))
        #expect(report.legacyDeleted == 1 && dir.keys("objects/").count == objects.count, "\(report.summary)")
        let collectorB = BackingCollector(backing: Backing(store: dir, deviceID: b.store.deviceID))
        report = try collectorB.run(now: Int64(time(nil)))
        #expect(report.legacyDeleted == 1 + objects.count, "\(report.summary)")
        #expect(dir.keys("objects/").isEmpty && dir.keys("devices/").allSatisfy { !$0.hasSuffix("/journal") })
        #expect(report.fossilized == 0, "\(report.summary)") // every pack is named
        let d = try SimDevice(name: "d", root: temp.path, backing: backing, clock: nowNanos, options: options)
        d.cycle()
        #expect(try d.tree() == expected)
    }
}
