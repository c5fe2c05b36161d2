import Glibc
import Testing
import TestSupport
import UbiquityBacking
@testable import UbiquityFS
@testable import UbiquityStore
@testable import UbiquitySync

/// A file version this device makes that its path shows (the only node there) is not
/// checked again at that path by the sync step (issue 26: a dozen statements per new
/// file). Whatever happens to the file before that step must still reach the peer: each
/// later change makes a record of its own, and the paths it leaves are checked.
@Suite struct OwnSaveRecheckTests {
    static func devices(_ temp: TempDirectory) throws -> (SimDevice, SimDevice) {
        let store = MemoryStore()
        let a = try SimDevice(name: "a", root: temp.path, backing: store, clock: nowNanos, options: SimDevice.alwaysPolling)
        let b = try SimDevice(name: "b", root: temp.path, backing: store, clock: nowNanos, options: SimDevice.alwaysPolling)
        return (a, b)
    }

    static func settle(_ devices: [SimDevice]) throws {
        for _ in 0..<3 { for d in devices { try d.engine.cycle(pushPull: true) } }
    }

    @Test func changesAfterASaveBeforeTheSyncStepReachThePeer() throws {
        let temp = TempDirectory(prefix: "ubiquity-recheck")
        defer { temp.cleanup() }
        let (a, b) = try Self.devices(temp)
        try a.save("d/kept.txt", "old")
        try Self.settle([a, b])
        let dir = try #require(try a.directory("d", create: false))
        // Each saved, then changed before any sync step sees the save.
        try a.save("d/moved.txt", "moved")
        try a.fs.rename(parent: dir, name: "moved.txt", newParent: Store.rootInode, newName: "there.txt", flags: 0)
        try a.save("d/gone.txt", "gone")
        try a.fs.unlink(parent: dir, name: "gone.txt")
        try a.save("d/.kept.txt.swp", "new")
        try a.fs.rename(parent: dir, name: ".kept.txt.swp", newParent: dir, newName: "kept.txt", flags: 0)
        try a.save("d/twice.txt", "first")
        try a.save("d/twice.txt", "second")
        try Self.settle([a, b])
        let expected = ["d": "dir 755", "d/kept.txt": "file new", "there.txt": "file moved", "d/twice.txt": "file second"]
        for device in [a, b] {
            let tree = try device.tree()
            for (path, what) in expected { #expect(tree[path] == what, "\(device.name) \(path): \(tree[path] ?? "nothing")") }
            #expect(tree["d/gone.txt"] == nil && tree["d/moved.txt"] == nil && tree["d/.kept.txt.swp"] == nil, "\(device.name): \(tree)")
            let (kept, rebuilt) = try device.fs.withMetaLock { (_, store) throws(StoreError) in try store.viewAsKeptAndRebuilt() }
            #expect(kept == rebuilt)
        }
        #expect(try a.fs.withMetaLock { (_, store) throws(StoreError) in try store.totalConflicts() } == 0)
    }

    /// A save at a path another device's file holds is not alone there: it is checked, and
    /// the conflict shows on both.
    @Test func aSaveWhereAPeerSavedTooIsChecked() throws {
        let temp = TempDirectory(prefix: "ubiquity-recheck")
        defer { temp.cleanup() }
        let (a, b) = try Self.devices(temp)
        try a.save("same.txt", "from a")
        try b.save("same.txt", "from b")
        try Self.settle([a, b])
        for device in [a, b] {
            #expect(try device.fs.withMetaLock { (_, store) throws(StoreError) in try store.totalConflicts() } == 1, "\(device.name)")
            #expect(try device.tree()["same.txt"] == (try a.tree()["same.txt"]))
        }
    }
}
