import Glibc
import Testing
import TestSupport
import UbiquityBacking
@testable import UbiquityFS
@testable import UbiquityStore
@testable import UbiquitySync

/// Paths are split at their slashes by byte (`PathBytes`). Regression: sync split them by
/// Swift `Character`, which joins a "/" with a combining mark after it, so a name that
/// begins with one ("d/\u{301}x") was one name at the root: the view placed it there, the
/// sync step did not find the file it had just recorded, and a record path that hid a
/// ".." that way passed the check of incoming paths.
@Suite struct PathBytesTests {
    @Test func aSlashBeforeACombiningMarkSplitsThePath() {
        let path = "d/\u{301}x"
        #expect(path.lastIndex(of: "/") == nil) // what a split by Character misses
        let split = PathBytes.split(path)
        #expect(split.map { Array($0.parent.utf8) } == Array("d".utf8))
        #expect(split.map { Array($0.name.utf8) } == Array("\u{301}x".utf8))
        #expect(PathBytes.ancestors("a/\u{301}b/c").map { Array($0.utf8) } == [Array("a/\u{301}b".utf8), Array("a".utf8)])
        #expect(PathBytes.components("a//b", keepingEmpty: true) == ["a", "", "b"])
        #expect(SyncPath.problem("a/../\u{301}x") != nil)
        #expect(SyncPath.problem("a/\u{301}x") == nil)
    }

    @Test func aNameThatBeginsWithACombiningMarkSyncsWhereItIs() throws {
        let temp = TempDirectory(prefix: "ubiquity-pathbytes")
        defer { temp.cleanup() }
        let backing = MemoryStore()
        let a = try SimDevice(name: "a", root: temp.path, backing: backing, clock: nowNanos, options: SimDevice.alwaysPolling)
        let b = try SimDevice(name: "b", root: temp.path, backing: backing, clock: nowNanos, options: SimDevice.alwaysPolling)
        try a.save("d/\u{301}x.txt", "deep")
        try a.save("\u{301}y.txt", "top")
        for _ in 0..<4 {
            a.cycle()
            b.cycle()
        }
        let expected = ["64 dir 755", "64.2f.cc.81.78.2e.74.78.74 file deep", "cc.81.79.2e.74.78.74 file top"]
        #expect(try FreshRecordsTests.tree(of: a) == expected)
        #expect(try FreshRecordsTests.tree(of: b) == expected)
        for device in [a, b] {
            let tombstones = try device.store.db.rows("SELECT count(*) FROM versions WHERE tombstone = 1", []) { $0.int(0) }
            #expect(tombstones == [0], "\(device.name)")
            let (kept, rebuilt) = try device.fs.withMetaLock { (_, store) throws(StoreError) in try store.viewAsKeptAndRebuilt() }
            #expect(kept == rebuilt, "\(device.name)")
        }
    }
}
