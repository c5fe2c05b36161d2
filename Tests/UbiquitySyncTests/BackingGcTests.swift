import Glibc
import Testing
import TestSupport
import UbiquityBacking
import UbiquitySystem
@testable import UbiquityFS
@testable import UbiquityStore
@testable import UbiquitySync

/// Collecting the backing store (backing format 5, docs/FORMAT.md "Collecting"): a
/// device's checkpoints leave out the records it pruned and never bring back those a
/// reader pruned; packs no record names become fossil markers, are restored when named
/// again and deleted a week later; the collector deletes nothing when it cannot read every
/// reference; a device deletes its own segments a checkpoint covers (after the grace) and
/// its older checkpoints; a device offline past every grace period converges.
@Suite struct BackingGcTests {
    static let day: Int64 = 86_400

    /// Devices over one backing directory, with a shared clock that moves a minute per
    /// read (versions far enough apart for a policy to tell them apart).
    final class World {
        let temp = TempDirectory(prefix: "ubiquity-bgc")
        let ticks = Locked<Nanos>(1_700_000_000_000_000_000)
        var backing: String { temp.path + "/backing" }
        /// The backing directory as a store, to look at (and break) it.
        let store: DirectoryStore
        init() {
            mkdir(temp.path + "/backing", 0o755)
            store = DirectoryStore(root: temp.path + "/backing")
        }
        func device(_ name: String, options: SyncEngine.Options = SimDevice.alwaysPolling) throws -> SimDevice {
            try SimDevice(name: name, root: temp.path, backing: backing, clock: { [ticks] in
                ticks.withLock { t in t += 60_000_000_000; return t }
            }, options: options)
        }
        func advance(days: Int64) { ticks.withLock { $0 += days * 86_400_000_000_000 } }
        deinit { temp.cleanup() }

        /// `d`'s checkpoints: their seqs, complete ones only.
        func checkpoints(_ d: SimDevice) throws -> [UInt64] {
            try Backing(store: store, deviceID: d.store.deviceID).devices().checkpoints[d.store.deviceID, default: [:]].keys.sorted()
        }

        /// `d`'s segments in the log: their seqs.
        func segments(_ d: SimDevice) -> [UInt64] {
            store.keys("log/").compactMap { SegmentLog.SegmentName(key: BackingKey(checked: $0)) }
                .filter { $0.device == d.store.deviceID }.map(\.seq).sorted()
        }

        var packs: Set<String> { Set(store.keys("packs/").map { String($0.split(separator: "/").last!) }) }
        var fossils: Set<String> { Set(store.keys("fossils/").map { String($0.dropFirst("fossils/".count)) }) }
    }

    static func pruneAll(_ d: SimDevice) throws -> Int {
        var policy = RetentionPolicy.standard
        policy.apply(keepWithin: 1, keepDeletedWithin: 1)
        return try d.fs.prune(policy: policy, now: d.store.clock(), dryRun: false).versions.count
    }

    static func historyCount(_ d: SimDevice) throws -> Int {
        try d.fs.withMetaLock { (_, store) throws(StoreError) in
            Int(try store.db.rows("SELECT count(*) FROM versions WHERE local = 0 AND kind = 1", []) { $0.int(0) }.first ?? 0)
        }
    }

    static func prunedRemembered(_ d: SimDevice) throws -> Int {
        try d.fs.withMetaLock { (_, store) throws(StoreError) in
            Int(try store.db.rows("SELECT count(*) FROM pruned_records", []) { $0.int(0) }.first ?? 0)
        }
    }

    /// The pack `d` knows holds `text`'s one chunk.
    static func pack(of text: String, on d: SimDevice) throws -> String? {
        let id = ChunkID(hashing: Array(text.utf8))
        return try d.fs.withMetaLock { (_, store) throws(StoreError) in try store.chunkPlaces([id])[id]?.pack }
    }

    @Test func checkpointsDropPrunedRecordsAndReadersDoNotTakeThemBack() throws {
        let world = World()
        let a = try world.device("a"), b = try world.device("b")
        for i in 0..<6 {
            try a.save("notes.txt", "version \(i)")
            a.cycle()
        }
        b.cycle()
        #expect(try b.tree() == ["notes.txt": "file version 5"])
        #expect(try Self.historyCount(b) == 6)
        #expect(world.segments(a) == [1, 2, 3, 4, 5, 6])

        // b prunes a's old versions; a writes checkpoints still holding all of them.
        world.advance(days: 2)
        let prunedOnB = try Self.pruneAll(b)
        #expect(prunedOnB > 0)
        let keptOnB = try Self.historyCount(b)
        #expect(try Self.prunedRemembered(b) == prunedOnB)
        let first = try #require(try a.engine.checkpointJournal(force: true))
        #expect(first.seq == 6 && first.records == 6)
        // A second one may not reuse seq 6 (readers may have read it): an empty segment 7.
        let second = try #require(try a.engine.checkpointJournal(force: true))
        #expect(second.seq == 7 && second.records == 6)
        #expect(try world.checkpoints(a) == [6, 7])
        #expect(world.segments(a) == [1, 2, 3, 4, 5, 6, 7])
        b.cycle()
        // b read checkpoint 7 (it was behind it): nothing it pruned came back, no conflict.
        #expect(try Self.historyCount(b) == keptOnB)
        #expect(b.conflicts().isEmpty)
        #expect(try Self.prunedRemembered(b) == prunedOnB) // still in a's checkpoint

        // a prunes too; its checkpoint is due by itself and leaves the records out.
        let prunedOnA = try Self.pruneAll(a)
        #expect(prunedOnA == prunedOnB)
        let checkpoint = try #require(try a.engine.checkpointJournal())
        #expect(checkpoint.seq == 8 && checkpoint.records == Int64(6 - prunedOnA))
        #expect(checkpoint.bytes < first.bytes)
        #expect(try a.engine.checkpointJournal() == nil) // not due again
        // Only small files: no packs, so the collector reads no checkpoint; it deletes a's
        // older checkpoints, and none of its segments within the day's grace.
        let collector = BackingCollector(backing: a.engine.backing)
        let idle = try collector.run(now: Int64(time(nil)))
        #expect(idle.packs == 0 && idle.checkpointsRead == 0 && idle.summary.hasPrefix("no packs"), "\(idle.summary)")
        #expect(idle.checkpointsDeleted == 2 && idle.segmentsDeleted == 0)
        #expect(try world.checkpoints(a) == [8])
        #expect(world.store.keys("devices/\(a.store.deviceID)/").allSatisfy { $0.contains("checkpoint-0000000000000008/") })
        b.cycle()
        #expect(try Self.prunedRemembered(b) == 0) // gone for good: forgotten
        #expect(b.conflicts().isEmpty)

        // A day later a's segments the checkpoint covers go.
        let later = try collector.run(now: Int64(time(nil)) + 2 * Self.day)
        #expect(later.segmentsDeleted == 8 && later.checkpointsDeleted == 0)
        #expect(world.segments(a).isEmpty)

        // A device that joins now sees the same tree, and only the history a kept.
        let c = try world.device("c")
        c.cycle()
        #expect(try c.tree() == ["notes.txt": "file version 5"])
        #expect(c.conflicts().isEmpty)
        #expect(try Self.historyCount(c) == 6 - prunedOnA)
        // And a's next save reaches everyone through segment 9.
        try a.save("notes.txt", "version 6")
        a.cycle(); b.cycle(); c.cycle()
        #expect(world.segments(a) == [9])
        #expect(try b.tree() == ["notes.txt": "file version 6"])
        #expect(try c.tree() == ["notes.txt": "file version 6"])
    }

    @Test func unnamedPacksBecomeFossilsAndGoAWeekLater() throws {
        let world = World()
        let a = try world.device("a"), b = try world.device("b")
        let big = { (i: Int) in String(repeating: "content \(i) ", count: 400) } // > 1 KiB: packs
        for i in 0..<4 {
            try a.save("big.txt", big(i))
            a.cycle()
        }
        b.cycle()
        #expect(world.packs.count == 4)
        let packOf = try (0..<4).map { i in try #require(try Self.pack(of: big(i), on: a)) }
        #expect(Set(packOf) == world.packs)
        world.advance(days: 2)
        #expect(try Self.pruneAll(a) == 3)
        let checkpoint = try #require(try a.engine.checkpointJournal())
        #expect(checkpoint.records == 1)
        let collector = BackingCollector(backing: a.engine.backing)
        let now = Int64(time(nil))
        var report = try collector.run(now: now)
        #expect(report.packs == 4 && report.referenced == 1 && report.fossilized == 3 && report.deleted == 0, "\(report.summary)")
        #expect(world.fossils == [packOf[0], packOf[1], packOf[2]])
        #expect(try b.tree() == ["big.txt": "file " + big(3)])

        // Named again: a checked pack 1 within the hour (it uploaded it), so its save of
        // that content names it; the next run takes the marker away.
        try a.save("big.txt", big(1))
        a.cycle()
        report = try collector.run(now: now + Self.day)
        #expect(report.restored == 1 && report.deleted == 0 && report.fossils == 2, "\(report.summary)")
        #expect(world.fossils == [packOf[0], packOf[2]])

        // An hour later a writer checks again, and never names a pack with a marker: the
        // content goes up again, in a new pack.
        a.engine.memory.verifiedPacks = [:]
        try a.save("big.txt", big(2))
        a.cycle()
        let fresh = try #require(try Self.pack(of: big(2), on: a))
        #expect(fresh != packOf[2] && world.packs.count == 5 && world.packs.contains(fresh))
        report = try collector.run(now: now + 2 * Self.day)
        #expect(report.fossilized == 0 && report.restored == 0 && report.fossils == 2, "\(report.summary)")
        let c = try world.device("c")
        c.cycle()
        #expect(try c.tree() == ["big.txt": "file " + big(2)])

        // A marker whose pack is gone is deleted; a week after they became fossils, the
        // unnamed packs go, then their markers.
        let stray = String(repeating: "0f", count: 16)
        try world.store.put(Backing.fossilKey(stray), Array("\(now)\n".utf8))
        report = try collector.run(now: now + 8 * Self.day)
        #expect(report.deleted == 2 && report.fossils == 0 && report.bytesDeleted >= 8_000, "\(report.summary)")
        #expect(world.packs == [packOf[1], packOf[3], fresh])
        #expect(world.fossils.isEmpty)
        for d in [a, b, c] { d.cycle() }
        for d in [b, c] { #expect(try d.tree() == ["big.txt": "file " + big(2)]) }
        let e = try world.device("e")
        e.cycle()
        #expect(try e.tree() == ["big.txt": "file " + big(2)])
        #expect(try Self.historyCount(e) == 3) // big(3) from the checkpoint, big(1), big(2)
    }

    /// Repacking: a pack less than half named is sparse; each device whose records name
    /// it writes a checkpoint that puts those chunks into a new pack (from its own copies),
    /// then the pack is unnamed: a fossil, deleted a week later. A device that has not
    /// collected yet keeps it named (nothing is deleted under it); a chunk that cannot be
    /// read here keeps its place rather than losing it.
    @Test func sparsePacksAreRepackedByTheDevicesThatNameThem() throws {
        let world = World()
        let a = try world.device("a"), b = try world.device("b")
        let big = { (i: Int) in String(repeating: "part \(i) ", count: 500) } // > 1 KiB: packs
        for i in 0..<8 { try a.save("f\(i).txt", big(i)) }
        a.cycle()
        #expect(world.packs.count == 1)
        let sparse = try #require(world.packs.first)
        b.cycle()
        try b.save("copy.txt", big(7)) // b names a's chunk in a's pack (deduplicated)
        b.cycle()
        #expect(try Self.pack(of: big(7), on: b) == sparse && world.packs.count == 1)
        let root = Store.rootInode
        for i in 0..<6 { try a.fs.unlink(parent: root, name: "f\(i).txt") }
        a.cycle()
        b.cycle()
        world.advance(days: 2)
        #expect(try Self.pruneAll(a) == 6)

        // a's gc: its checkpoint leaves the deleted files out; 2 of the 8 chunks are named
        // (by a, and one by b): sparse. a's chunk of f6 is damaged here: it keeps its place.
        // (Not here and not fetchable either: with a source, a chunk that is not here is
        // fetched from the sparse pack and moved like the others.)
        let damaged = ChunkID(hashing: Array(big(6).utf8))
        #expect(a.fs.chunks.sweep(damaged, unusedSince: .max) != nil)
        a.fs.chunks.setSource(nil)
        let now = Int64(time(nil))
        let text = try a.engine.collectBacking(now: now)
        a.fs.chunks.setSource(a.engine)
        #expect(text.contains("1 packs are less than half named (1 of them by this device's records") && text.contains("repacked"), "\(text)")
        #expect(a.engine.memory.sparsePacks == [sparse])
        let moved = try #require(try Self.pack(of: big(7), on: a))
        #expect(moved != sparse && world.packs == [sparse, moved])
        #expect(try Self.pack(of: big(6), on: a) == sparse)

        // Still named by a (the damaged chunk) and b: not a fossil, however long it waits.
        let collector = BackingCollector(backing: a.engine.backing)
        var report = try collector.run(now: now + 9 * Self.day)
        #expect(report.fossilized == 0 && report.sparse == [sparse] && report.sparseHere == [sparse], "\(report.summary)")
        // Its next gc does not write another repacking checkpoint for the same pack (one
        // a day that changes nothing). a's chunk is back (fsck --repair would bring it):
        // the next checkpoint a writes, due for any reason, moves it too.
        let again = try a.engine.collectBacking(now: now + 9 * Self.day)
        #expect(!again.contains("repacked"), "\(again)")
        try a.save("f6.txt", big(6))
        a.cycle()
        _ = try a.engine.checkpointJournal(force: true)
        #expect(try Self.pack(of: big(6), on: a) != sparse)

        // b had not collected: its save of the same content still names the sparse pack...
        try b.save("copy2.txt", big(7) + " ")
        try b.save("copy3.txt", big(6))
        b.cycle()
        report = try collector.run(now: now + 10 * Self.day)
        #expect(report.fossilized == 0 && report.sparse == [sparse] && report.sparseHere.isEmpty, "\(report.summary)")
        // ...until its own gc: then no record names it, and it goes a week later.
        let bText = try b.engine.collectBacking(now: now + 10 * Self.day)
        #expect(bText.contains("repacked"), "\(bText)")
        report = try collector.run(now: now + 11 * Self.day)
        #expect(report.fossilized == 1 && report.sparse.isEmpty, "\(report.summary)")
        #expect(world.fossils == [sparse])
        report = try collector.run(now: now + 18 * Self.day)
        #expect(report.deleted == 1, "\(report.summary)")
        #expect(!world.packs.contains(sparse))

        // Everyone still reads everything; a device that joins now too.
        let expected = ["f6.txt": "file " + big(6), "f7.txt": "file " + big(7), "copy.txt": "file " + big(7),
                        "copy2.txt": "file " + big(7) + " ", "copy3.txt": "file " + big(6)]
        for d in [a, b] { d.cycle() }
        for d in [a, b] { #expect(try d.tree() == expected) }
        let c = try world.device("c")
        c.cycle()
        #expect(try c.tree() == expected)
    }

    /// A pack uploaded while its file was written is named by no record until the push:
    /// a gc meanwhile makes it a fossil. The push counts the pack's check from its upload
    /// (here 1 s stands for the hour: the file stayed open past it), finds the marker and
    /// uploads the chunks again rather than name a pack that may be deleted. (Counted
    /// from the push, a pack staged days before was named unchecked.)
    @Test func aStagedPackThatBecameAFossilIsNotNamed() throws {
        let world = World()
        var options = SimDevice.alwaysPolling
        options.objectCheckValidity = 1
        options.stageWhileWriting = true // the backing directory is on this disk
        let a = try world.device("a", options: options)
        a.cycle() // reached the store: chunks go up as they are written
        var rng = SplitMix64(seed: 5)
        print("BackingGcTests.aStagedPackThatBecameAFossilIsNotNamed seed 5")
        let content = Array(randomText(12 << 20, &rng).utf8)
        let (_, handle) = try a.fs.create(parent: Store.rootInode, name: "big.bin", mode: 0o644, flags: OpenFlags(O_WRONLY), caller: a.me)
        for offset in stride(from: 0, to: content.count, by: 1 << 20) {
            _ = try content[offset..<min(content.count, offset + (1 << 20))].withUnsafeBytes { try a.fs.write(handle, offset: Int64(offset), data: $0) }
        }
        var waited = 0
        while world.packs.isEmpty && waited < 500 { usleep(10_000); waited += 1 }
        let staged = try #require(world.packs.first)
        let report = try BackingCollector(backing: a.engine.backing).run(now: Int64(time(nil)))
        #expect(report.fossilized == 1 && world.fossils == [staged], "\(report.summary)")
        usleep(2_200_000)
        try a.fs.release(handle)
        a.cycle()
        let ids = try a.fs.withMetaLock { (_, store) throws(StoreError) in
            try store.chunkPlaces(a.fs.chunks.allChunkIDs()).filter { $0.value.pack == staged }
        }
        #expect(ids.isEmpty, "\(ids.count) places still in the fossil \(staged)")
        let b = try world.device("b")
        b.cycle()
        #expect(try SyncCostTests.content(of: "big.bin", on: b) == content)
    }

    /// The collector reads every device's newest checkpoint and the segments after it
    /// before it decides anything: one it cannot read (a failing GET, a segment gone)
    /// stops it with nothing written or deleted.
    @Test func theCollectorDeletesNothingWhenAReferenceCannotBeRead() throws {
        let world = World()
        let a = try world.device("a"), b = try world.device("b")
        let big = { (i: Int) in String(repeating: "data \(i) ", count: 500) }
        for i in 0..<3 {
            try a.save("big.txt", big(i))
            a.cycle()
        }
        world.advance(days: 2)
        #expect(try Self.pruneAll(a) == 2)
        try a.engine.checkpointJournal(force: true)
        try a.engine.checkpointJournal(force: true) // an older checkpoint to delete
        try b.save("b.txt", big(9))
        b.cycle()
        try a.save("big.txt", big(5))
        a.cycle() // a segment after a's checkpoint
        let before = world.store.keys("")
        let me = a.store.deviceID
        let recording = RecordingStore(world.store)
        let collector = BackingCollector(backing: Backing(store: recording, deviceID: me))
        let later = Int64(time(nil)) + 30 * Self.day // every grace and age passed

        let faults: [(String, @Sendable (MemoryStore.Operation, String) -> RecordingStore.Fault?)] = [
            ("a failing GET of a checkpoint", { op, key in
                op == .get && key.hasPrefix("devices/\(me)/checkpoint-") ? .before(.transient("injected")) : nil }),
            ("a failing GET of a segment", { op, key in
                op == .get && key.hasPrefix("log/") ? .before(.transient("injected")) : nil }),
            ("a segment gone while read", { op, key in
                op == .get && key.hasPrefix("log/") ? .before(.notFound(key)) : nil }),
            ("a failing listing of the log", { op, key in op == .list && key == "log/" ? .before(.transient("injected")) : nil }),
        ]
        for (what, fault) in faults {
            recording.reset()
            recording.setFault(fault)
            #expect(throws: StoreError.self, "\(what)") { try collector.run(now: later) }
            #expect(!recording.calls.contains { $0.op == .put || $0.op == .delete }, "\(what): \(recording.calls)")
            #expect(world.store.keys("") == before, "\(what)")
        }
        recording.setFault(nil)
        let report = try collector.run(now: later)
        #expect(report.fossilized == 2 && report.checkpointsDeleted == 1 && report.segmentsDeleted == 4, "\(report.summary)")
        let c = try world.device("c")
        c.cycle()
        #expect(try c.tree() == ["big.txt": "file " + big(5), "b.txt": "file " + big(9)])
    }

    /// Review finding (format 4, kept): a checkpoint rewrote records naming a chunk whose
    /// copy had gone from the backing store, so readers waited for it forever. It
    /// uploads it again. And records leave a device only once durable there.
    @Test func aCheckpointUploadsChunksOfAGonePackAgainAndPushesOnlyDurableRecords() throws {
        let world = World()
        let a = try world.device("a"), b = try world.device("b")
        let big = String(repeating: "big content ", count: 400)
        try a.save("big.txt", big)
        a.cycle()
        #expect(try a.fs.withMetaLock { (_, store) throws(StoreError) in try store.hasUndurableVersions() } == false)
        let old = try #require(try Self.pack(of: big, on: a))
        try world.store.delete(Pack.key(old))
        a.engine.memory.verifiedPacks = [:] // an hour later: a checks again
        let checkpoint = try #require(try a.engine.checkpointJournal(force: true))
        #expect(checkpoint.records == 1)
        let new = try #require(try Self.pack(of: big, on: a))
        #expect(new != old && world.packs == [new])
        b.cycle()
        #expect(try b.tree() == ["big.txt": "file " + big])
    }

    /// Review finding (format 4, kept): a chunk this store cannot read (damaged, waiting
    /// for `fsck --repair`) made every checkpoint fail, so the backing gc never went on.
    /// The record keeps naming it by hash instead.
    @Test func aCheckpointGoesOnPastAChunkDamagedHere() throws {
        let world = World()
        let a = try world.device("a")
        // 100 bytes: a row of small.sqlite (64 bytes or fewer would be in the version row).
        let small = "tiny content" + String(repeating: ".", count: 88)
        try a.save("small.txt", small)
        try a.save("other.txt", "other content")
        a.cycle()
        let id = ChunkID(hashing: Array(small.utf8))
        #expect(a.fs.chunks.sweep(id, unusedSince: .max) != nil) // lost here
        let checkpoint = try #require(try a.engine.checkpointJournal(force: true))
        #expect(checkpoint.records == 2)
        let key = Backing.checkpointKey(a.store.deviceID, seq: checkpoint.seq, part: Backing.partName(0))
        let text = try #require(world.store.text(key.path))
        #expect(text.contains(id.hex + ":100"))
        #expect(text.contains("chunks==" + Hex.encode(Array("other content".utf8))))
        #expect(world.store.text(Backing.checkpointKey(a.store.deviceID, seq: checkpoint.seq, part: "end").path) == "parts=1 records=2\n")
    }

    @Test func aDeviceOfflineForWeeksConvergesAndKeepsItsVersions() throws {
        let world = World()
        let a = try world.device("a"), b = try world.device("b")
        let big = { (i: Int) in String(repeating: "shared \(i) ", count: 400) }
        try a.save("doc.txt", big(0))
        try a.save("other.txt", big(100))
        a.cycle(); b.cycle()
        // b goes offline and edits: its new version has the content of a version of a
        // that a is about to prune (whose pack will be deleted).
        unlink(b.link)
        try b.save("offline.txt", big(1))
        b.cycle()
        for i in 1...3 {
            try a.save("doc.txt", big(i))
            a.cycle()
        }
        world.advance(days: 30)
        #expect(try Self.pruneAll(a) > 0)
        try a.engine.checkpointJournal()
        let collector = BackingCollector(backing: a.engine.backing)
        let now = Int64(time(nil))
        _ = try collector.run(now: now + 2 * Self.day)
        let report = try collector.run(now: now + 20 * Self.day)
        #expect(report.deleted >= 2, "\(report.summary)") // big(1), big(2): pruned, then deleted
        #expect(world.segments(a).isEmpty) // all covered by the checkpoint, and old
        let gone = try #require(try Self.pack(of: big(1), on: a))
        #expect(!world.packs.contains(gone))

        // b comes back weeks later: it reads a's checkpoint and uploads its version,
        // chunk included.
        symlink(world.backing, b.link)
        for _ in 0..<2 { b.cycle(); a.cycle() }
        let expected = ["doc.txt": "file " + big(3), "other.txt": "file " + big(100), "offline.txt": "file " + big(1)]
        #expect(try a.tree() == expected)
        let bTree = try b.tree()
        #expect(bTree == expected, "\(bTree)")
        #expect(a.conflicts().isEmpty && b.conflicts().isEmpty)
        let c = try world.device("c")
        c.cycle()
        #expect(try c.tree() == expected)
    }

    /// A device that slept (or was paused) longer than a peer's segments stay finds none
    /// of them at its next look, and no gap tells it so: it lists `devices/` again when
    /// its last look is that old, and reads the peer's checkpoint.
    @Test func aDeviceAsleepPastTheGraceReadsThePeersCheckpoint() throws {
        let world = World()
        let a = try world.device("a"), b = try world.device("b")
        try a.save("doc.txt", "version 0")
        a.cycle(); b.cycle()
        try a.save("doc.txt", "version 1")
        a.cycle()
        try a.engine.checkpointJournal(force: true)
        _ = try BackingCollector(backing: a.engine.backing).run(now: Int64(time(nil)) + 2 * Self.day)
        #expect(world.segments(a).isEmpty)
        b.cycle() // not asleep long: nothing to see
        #expect(try b.tree() == ["doc.txt": "file version 0"])
        b.engine.memory.lastPull = b.engine.bootSeconds() - 2 * Self.day // slept two days
        b.cycle()
        #expect(try b.tree() == ["doc.txt": "file version 1"])
    }
}
