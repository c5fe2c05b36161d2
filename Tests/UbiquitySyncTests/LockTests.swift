import Glibc
import Synchronization
import Testing
import TestSupport
import UbiquityBacking
import UbiquitySystem
@testable import UbiquityFS
@testable import UbiquityStore
@testable import UbiquitySync

/// Issue 24, item 6: the store owns its lock, the filesystem keeps only its own state
/// under its lock, and no request to the backing store runs under either (FileSystem's
/// lock list says which lock may be held across a fetch: a file's content lock only).
@Suite struct LockTests {
    /// Counts requests to the backing store made by a thread that holds a filesystem's
    /// lock or a store's lock of any device in the test.
    final class LockWatch: Sendable {
        let locks = Mutex<[(Locked<FileSystem.Meta>, SharedStore)]>([])
        let violations = Mutex<[String]>([])

        func add(_ d: SimDevice) { locks.withLock { $0.append((d.fs.state, d.fs.store)) } }

        func watch(_ store: RecordingStore) {
            store.setFault { [self] op, key in
                let held = locks.withLock { $0.contains { $0.0.isHeldByCurrentThread || $0.1.isHeldByCurrentThread } }
                if held { violations.withLock { $0.append("\(op.rawValue) \(key)") } }
                return nil
            }
        }
    }

    /// A fetch asked for under the filesystem's lock or under the store's (which the sync
    /// engine holds for its steps) is refused and counted; outside both it runs.
    @Test func aFetchUnderEitherLockIsRefused() throws {
        print("LockTests.aFetchUnderEitherLockIsRefused seed 60")
        var rng = SplitMix64(seed: 60)
        let temp = TempDirectory()
        defer { temp.cleanup() }
        let store = RecordingStore(MemoryStore())
        let a = try SyncCostTests.device("a", temp, store)
        try OnDemandTests.write("x.bin", Array(randomText(100 << 10, &rng).utf8), on: a)
        try a.engine.cycle(pushPull: true)
        let b = try SyncCostTests.device("b", temp, store, options: OnDemandTests.onDemand())
        try b.engine.cycle(pushPull: true)
        let ino = try b.fs.lookup(parent: Store.rootInode, name: "x.bin").ino
        let first = try b.fs.store.withLock { (s) throws(StoreError) in try s.chunkList(row: s.inode(ino)!.head!).chunks[0] }
        let chunks = b.fs.store.chunks
        #expect(throws: StoreError.self) { try b.fs.state.withLock { _ in _ = try chunks.read(first.id, size: first.size) } }
        #expect(throws: StoreError.self) { try b.fs.store.withLock { _ in _ = try chunks.read(first.id, size: first.size) } }
        #expect(chunks.fetchStatistics.refusedUnderLock == 2)
        #expect(store.count(.get, "packs/") == 0)
        _ = try chunks.read(first.id, size: first.size)
        #expect(store.count(.get, "packs/") == 1)
    }

    /// Every path that fetches (a read, an old version, a conflict version, a TinyPix
    /// view, the base of a write into the middle of a file, `download`, a read after
    /// `evict`) and every sync step runs its requests outside both locks: a request made
    /// by a thread holding either fails the test, and so does a refused fetch.
    @Test func noRequestRunsUnderTheFilesystemOrStoreLock() throws {
        print("LockTests.noRequestRunsUnderTheFilesystemOrStoreLock seed 61")
        var rng = SplitMix64(seed: 61)
        let temp = TempDirectory()
        defer { temp.cleanup() }
        let store = RecordingStore(MemoryStore())
        let watch = LockWatch()
        watch.watch(store)
        let a = try EvictTests.device("a", temp, store)
        watch.add(a)
        let old = Array(randomText(90 << 10, &rng).utf8)
        var doc = Array(randomText(120 << 10, &rng).utf8)
        var big = Array(randomText(300 << 10, &rng).utf8)
        let other = Array(randomText(70 << 10, &rng).utf8)
        try OnDemandTests.write("doc.txt", old, on: a)
        try a.engine.cycle(pushPull: true)
        try a.save("doc.txt", String(decoding: doc, as: UTF8.self))
        try OnDemandTests.write("big.bin", big, on: a)
        try OnDemandTests.write("other.bin", other, on: a)
        try OnDemandTests.write("shared.txt", Array("base\n".utf8), on: a)
        try a.save("pic.tinypix", "#.......\n.#......\n" + String(repeating: "........\n", count: 6))
        try a.engine.cycle(pushPull: true)

        let b = try EvictTests.device("b", temp, store, onDemand: true)
        watch.add(b)
        try b.engine.cycle(pushPull: true)
        #expect(store.count(.get, "packs/") == 0)
        // Both change shared.txt: b's copy becomes a conflict version on one side.
        try a.save("shared.txt", "from a\n")
        try a.engine.cycle(pushPull: true)
        try b.save("shared.txt", "from b\n")
        try b.engine.cycle(pushPull: true)
        try a.engine.cycle(pushPull: true)

        #expect(try OnDemandTests.read("doc.txt", on: b) == doc)
        #expect(try Self.readVersions(of: "doc.txt", on: b).contains(old))
        #expect(try !Self.readConflicts(of: "shared.txt", on: b).isEmpty)
        let grid = String(decoding: try OnDemandTests.read("pic.tinypix", on: b), as: UTF8.self)
        #expect(grid.hasPrefix("#.......\n.#......\n"))
        let patch = Array("PATCH".utf8)
        let h = try b.fs.open(try b.fs.lookup(parent: Store.rootInode, name: "big.bin").ino, flags: OpenFlags(O_WRONLY))
        _ = try patch.withUnsafeBytes { try b.fs.write(h, offset: 150_000, data: $0) }
        try b.fs.release(h)
        big.replaceSubrange(150_000..<150_000 + patch.count, with: patch)
        #expect(try OnDemandTests.read("big.bin", on: b) == big)
        let otherIno = try b.fs.lookup(parent: Store.rootInode, name: "other.bin").ino
        #expect(b.fs.download(otherIno) == .done(bytes: Int64(other.count)))
        try b.engine.cycle(pushPull: true)
        let docIno = try b.fs.lookup(parent: Store.rootInode, name: "doc.txt").ino
        guard case .done(let freed) = b.fs.evict(docIno), freed > 0 else { Issue.record("evict did not free doc.txt"); return }
        #expect(try OnDemandTests.read("doc.txt", on: b) == doc)
        doc = []

        #expect(b.fs.store.chunks.fetchStatistics.refusedUnderLock == 0)
        #expect(a.fs.store.chunks.fetchStatistics.refusedUnderLock == 0)
        #expect(watch.violations.withLock { $0 } == [])
        #expect(store.count(.get, "packs/") > 0)
    }

    /// The contents of every version of `name` under `.versions/`.
    static func readVersions(of name: String, on d: SimDevice) throws -> [[UInt8]] {
        let dir = try d.fs.lookup(parent: try d.fs.lookup(parent: Store.rootInode, name: ".versions").ino, name: name).ino
        return try readAll(in: dir, on: d)
    }

    /// The contents of the conflict versions of `name` under `.conflicts/`.
    static func readConflicts(of name: String, on d: SimDevice) throws -> [[UInt8]] {
        let dir = try d.fs.lookup(parent: try d.fs.lookup(parent: Store.rootInode, name: ".conflicts").ino, name: name).ino
        return try readAll(in: dir, on: d)
    }

    static func readAll(in dir: InodeNumber, on d: SimDevice) throws -> [[UInt8]] {
        let handle = try d.fs.opendir(dir)
        defer { d.fs.releasedir(handle) }
        return try d.fs.readdir(handle).filter { $0.name != "." && $0.name != ".." }.map { entry in
            let f = try d.fs.open(try d.fs.lookup(parent: dir, name: entry.name).ino, flags: OpenFlags(O_RDONLY))
            defer { try? d.fs.release(f) }
            return try d.fs.read(f, offset: 0, count: 1 << 20)
        }
    }
}
