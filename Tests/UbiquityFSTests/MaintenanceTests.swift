import Glibc
import Testing
import TestSupport
@testable import UbiquityFS
@testable import UbiquityStore
import UbiquitySystem

/// Prune and gc through the filesystem layer: what goes, what stays readable, and that a
/// commit reusing an old chunk never loses it to a concurrent gc.
@Suite struct MaintenanceTests {
    static let strict: RetentionPolicy = {
        var p = RetentionPolicy.standard
        p.apply(keepWithin: 1, keepDeletedWithin: 1)
        return p
    }()

    /// Every pending record counts as uploaded (no sync in these tests).
    static func uploadAll(_ h: Harness) throws {
        try h.fs.withMetaLock { (_, store) throws(StoreError) in
            try store.recordLocalChanges(busy: [])
            try store.markUploaded(try store.pendingUploads(limit: 1_000_000).map(\.id))
        }
    }

    static func chunkFiles(_ h: Harness) -> Int { h.fs.chunks.allChunkIDs().count }

    @Test func pruneThenGcFreesOldVersionsAndKeepsTheCurrentOnes() throws {
        let h = try Harness()
        // 64 bytes of padding: each content is a chunk of its own (over the inline limit).
        let pad = String(repeating: ".", count: 64)
        for i in 0..<10 { try h.save("a.txt", "a version \(i)" + pad) }
        for i in 0..<5 { try h.save("b.txt", "b version \(i)" + pad) }
        try h.save("gone.txt", "deleted soon" + pad)
        try h.fs.unlink(parent: Store.rootInode, name: "gone.txt")
        try Self.uploadAll(h)
        #expect(try h.versionNames("a.txt").count == 10)
        let before = Self.chunkFiles(h)
        let dry = try h.fs.prune(policy: Self.strict, now: nowNanos() + 1_000_000_000, dryRun: true)
        #expect(dry.versions.count == 9 + 4 + 1 && dry.histories == 1)
        // gc measures the space (`ubiquity status`): every content is 75 or 76 bytes.
        let measured = try h.fs.collectGarbage(grace: 3_600_000_000_000, policy: Self.strict)
        #expect(measured.chunksDeleted == 0)
        #expect(measured.currentBytes == 2 * 75)
        #expect(measured.historyBytes == 9 * 75 + 4 * 75 + 76)
        #expect(measured.prunableBytes == measured.historyBytes)
        let space = try #require(try h.fs.withMetaLock { (_, store) throws(StoreError) in try store.setting("space") })
        #expect(space.contains("history=1051 prunable=1051"), "\(space)")
        #expect(try h.versionNames("a.txt").count == 10)
        let pruned = try h.fs.prune(policy: Self.strict, now: nowNanos() + 1_000_000_000, dryRun: false)
        #expect(pruned.versions.count == 14)
        #expect(try h.versionNames("a.txt").count == 1)
        #expect(throws: Errno.notFound) { try h.versionNames("gone.txt") }
        #expect(Self.chunkFiles(h) == before) // prune frees nothing by itself
        usleep(1_100_000) // gc keeps what was written within the last second, whatever the grace
        let gc = try h.fs.collectGarbage(grace: 0)
        #expect(gc.chunksDeleted == 14 && gc.bytesFreed > 0)
        #expect(Self.chunkFiles(h) == 2)
        #expect(try h.read("a.txt") == "a version 9" + pad)
        #expect(try h.read("b.txt") == "b version 4" + pad)
        #expect(try h.fs.collectGarbage(grace: 0).chunksDeleted == 0)
        let fsck = try h.fs.withMetaLock { (_, store) throws(StoreError) in try Fsck.run(store: store) }
        #expect(fsck.problems.isEmpty, "\(fsck.problems)")
    }

    /// Free pages of the metadata database go back to the filesystem once there are many
    /// (the maintenance loop), and not while there are few (two PRAGMA reads).
    /// gc's mark reads the versions' reader: its holds of the store's lock do not grow
    /// with the versions it reads (a page of 500 rows each, before).
    @Test func gcMarksWithoutTheStoresLock() throws {
        var holds: [UInt] = []
        for saves in [100, 3_000] {
            let h = try Harness()
            for i in 0..<saves { try h.save("f\(i % 50)", "version \(i)") }
            try h.fs.store.prepareVersionReads()
            let before = h.fs.store.acquisitions
            let report = try h.fs.collectGarbage(grace: 0)
            #expect(report.versionsRead == saves)
            holds.append(h.fs.store.acquisitions - before)
        }
        #expect(holds[1] <= holds[0] + 2, "holds of the store's lock by gc over 100 and 3,000 versions: \(holds)")
    }

    @Test func manyFreePagesGoBackAndFewStay() throws {
        let h = try Harness()
        for i in 0..<50 { try h.save("f\(i).txt", "content \(i)") }
        let pragma = { (name: String) throws -> Int64 in
            try h.fs.withMetaLock { (_, store) throws(StoreError) in try store.db.rows("PRAGMA \(name)", []) { $0.int(0) }.first ?? 0 }
        }
        try h.fs.withMetaLock { (_, store) throws(StoreError) in
            try store.commitBatch()
            try store.db.execute("CREATE TABLE filler(x BLOB)")
            for _ in 0..<400 { try store.db.query("INSERT INTO filler VALUES(zeroblob(4000))", []) }
            try store.db.execute("DROP TABLE filler")
            try store.commitBatch()
        }
        let freeBefore = try pragma("freelist_count"), pagesBefore = try pragma("page_count")
        #expect(freeBefore >= 400, "\(freeBefore) free pages of \(pagesBefore)")
        h.fs.compactIfMuchFree()
        #expect(try pragma("freelist_count") == 0)
        #expect(try pragma("page_count") <= pagesBefore - freeBefore)
        // A few free pages stay (SQLite reuses them): no vacuum for them.
        try h.fs.withMetaLock { (_, store) throws(StoreError) in
            try store.db.execute("CREATE TABLE filler(x BLOB)")
            for _ in 0..<20 { try store.db.query("INSERT INTO filler VALUES(zeroblob(4000))", []) }
            try store.db.execute("DROP TABLE filler")
            try store.commitBatch()
        }
        let few = try pragma("freelist_count")
        #expect(few >= 20)
        h.fs.compactIfMuchFree()
        #expect(try pragma("freelist_count") == few)
        #expect(try h.read("f7.txt") == "content 7")
    }

    /// Tiny contents live in their version rows (store format 14): prune takes them with
    /// their versions, gc has nothing of them to sweep, and the space report counts them.
    @Test func tinyContentsGoWithTheirVersions() throws {
        let h = try Harness()
        for i in 0..<10 { try h.save("a.txt", "a version \(i)") }
        try Self.uploadAll(h)
        #expect(Self.chunkFiles(h) == 0)
        let measured = try h.fs.collectGarbage(grace: 3_600_000_000_000, policy: Self.strict)
        #expect(measured.currentBytes == 11 && measured.historyBytes == 9 * 11 && measured.prunableBytes == 9 * 11)
        #expect(try h.fs.prune(policy: Self.strict, now: nowNanos() + 1_000_000_000, dryRun: false).versions.count == 9)
        #expect(try h.fs.collectGarbage(grace: 0).chunksDeleted == 0)
        #expect(try h.read("a.txt") == "a version 9")
        let fsck = try h.fs.withMetaLock { (_, store) throws(StoreError) in try Fsck.run(store: store) }
        #expect(fsck.problems.isEmpty, "\(fsck.problems)")
    }

    /// Both kinds of chunk: a file (over SmallChunks.limit) and a row (over the inline limit).
    @Test(arguments: [3_000, 200]) func gcKeepsWhatIsRecentOrOpen(size: Int) throws {
        let h = try Harness()
        try h.save("a.txt", String(repeating: "o", count: size))
        try h.save("a.txt", String(repeating: "n", count: size))
        try Self.uploadAll(h)
        _ = try h.fs.prune(policy: Self.strict, now: nowNanos() + 1_000_000_000, dryRun: false)
        // Within the grace period the pruned chunk stays; so does one whose time is beyond
        // what nanoseconds hold (a file's mtime in the year 3000: the sweep must not overflow).
        #expect(try h.fs.collectGarbage(grace: 3_600_000_000_000).chunksDeleted == 0)
        if size > SmallChunks.limit {
            for id in h.fs.chunks.allChunkIDs() { try h.fs.chunks.setLastUse(id, seconds: 32_503_680_000) }
            #expect(try h.fs.collectGarbage(grace: 0).chunksDeleted == 0)
            for id in h.fs.chunks.allChunkIDs() { try h.fs.chunks.setLastUse(id, seconds: time(nil)) }
        }
        #expect(try h.fs.collectGarbage(grace: 0).chunksDeleted == 0) // written within the last second
        usleep(1_100_000)
        #expect(try h.fs.collectGarbage(grace: 0).chunksDeleted == 1)
        #expect(try h.read("a.txt") == String(repeating: "n", count: size))
    }

    /// Stress (seeded): while gc runs again and again, a writer saves files whose content
    /// is exactly that of old unreferenced chunks (so every save reuses garbage). No save
    /// may lose a chunk: at the end every version reads back and fsck is clean.
    @Test func gcNeverLosesAChunkACommitReuses() throws {
        let seed = UInt64(environment("UBQ_GC_SEED").flatMap { UInt64($0) } ?? UInt64(nowNanos() & 0xffff))
        print("gcNeverLosesAChunkACommitReuses seed \(seed) (UBQ_GC_SEED=\(seed) replays)")
        var rng = SplitMix64(seed: seed)
        let h = try Harness()
        // 300 garbage chunks, written an hour ago as far as their times say: rows and
        // (every third, over SmallChunks.limit) files.
        // (Over the inline limit, 64 bytes: an inline content is no chunk to lose.)
        let contents = (0..<300).map { "garbage \($0) \(rng.next())" + String(repeating: "+", count: $0 % 3 == 0 ? 3_000 : 64) }
        for text in contents {
            let bytes = Array(text.utf8)
            let id = ChunkID(hashing: bytes)
            try h.fs.chunks.put(id, bytes)
            try h.fs.chunks.setLastUse(id, seconds: time(nil) - 3600)
        }
        let fs = h.fs!
        let stop = Locked(false)
        let collector = JoinableThread {
            while !stop.withLock({ $0 }) { _ = try? fs.collectGarbage(grace: 1_000_000_000) }
        }
        var order = Array(contents.indices)
        for i in order.indices.reversed() { order.swapAt(i, Int(rng.next() % UInt64(i + 1))) }
        for (n, k) in order.enumerated() { try h.save("f\(n % 20).txt", contents[k]) }
        stop.withLock { $0 = true }
        collector.join()
        let fsck = try h.fs.withMetaLock { (_, store) throws(StoreError) in try Fsck.run(store: store) }
        #expect(fsck.problems.isEmpty, "seed \(seed): \(fsck.problems.prefix(5))")
        for n in 0..<20 { #expect(try h.read("f\(n).txt") == contents[order[order.count - 20 + n]], "seed \(seed)") }
    }
}

/// Regression (bench-store at 100,000 files): a gc started through the control attribute
/// was answered when done, and the kernel holds the mount root's inode lock while a
/// setxattr is answered, so every path lookup through the root waited for the whole gc
/// (11 s). The write must return while the gc still runs.
@Suite struct MaintenanceControlTests {
    @Test func gcThroughTheControlAttributeRunsInTheBackground() throws {
        let h = try Harness()
        try h.save("a.txt", "one")
        try h.save("a.txt", "two")
        let control = Array("gc grace=0s".utf8)
        // Hold the metadata lock: a gc answered when done could not finish meanwhile.
        let held = Locked(true)
        let holder = JoinableThread { [fs = h.fs!] in
            fs.meta.withLock { _, _ in while held.withLock({ $0 }) { usleep(1_000) } }
        }
        usleep(50_000)
        #expect(try h.fs.control(Store.rootInode, name: FileSystem.controlAttribute, value: control))
        let running = String(decoding: h.fs.maintenanceReport(Store.rootInode, name: FileSystem.gcAttribute) ?? [], as: UTF8.self)
        #expect(running.hasPrefix("gc: running"), "\(running)")
        #expect(throws: Errno(EBUSY)) { try h.fs.control(Store.rootInode, name: FileSystem.controlAttribute, value: control) }
        held.withLock { $0 = false }
        holder.join()
        h.fs.joinMaintenanceJobs()
        let done = String(decoding: h.fs.maintenanceReport(Store.rootInode, name: FileSystem.gcAttribute) ?? [], as: UTF8.self)
        #expect(done.hasPrefix("gc: read "), "\(done)")
    }
}

/// Space pressure (FileSystem+Space): past the size limit, history goes oldest-first
/// (even what the staggering keeps), never a current version; the log names each.
@Suite struct SpacePressureTests {
    @Test func historyGoesOldestFirstUntilTheStoreFits() throws {
        var options = FileSystem.Options()
        options.retention.minFree = .bytes(0)
        let h = try Harness(options: options)
        // 12 versions of a.bin and 4 of b.bin, 200 KiB each (chunk files, distinct content).
        let version = 204_800
        func content(_ name: String, _ i: Int) -> String { String(repeating: "\(name) \(i) ", count: 60_000).prefix(version).description }
        for i in 0..<12 { try h.save("a.bin", content("a", i)) }
        for i in 0..<4 { try h.save("b.bin", content("b", i)) }
        try MaintenanceTests.uploadAll(h)
        // Written an hour ago (gc under pressure keeps what was used in the last minute).
        for id in h.fs.chunks.allChunkIDs() { try h.fs.chunks.setLastUse(id, seconds: time(nil) - 3600) }
        #expect(h.fs.spacePressure() == nil)
        let size = h.fs.storeBytes()
        // A limit 10.5 versions' worth under the store's size: the oldest go first. (A second
        // FileSystem over the same store, used in turn with the first: options are fixed
        // at creation.)
        var tight = options
        tight.retention.sizeLimit = size - Int64(version * 21 / 2)
        let fs = FileSystem(store: h.fs.withMetaLock { $1 }, options: tight)
        #expect(fs.spacePressure() != nil)
        fs.relieveSpacePressure()
        #expect(fs.spacePressure() == nil, "\(fs.storeBytes()) > \(size - Int64(version * 21 / 2))")
        let a = try h.versionNames("a.bin"), b = try h.versionNames("b.bin")
        // Oldest first: a.bin's old versions went, b.bin's (saved after all of them) stay.
        // (The metadata's write-ahead log grows while pruning, by about half a version's
        // worth here: one of b.bin's may go too, but only after every old one of a.bin.)
        #expect(a.count == 1 && b.count >= 3, "\(a.count) \(b.count)")
        #expect(try h.read("a.bin") == content("a", 11))
        #expect(try h.read("b.bin") == content("b", 3))
    }
}
