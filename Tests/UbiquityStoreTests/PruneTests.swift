import Glibc
import Testing
import TestSupport
@testable import UbiquityStore

/// Prune against a real store, with an injected clock.
@Suite struct PruneTests {
    final class Clock: @unchecked Sendable {
        var now: Nanos = 1_000 * RetentionPolicy.week
    }

    /// A store with a file saved `saves` times, one save every `every`, all uploaded.
    static func store(_ dir: TempDirectory, clock: Clock, saves: Int, every: Nanos) throws -> (Store, Inode) {
        let store = try Store(directory: dir.path, deviceName: "unit")
        store.clock = { [clock] in clock.now }
        let f = try store.create(parent: Store.rootInode, name: "f.txt", kind: .file, mode: 0o644, uid: 0, gid: 0)
        for i in 0..<saves {
            let bytes = Array("save \(i)".utf8)
            try store.chunks.put(ChunkID(hashing: bytes), bytes)
            var list = ChunkList()
            list.append(ChunkID(hashing: bytes), size: bytes.count)
            try store.commit(f.id, content: list, path: "f.txt", local: false)
            clock.now += every
        }
        try store.recordLocalChanges(busy: [])
        try store.markUploaded(try store.pendingUploads(limit: 100_000).map(\.id))
        return (store, f)
    }

    @Test func keepsWhatThePolicySaysAndTheCurrentVersion() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let clock = Clock()
        // A save every 10 minutes for 3 days.
        let (store, f) = try Self.store(dir, clock: clock, saves: 3 * 24 * 6, every: 10 * 60 * 1_000_000_000)
        let before = try store.versions(of: f.fileID!)
        let dry = try store.prune(policy: .standard, now: clock.now, limit: 10, dryRun: true)
        #expect(try store.versions(of: f.fileID!).count == before.count) // a dry run changes nothing
        let result = try store.prune(policy: .standard, now: clock.now, limit: 10, dryRun: false)
        #expect(result.versions.count == dry.versions.count)
        let after = try store.versions(of: f.fileID!)
        // The last day whole (144), then one per clock hour for the two days before (48, the
        // first hour bucket holding the version at exactly 24 h).
        #expect(after.count == 144 + 48, "\(after.count)")
        #expect(after.count + result.versions.count == before.count)
        #expect(after.last?.row == store.inode(f.id)?.head) // the current version stays
        #expect(try store.prune(policy: .standard, now: clock.now, dryRun: false).versions.isEmpty) // idempotent
        // keep-within 1 s: only the current version is left.
        var strict = RetentionPolicy.standard
        strict.apply(keepWithin: 1_000_000_000, keepDeletedWithin: nil)
        _ = try store.prune(policy: strict, now: clock.now, dryRun: false)
        #expect(try store.versions(of: f.fileID!).map(\.row) == [store.inode(f.id)!.head!])
        #expect(try store.chunkList(row: store.inode(f.id)!.head!).count == 1)
    }

    @Test func versionsNotUploadedAreKept() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let clock = Clock()
        let (store, f) = try Self.store(dir, clock: clock, saves: 5, every: RetentionPolicy.day)
        let bytes = Array("offline".utf8)
        try store.chunks.put(ChunkID(hashing: bytes), bytes)
        var list = ChunkList()
        list.append(ChunkID(hashing: bytes), size: bytes.count)
        try store.commit(f.id, content: list, path: "f.txt", local: false) // not uploaded
        clock.now += 100 * RetentionPolicy.day
        try store.commit(f.id, content: list, path: "f.txt", local: false)
        var strict = RetentionPolicy.standard
        strict.apply(keepWithin: 1_000_000_000, keepDeletedWithin: nil)
        _ = try store.prune(policy: strict, now: clock.now, dryRun: false)
        #expect(try store.versions(of: f.fileID!).count == 2) // both still waiting for upload
    }

    @Test func deletedFilesGoAfterTheirWindow() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let clock = Clock()
        let (store, f) = try Self.store(dir, clock: clock, saves: 3, every: RetentionPolicy.hour)
        try store.commitTombstone(fileID: f.fileID!, head: store.inode(f.id)!.head, path: "f.txt")
        try store.removeEntry(parent: Store.rootInode, name: "f.txt")
        try store.markUploaded(try store.pendingUploads(limit: 100).map(\.id))
        clock.now += 29 * RetentionPolicy.day
        // Within the window: staggered as any history (the three saves share a day: one stays).
        let first = try store.prune(policy: .standard, now: clock.now, dryRun: false)
        #expect(first.histories == 0 && first.versions.count == 2)
        #expect(try store.historyChildren(of: "").map(\.name) == ["f.txt"])
        clock.now += 2 * RetentionPolicy.day
        let result = try store.prune(policy: .standard, now: clock.now, dryRun: false)
        #expect(result.histories == 1 && result.versions.count == 1)
        #expect(try store.versions(of: f.fileID!).isEmpty)
        #expect(try store.historyChildren(of: "").isEmpty)
    }

    @Test func onlyUnderAPath() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let clock = Clock()
        let (store, f) = try Self.store(dir, clock: clock, saves: 4, every: RetentionPolicy.day)
        var strict = RetentionPolicy.standard
        strict.apply(keepWithin: 1_000_000_000, keepDeletedWithin: nil)
        #expect(try store.prune(policy: strict, now: clock.now, under: "docs", dryRun: false).versions.isEmpty)
        #expect(try store.prune(policy: strict, now: clock.now, under: "f.txt", dryRun: false).versions.count == 3)
        #expect(try store.versions(of: f.fileID!).count == 1)
    }
}
