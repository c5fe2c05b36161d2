import Glibc
import Testing
import TestSupport
import UbiquityBacking
import UbiquitySystem
@testable import UbiquityFS
@testable import UbiquityStore
@testable import UbiquitySync

/// A file of this device's own that is deleted gets its tombstone from the next sync step
/// (issue 26: writing it at the unlink was two thirds of a delete's statements); another
/// device's file, or any file on a store whose sync step has not run, gets it at the unlink.
@Suite struct DeletionTests {
    static func tombstones(_ d: SimDevice) throws -> Int64 {
        try d.store.db.rows("SELECT count(*) FROM versions WHERE tombstone = 1", []) { $0.int(0) }.first ?? -1
    }

    /// Two devices over one memory store, and their settling: as the pull-race tests.
    static func devices(_ temp: TempDirectory) throws -> (SimDevice, SimDevice, RecordingStore) { try PullRaceTests.devices(temp) }
    static func settle(_ devices: [SimDevice]) throws { try PullRaceTests.settle(devices) }

    @Test func anOwnFileIsTombstonedByTheStepAndTheDeletionReachesTheOtherDevice() throws {
        let temp = TempDirectory(prefix: "ubiquity-deletion")
        defer { temp.cleanup() }
        let (a, b, _) = try Self.devices(temp)
        try a.save("own.txt", "made on a")
        try b.save("theirs.txt", "made on b")
        try Self.settle([a, b])
        #expect(try Self.tombstones(a) == 0)

        try a.fs.unlink(parent: Store.rootInode, name: "own.txt")
        #expect(try Self.tombstones(a) == 0, "the unlink wrote the tombstone of a file of this device's own")
        try a.fs.unlink(parent: Store.rootInode, name: "theirs.txt")
        #expect(try Self.tombstones(a) == 1, "another device's file is tombstoned at the unlink")
        try a.engine.cycle(pushPull: false)
        #expect(try Self.tombstones(a) == 2, "the step wrote the own file's tombstone")
        try Self.settle([a, b])
        #expect(try a.tree() == [:])
        #expect(try b.tree() == [:])
    }

    /// A store no sync step has run on (a mount without a backing store) tombstones at
    /// the unlink: nothing else would.
    @Test func withoutASyncStepTheUnlinkTombstones() throws {
        let temp = TempDirectory(prefix: "ubiquity-deletion")
        defer { temp.cleanup() }
        let store = try Store(directory: temp.path + "/store", deviceName: "alone")
        let fs = FileSystem(store: store)
        let (a, h) = try fs.create(parent: Store.rootInode, name: "f.txt", mode: 0o644, flags: OpenFlags(O_WRONLY),
                                   caller: Caller(uid: getuid(), gid: getgid()))
        _ = try Array("x".utf8).withUnsafeBytes { try fs.write(h, offset: 0, data: $0) }
        try fs.release(h)
        _ = a
        try fs.unlink(parent: Store.rootInode, name: "f.txt")
        let count = fs.meta.withLock { m in (try? m.store.db.rows("SELECT count(*) FROM versions WHERE tombstone = 1", []) { $0.int(0) }.first) ?? -1 }
        #expect(count == 1)
        fs.drain()
    }

    /// Another device's edit that arrives between the unlink and the step is not deleted
    /// by the step's tombstone: the step finds it shown and reconcile brings it back, as
    /// an edit concurrent with a delete is kept. The unlink happens inside `a`'s pull,
    /// after its step, while it reads `b`'s segment with the edit.
    @Test func anEditArrivingBeforeTheStepComesBack() throws {
        let temp = TempDirectory(prefix: "ubiquity-deletion")
        defer { temp.cleanup() }
        let (a, b, store) = try Self.devices(temp)
        try a.save("f.txt", "first")
        try Self.settle([a, b])
        try b.save("f.txt", "edited on b")
        try b.engine.cycle(pushPull: true)

        let fs = a.fs
        let deleted = Locked(false)
        store.setFault { op, key in
            guard op == .get, key.hasPrefix("log/"), deleted.withLock({ done in defer { done = true }; return !done }) else { return nil }
            try? fs.unlink(parent: Store.rootInode, name: "f.txt")
            return nil
        }
        try a.engine.cycle(pushPull: true)
        store.setFault(nil)
        #expect(deleted.withLock { $0 }, "no peer segment was read")
        try Self.settle([a, b])
        #expect(try a.tree() == ["f.txt": "file edited on b"])
        #expect(try b.tree() == ["f.txt": "file edited on b"])
    }

    /// The deletion waits in the change set, written with the entry's removal: a
    /// process that stops before the step records it after it opens the store again.
    @Test func aDeletionWaitingForTheStepSurvivesAReopen() throws {
        let temp = TempDirectory(prefix: "ubiquity-deletion")
        let root = temp.path
        defer { temp.cleanup() }
        mkdir(root + "/backing", 0o755)
        do {
            let d = try SimDevice(name: "one", root: root, backing: root + "/backing", clock: nowNanos)
            try d.save("gone.txt", "deleted before the step")
            try d.save("kept.txt", "kept")
            d.cycle()
            try d.fs.unlink(parent: Store.rootInode, name: "gone.txt")
            #expect(try Self.tombstones(d) == 0)
            d.fs.drain()
        }
        let again = try SimDevice(name: "one", root: root, backing: root + "/backing", clock: nowNanos)
        again.cycle()
        #expect(try Self.tombstones(again) == 1)
        mkdir(root + "/two", 0o755)
        let other = try SimDevice(name: "two", root: root + "/two", backing: root + "/backing", clock: nowNanos)
        for _ in 0..<4 { other.cycle() }
        #expect(try other.tree() == ["kept.txt": "file kept"])
    }
}
