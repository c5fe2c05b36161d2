import Glibc
import Testing
import TestSupport
import UbiquityBacking
import UbiquitySystem
@testable import UbiquityFS
@testable import UbiquityStore
@testable import UbiquitySync

/// Requests in proportion to changes (backing format 5): these count requests to the
/// backing store, never time. 2,000 small files are a few PUTs (their chunks ride in
/// their records, 1,000 records a segment); large files' chunks go up in one pack and
/// come down in one ranged GET per pack; an idle engine costs one LIST per look at the
/// log, and looks less often the longer nothing happens.
@Suite struct SyncCostTests {
    static func device(_ name: String, _ temp: TempDirectory, _ store: any BackingStore,
                       options: SyncEngine.Options = SyncEngine.Options()) throws -> SimDevice {
        try SimDevice(name: name, root: temp.path, backing: store, clock: nowNanos, options: options)
    }

    /// A file's whole content, read through the filesystem.
    static func content(of name: String, on d: SimDevice) throws -> [UInt8] {
        let ino = try d.fs.lookup(parent: Store.rootInode, name: name).ino
        let f = try d.fs.open(ino, flags: OpenFlags(O_RDONLY))
        defer { try? d.fs.release(f) }
        var out: [UInt8] = []
        while true {
            let piece = try d.fs.read(f, offset: Int64(out.count), count: 1 << 20)
            if piece.isEmpty { return out }
            out += piece
        }
    }

    /// 1 KiB of text that starts with `i` (each file its own content).
    static func kibibyte(_ i: Int) -> String {
        let head = "file \(i) "
        return head + String(repeating: "x", count: 1024 - head.utf8.count)
    }

    @Test func twoThousandSmallFilesAreAHandfulOfRequests() throws {
        let temp = TempDirectory()
        defer { temp.cleanup() }
        let memory = MemoryStore()
        let store = RecordingStore(memory)
        let a = try Self.device("a", temp, store)
        for i in 0..<2000 { try a.save("dir\(i / 100)/file\(i).txt", Self.kibibyte(i)) }
        try a.engine.cycle(pushPull: true)
        // FORMAT, then 2,020 records (20 directories) in segments of 1,000.
        #expect(store.count(.put) <= 5, "\(store.calls)")
        #expect(store.count(.put, "log/") == 3 && store.count(.put, "packs/") == 0, "\(store.calls)")
        #expect(memory.counts.total <= 10, "\(store.calls)")
        #expect(a.store.pendingUploadCount == 0)

        let b = try Self.device("b", temp, store)
        store.reset()
        try b.engine.cycle(pushPull: true)
        // FORMAT, one LIST of the log, one of devices/, a GET per segment; nothing up.
        #expect(store.count(.get) <= 4 && store.count(.list) <= 3 && store.count(.put) == 0, "\(store.calls)")
        #expect(store.calls.count <= 8, "\(store.calls)")
        let tree = try b.tree()
        #expect(tree.count == 2020)
        #expect(tree["dir7/file777.txt"] == "file " + Self.kibibyte(777))
    }

    /// A big file's packs go up while it is written (PackStager): when the writer closes
    /// it, the push has only the last part of a pack and the segment left, and no chunk
    /// goes up twice. Paused, nothing goes up early; a local-only file never.
    @Test func aBigFileGoesUpWhileItIsWritten() throws {
        print("SyncCostTests.aBigFileGoesUpWhileItIsWritten seed 23")
        var rng = SplitMix64(seed: 23)
        let temp = TempDirectory()
        defer { temp.cleanup() }
        let store = RecordingStore(MemoryStore())
        let a = try Self.device("a", temp, store)
        try a.engine.cycle(pushPull: true) // a cycle that reached the store: staging on
        let content = Array(randomText(20 << 20, &rng).utf8)
        let (attr, handle) = try a.fs.create(parent: Store.rootInode, name: "big.bin", mode: 0o644, flags: OpenFlags(O_WRONLY), caller: a.me)
        for offset in stride(from: 0, to: content.count, by: 1 << 20) {
            _ = try content[offset..<offset + (1 << 20)].withUnsafeBytes { try a.fs.write(handle, offset: Int64(offset), data: $0) }
        }
        // Still open, no push yet: the two full packs are up (or going up).
        var waited = 0
        while store.count(.put, "packs/") < 2 && waited < 500 { usleep(10_000); waited += 1 }
        #expect(store.count(.put, "packs/") == 2 && store.count(.put, "log/") == 0, "\(store.calls)")
        try a.fs.release(handle)
        try a.engine.cycle(pushPull: true)
        // The rest (under 8 MiB) in one more pack, then the segment: nothing twice.
        #expect(store.count(.put, "packs/") == 3 && store.count(.put, "log/") == 1, "\(store.calls)")
        let packed = store.calls.filter { $0.op == .put && $0.key.hasPrefix("packs/") }.map(\.bytes).reduce(0, +)
        #expect(packed > content.count && packed < content.count + (64 << 10), "\(packed) bytes in packs for \(content.count)")
        _ = attr

        let b = try Self.device("b", temp, store)
        try b.engine.cycle(pushPull: true)
        #expect(try Self.content(of: "big.bin", on: b) == content)

        // A local-only file's bytes never leave the device, not even early.
        store.reset()
        try a.save("scratch.nosync", randomText(20 << 20, &rng))
        usleep(200_000)
        try a.engine.cycle(pushPull: true)
        #expect(store.count(.put, "packs/") == 0, "\(store.calls)")

        // Paused: a file written meanwhile goes up only with the push after resuming.
        a.engine.pause()
        try a.engine.cycle(pushPull: false)
        store.reset()
        try a.save("paused.bin", randomText(20 << 20, &rng))
        usleep(200_000)
        #expect(store.count(.put, "packs/") == 0, "\(store.calls)")
        a.engine.resume()
        try a.engine.cycle(pushPull: true)
        #expect(store.count(.put, "packs/") == 3 && store.count(.put, "log/") == 1, "\(store.calls)")
    }

    /// To a backing directory on the store's own disk nothing goes up while a file is
    /// written (the copy would halve the writer's disk bandwidth: issue 26); the push after
    /// the save sends it all, each chunk once. A directory elsewhere, or a bucket, stages.
    @Test func aBackingDirectoryOnTheSameDiskGetsTheFileAfterItsSave() throws {
        print("SyncCostTests.aBackingDirectoryOnTheSameDisk seed 29")
        var rng = SplitMix64(seed: 29)
        let temp = TempDirectory()
        defer { temp.cleanup() }
        #expect(SyncEngine.onTheSameDisk(DirectoryStore(root: temp.path + "/backing/not-made-yet"), temp.path))
        mkdir(temp.path + "/backing", 0o755)
        let directory = DirectoryStore(root: temp.path + "/backing")
        #expect(!SyncEngine.onTheSameDisk(MemoryStore(), temp.path))
        if Self.statDevice("/dev/shm") != Self.statDevice(temp.path) {
            #expect(!SyncEngine.onTheSameDisk(DirectoryStore(root: "/dev/shm/ubiquity-elsewhere"), temp.path))
        }
        let store = RecordingStore(directory)
        let a = try Self.device("a", temp, store)
        #expect(!a.engine.stagesWhileWriting)
        try a.engine.cycle(pushPull: true)
        store.reset()
        let content = Array(randomText(20 << 20, &rng).utf8)
        let (_, handle) = try a.fs.create(parent: Store.rootInode, name: "big.bin", mode: 0o644, flags: OpenFlags(O_WRONLY), caller: a.me)
        for offset in stride(from: 0, to: content.count, by: 1 << 20) {
            _ = try content[offset..<offset + (1 << 20)].withUnsafeBytes { try a.fs.write(handle, offset: Int64(offset), data: $0) }
        }
        usleep(300_000)
        #expect(store.count(.put, "packs/") == 0, "\(store.calls)")
        try a.fs.release(handle)
        try a.engine.cycle(pushPull: true)
        #expect(store.count(.put, "packs/") == 3 && store.count(.put, "log/") == 1, "\(store.calls)")
        let packed = store.calls.filter { $0.op == .put && $0.key.hasPrefix("packs/") }.map(\.bytes).reduce(0, +)
        #expect(packed > content.count && packed < content.count + (64 << 10), "\(packed) bytes in packs for \(content.count)")
        let b = try Self.device("b", temp, store)
        try b.engine.cycle(pushPull: true)
        #expect(try Self.content(of: "big.bin", on: b) == content)
    }

    static func statDevice(_ path: String) -> UInt64 {
        var st = stat()
        return stat(path, &st) == 0 ? UInt64(st.st_dev) : 0
    }

    @Test func largeFilesGoUpInOnePackAndComeDownByPack() throws {
        print("SyncCostTests.largeFiles seed 11")
        var rng = SplitMix64(seed: 11)
        let temp = TempDirectory()
        defer { temp.cleanup() }
        let store = RecordingStore(MemoryStore())
        let a = try Self.device("a", temp, store)
        let files = (0..<5).map { _ in randomText(300 << 10, &rng) }
        for i in 0..<3 { try a.save("big\(i).bin", files[i]) }
        try a.engine.cycle(pushPull: true)
        #expect(store.count(.put, "packs/") == 1 && store.count(.put, "log/") == 1, "\(store.calls)")
        // A second step: its own pack.
        for i in 3..<5 { try a.save("big\(i).bin", files[i]) }
        try a.engine.cycle(pushPull: true)
        #expect(store.count(.put, "packs/") == 2 && store.count(.put, "log/") == 2, "\(store.calls)")
        let packs = store.keys("packs/")
        #expect(packs.count == 2)
        // Several chunks a file (the chunker cuts at 16-256 KiB).
        let chunks = a.fs.chunks.allChunkIDs().filter { (a.fs.chunks.size(of: $0) ?? 0) > RecordCodec.maxInline }
        #expect(chunks.count >= 10)

        let b = try Self.device("b", temp, store)
        store.reset()
        try b.engine.cycle(pushPull: true)
        let packGets = store.calls.filter { $0.op == .get && $0.key.hasPrefix("packs/") }
        // Each segment's chunks: one ranged GET of the pack that holds them, no more bytes
        // than the chunks (the index at the pack's end is not read).
        #expect(packGets.count == 2 && Set(packGets.map(\.key)) == Set(packs), "\(packGets)")
        let fetched = packGets.compactMap(\.range).map(\.count).reduce(0, +)
        #expect(packGets.allSatisfy { $0.range != nil } && fetched == 5 * (300 << 10), "\(packGets)")
        #expect(store.count(.stat) == 0 && store.count(.put) == 0)
        let tree = try b.tree()
        for i in 0..<5 { #expect(tree["big\(i).bin"] == "file " + files[i]) }

        // A file saved again with the same content names the chunks where they are: no
        // upload, no check (the packs were checked within the hour).
        store.reset()
        try a.save("copy.bin", files[0])
        try a.engine.cycle(pushPull: true)
        #expect(store.count(.put, "packs/") == 0 && store.count(.put, "log/") == 1, "\(store.calls)")
        store.reset()
        try b.engine.cycle(pushPull: true)
        #expect(store.count(.get, "packs/") == 0, "\(store.calls)") // b has the chunks
        #expect(try b.tree()["copy.bin"] == "file " + files[0])
    }

    /// After the devices settle, an idle cycle costs at most one LIST (the look at the
    /// log) and nothing else, however many files there are.
    @Test func anIdleEngineCostsOneListACycle() throws {
        let temp = TempDirectory()
        defer { temp.cleanup() }
        let store = RecordingStore(MemoryStore())
        var rng = SplitMix64(seed: 5)
        let a = try Self.device("a", temp, store), b = try Self.device("b", temp, store)
        for i in 0..<300 { try a.save("d\(i % 7)/f\(i)", "small \(i)") }
        try a.save("big", randomText(100_000, &rng))
        try a.kvSet("key", 1)
        for _ in 0..<3 {
            try a.engine.syncNow()
            try b.engine.syncNow()
        }
        let (treeA, treeB) = (try a.tree(), try b.tree())
        #expect(treeA == treeB, "\(Set(treeA.keys).symmetricDifference(treeB.keys).sorted().prefix(10)) \(treeA.count) \(treeB.count)")
        store.reset()
        let cycles = 50
        for _ in 0..<cycles {
            try a.engine.cycle(pushPull: true)
            try b.engine.cycle(pushPull: true)
        }
        #expect(store.count(.list) <= 2 * cycles, "\(store.calls.prefix(20))")
        #expect(store.calls.allSatisfy { $0.op == .list && $0.key == "log/" }, "\(store.calls.filter { $0.op != .list || $0.key != "log/" })")
        // Local cycles (paused, or nothing to do) send nothing at all.
        store.reset()
        for _ in 0..<cycles { try a.engine.cycle(pushPull: false) }
        #expect(store.calls.isEmpty)
    }

    /// With no activity for `activeWindow` (here 0), the wait between looks at the log
    /// doubles from `pollSeconds` up to `idlePollSeconds`: of many cycles, few look.
    /// Activity (a peer's segment found) brings the wait back to `pollSeconds`.
    @Test func anIdleEngineBacksOff() throws {
        let temp = TempDirectory()
        defer { temp.cleanup() }
        let store = RecordingStore(MemoryStore())
        var options = SyncEngine.Options()
        options.activeWindow = 0
        options.pollSeconds = 0.02
        options.idlePollSeconds = 0.16
        let a = try Self.device("a", temp, store), b = try Self.device("b", temp, store, options: options)
        try a.save("x.txt", "hello")
        try a.engine.cycle(pushPull: true)
        try b.engine.cycle(pushPull: true)
        #expect(try b.tree() == ["x.txt": "file hello"])
        // The look that found a's segment was activity: the wait starts over.
        #expect(b.engine.state.withLock { $0.idleWait } == 0)

        store.reset()
        var polls = 0, cycles = 0
        var waits: [Double] = []
        let start = b.engine.bootSecondsDouble()
        var elapsed = 0.0
        while elapsed < 1.0 {
            let before = store.count(.list)
            try b.engine.cycle(pushPull: true)
            cycles += 1
            let listed = store.count(.list) - before
            #expect(listed <= 1)
            if listed == 1 {
                polls += 1
                waits.append(b.engine.state.withLock { $0.idleWait })
            }
            usleep(4000)
            elapsed = b.engine.bootSecondsDouble() - start
        }
        // Each look sets the wait before the next: doubling from pollSeconds to idlePollSeconds.
        let expected = (0..<waits.count).map { min(options.idlePollSeconds, options.pollSeconds * Double(1 << min($0, 20))) }
        #expect(waits == expected)
        // A cycle never looks sooner than its wait: at most this many looks fit in the time
        // the loop ran (fewer on a slow machine).
        var most = 1, waited = 0.0
        for wait in (0..<100).map({ min(options.idlePollSeconds, options.pollSeconds * Double(1 << min($0, 20))) }) {
            waited += wait
            if waited > elapsed { break }
            most += 1
        }
        #expect(polls >= 2 && polls <= most, "\(polls) looks in \(cycles) cycles of \(elapsed) s (at most \(most))")
        #expect(store.calls.allSatisfy { $0.op == .list && $0.key == "log/" }, "\(store.calls)")

        // A sync request looks at once, whatever the wait.
        store.reset()
        try b.engine.syncNow()
        #expect(store.count(.list, "log/") == 1)
    }
}
