import Glibc
import Testing
import TestSupport
import UbiquitySystem
@testable import UbiquityFS
@testable import UbiquityStore
@testable import UbiquitySync

/// Collecting the backing directory (backing format 4): journal checkpoints without the
/// pruned records, no resurrection of records a reader pruned, fossil collection of
/// objects, and a device that was offline past every grace period.
@Suite struct BackingGcTests {
    static let day: Int64 = 86_400

    /// Devices over one backing directory, with a shared clock that moves a minute per
    /// read (versions far enough apart for a policy to tell them apart).
    final class World {
        let temp = TempDirectory(prefix: "ubiquity-bgc")
        let ticks = Locked<Nanos>(1_700_000_000_000_000_000)
        var backing: String { temp.path + "/backing" }
        init() { mkdir(temp.path + "/backing", 0o755) }
        func device(_ name: String) throws -> SimDevice {
            try SimDevice(name: name, root: temp.path, backing: backing, clock: { [ticks] in
                ticks.withLock { t in t += 60_000_000_000; return t }
            })
        }
        func advance(days: Int64) { ticks.withLock { $0 += days * 86_400_000_000_000 } }
        deinit { temp.cleanup() }
    }

    static func pruneAll(_ d: SimDevice) throws -> Int {
        var policy = RetentionPolicy.standard
        policy.apply(keepWithin: 1, keepDeletedWithin: 1)
        return try d.fs.prune(policy: policy, now: d.store.clock(), dryRun: false).versions.count
    }

    static func historyCount(_ d: SimDevice) throws -> Int {
        try d.fs.meta.withLock { (m) throws(StoreError) in
            Int(try m.store.db.rows("SELECT count(*) FROM versions WHERE local = 0 AND kind = 1", []) { $0.int(0) }.first ?? 0)
        }
    }

    static func prunedRemembered(_ d: SimDevice) throws -> Int {
        try d.fs.meta.withLock { (m) throws(StoreError) in
            Int(try m.store.db.rows("SELECT count(*) FROM pruned_records", []) { $0.int(0) }.first ?? 0)
        }
    }

    static func journals(_ world: World, _ d: SimDevice) -> [String] {
        ((try? directoryEntries("\(world.backing)/devices/\(d.store.deviceID)")) ?? []).filter { !$0.hasPrefix(".") }.sorted()
    }

    static func size(_ path: String) -> Int64 {
        var st = stat()
        return stat(path, &st) == 0 ? Int64(st.st_size) : -1
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

        // b prunes a's old versions; a rewrites its journal still holding all of them.
        world.advance(days: 2)
        let prunedOnB = try Self.pruneAll(b)
        #expect(prunedOnB > 0)
        let keptOnB = try Self.historyCount(b)
        #expect(try Self.prunedRemembered(b) == prunedOnB)
        #expect(try a.engine.checkpointJournal(force: true)?.records == 6)
        #expect(Self.journals(world, a) == ["journal.1"])
        b.cycle()
        // Read again from the start of journal.1: nothing pruned came back, no conflict.
        #expect(try Self.historyCount(b) == keptOnB)
        #expect(b.conflicts().isEmpty)
        #expect(try Self.prunedRemembered(b) == prunedOnB) // still in a's journal

        // a prunes too; its checkpoint is due by itself and leaves the records out.
        let prunedOnA = try Self.pruneAll(a)
        #expect(prunedOnA == prunedOnB)
        let before = Self.size("\(world.backing)/devices/\(a.store.deviceID)/journal.1")
        let checkpoint = try #require(try a.engine.checkpointJournal())
        #expect(checkpoint.generation == 2 && checkpoint.records == Int64(6 - prunedOnA))
        #expect(Self.journals(world, a) == ["journal.2"])
        #expect(Self.size("\(world.backing)/devices/\(a.store.deviceID)/journal.2") < before)
        #expect(try a.engine.checkpointJournal() == nil) // not due again
        // Only small files: no objects, so the collector does not even read the journals.
        let idle = try BackingCollector(backing: a.engine.backing).run(now: Int64(time(nil)))
        #expect(idle.journals == 0 && idle.objects == 0 && idle.summary.hasPrefix("no objects"))
        b.cycle()
        #expect(try Self.prunedRemembered(b) == 0) // gone for good: forgotten
        #expect(b.conflicts().isEmpty)

        // a device that joins now sees the same tree, and only the history a kept.
        let c = try world.device("c")
        c.cycle()
        #expect(try c.tree() == ["notes.txt": "file version 5"])
        #expect(c.conflicts().isEmpty)
        #expect(try Self.historyCount(c) == 6 - prunedOnA)
        // and a's next save reaches everyone through journal.2.
        try a.save("notes.txt", "version 6")
        a.cycle(); b.cycle(); c.cycle()
        #expect(try b.tree() == ["notes.txt": "file version 6"] && c.tree() == ["notes.txt": "file version 6"])
    }

    @Test func unusedObjectsBecomeFossilsAndGoAWeekLater() throws {
        let world = World()
        let a = try world.device("a"), b = try world.device("b")
        let big = { (i: Int) in String(repeating: "content \(i) ", count: 400) } // > 1 KiB: objects
        for i in 0..<4 {
            try a.save("big.txt", big(i))
            a.cycle()
        }
        b.cycle()
        world.advance(days: 2)
        #expect(try Self.pruneAll(a) == 3)
        try a.engine.checkpointJournal()
        let collector = BackingCollector(backing: a.engine.backing)
        let now = Int64(time(nil))
        // Objects younger than a day stay, whatever names them.
        #expect(try collector.run(now: now).fossilized == 0)
        var report = try collector.run(now: now + 2 * Self.day)
        #expect(report.objects == 4 && report.fossilized == 3 && report.deleted == 0)
        #expect(try b.tree() == ["big.txt": "file " + big(3)])

        // A save of a fossil's content uploads it again (writers look for exact names);
        // the next run removes the fossil it no longer needs.
        try a.save("big.txt", big(1))
        a.cycle()
        report = try collector.run(now: now + 3 * Self.day)
        #expect(report.restored == 1 && report.deleted == 0 && report.fossils == 2)

        // A reader that needs a fossil reads it: a fresh device, an object renamed away.
        let current = ChunkID(hashing: Array(big(1).utf8))
        let path = a.engine.backing.objectPath(current)
        #expect(rename(path, path + Backing.fossilMark + String(now)) == 0)
        let c = try world.device("c")
        c.cycle()
        #expect(try c.tree() == ["big.txt": "file " + big(1)])
        report = try collector.run(now: now + 4 * Self.day)
        #expect(report.restored == 1) // named: back under its name
        #expect(access(path, F_OK) == 0)

        // A fossil's age is the later of its stamp and its rename (ctime): a stamp from a
        // clock far behind does not shorten the week.
        let early = ChunkID(hashing: Array("early".utf8))
        try a.engine.backing.putObject(early, Array("early".utf8))
        let earlyFossil = a.engine.backing.objectPath(early) + Backing.fossilMark + String(now - 30 * Self.day)
        #expect(rename(a.engine.backing.objectPath(early), earlyFossil) == 0)
        report = try collector.run(now: now)
        #expect(report.deleted == 0 && access(earlyFossil, F_OK) == 0)
        unlink(earlyFossil)

        // A week after they became fossils, the unused ones go.
        report = try collector.run(now: now + 10 * Self.day)
        #expect(report.deleted == 2 && report.fossils == 0 && report.bytesDeleted >= 8_000)
        for d in [a, b, c] { d.cycle() }
        for d in [b, c] { #expect(try d.tree() == ["big.txt": "file " + big(1)]) }
    }

    /// Review finding: a checkpoint rewrote records naming an object that had gone from
    /// the backing directory, so readers waited for it forever. It uploads it again. And
    /// records leave a device only once durable there.
    @Test func aCheckpointUploadsMissingObjectsAgainAndPushesOnlyDurableRecords() throws {
        let world = World()
        let a = try world.device("a"), b = try world.device("b")
        let big = String(repeating: "big content ", count: 400)
        try a.save("big.txt", big)
        a.cycle()
        #expect(try a.fs.meta.withLock { (m) throws(StoreError) in try m.store.hasUndurableVersions() } == false)
        let object = a.engine.backing.objectPath(ChunkID(hashing: Array(big.utf8)))
        #expect(unlink(object) == 0)
        try a.engine.checkpointJournal(force: true)
        #expect(access(object, F_OK) == 0)
        b.cycle()
        #expect(try b.tree() == ["big.txt": "file " + big])
    }

    /// Review finding: a chunk this store cannot read (damaged, waiting for `fsck
    /// --repair`) made every checkpoint fail, so the backing gc never went on. The record
    /// keeps naming it by hash instead.
    @Test func aCheckpointGoesOnPastAChunkDamagedHere() throws {
        let world = World()
        let a = try world.device("a")
        try a.save("small.txt", "tiny content")
        try a.save("other.txt", "other content")
        a.cycle()
        let id = ChunkID(hashing: Array("tiny content".utf8))
        #expect(a.fs.chunks.sweep(id, unusedSince: .max) != nil) // lost here
        let checkpoint = try #require(try a.engine.checkpointJournal(force: true))
        #expect(checkpoint.records == 2)
        let journal = try #require(try readFile("\(world.backing)/devices/\(a.store.deviceID)/journal.1", limit: 1 << 20))
        let text = String(decoding: journal, as: UTF8.self)
        #expect(text.contains(id.hex + ":12"))
        #expect(text.contains("==" + Hex.encode(Array("other content".utf8))))
    }

    @Test func aDeviceOfflineForWeeksConvergesAndKeepsItsVersions() throws {
        let world = World()
        let a = try world.device("a"), b = try world.device("b")
        let big = { (i: Int) in String(repeating: "shared \(i) ", count: 400) }
        try a.save("doc.txt", big(0))
        try a.save("other.txt", big(100))
        a.cycle(); b.cycle()
        // b goes offline and edits: its new version reuses the content of a version of a
        // that a is about to prune (the object b believes is there will be deleted).
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
        #expect(report.deleted >= 2) // big(1), big(2): pruned, then deleted
        #expect(access(a.engine.backing.objectPath(ChunkID(hashing: Array(big(1).utf8))), F_OK) != 0)

        // b comes back weeks later: it reads a's rewritten journal and uploads its version,
        // object included.
        symlink(world.backing, b.link)
        for _ in 0..<2 { b.cycle(); a.cycle() }
        let expected = ["doc.txt": "file " + big(3), "other.txt": "file " + big(100), "offline.txt": "file " + big(1)]
        #expect(try a.tree() == expected)
        #expect(try b.tree() == expected)
        #expect(a.conflicts().isEmpty && b.conflicts().isEmpty)
        let c = try world.device("c")
        c.cycle()
        #expect(try c.tree() == expected)
    }
}
