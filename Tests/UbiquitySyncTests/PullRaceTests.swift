import Glibc
import Testing
import TestSupport
import UbiquityBacking
import UbiquitySystem
@testable import UbiquityFS
@testable import UbiquityStore
@testable import UbiquitySync

/// Local changes made while a cycle's pull waits on the network for other devices'
/// records. They are not recorded before that pull's reconcile (recording there would
/// send back as this device's own the directories an earlier slice made), so the
/// reconcile must leave alone the paths they touched until the next cycle records them.
/// The change is made from the backing store's hook, between the GET of the peer's
/// segment and the reconcile of what it held.
@Suite struct PullRaceTests {
    /// Two devices over one memory store; `a` renames `from` to `to` (at the root) during
    /// the GET of the first peer segment of its next cycle.
    static func devices(_ temp: TempDirectory) throws -> (SimDevice, SimDevice, RecordingStore) {
        let store = RecordingStore(MemoryStore())
        let a = try SimDevice(name: "a", root: temp.path, backing: store, clock: nowNanos, options: SimDevice.alwaysPolling)
        let b = try SimDevice(name: "b", root: temp.path, backing: store, clock: nowNanos, options: SimDevice.alwaysPolling)
        return (a, b, store)
    }

    /// A cycle of `d` that runs `change` during the GET of the first peer segment it
    /// reads: between the cycle's sync step and the reconcile of what that segment held.
    static func cycle(_ d: SimDevice, store: RecordingStore, changingDuringThePull change: @escaping @Sendable () -> Void) throws {
        let ran = Locked(false)
        store.setFault { op, key in
            guard op == .get, key.hasPrefix("log/"), ran.withLock({ done in defer { done = true }; return !done }) else { return nil }
            change()
            return nil
        }
        defer { store.setFault(nil) }
        try d.engine.cycle(pushPull: true)
        #expect(ran.withLock { $0 }, "no peer segment was read")
    }

    static func cycleRenaming(_ a: SimDevice, _ from: String, to: String, store: RecordingStore) throws {
        let fs = a.fs
        try cycle(a, store: store) {
            try? fs.rename(parent: Store.rootInode, name: from, newParent: Store.rootInode, newName: to, flags: 0)
        }
    }

    static func settle(_ devices: [SimDevice]) throws {
        for _ in 0..<3 { for d in devices { try d.engine.cycle(pushPull: true) } }
    }

    /// `a` and `c` in step, then a segment of `a`'s for `c`'s next cycle to read.
    static func devicesWithASegmentToRead(_ temp: TempDirectory) throws -> (SimDevice, SimDevice, RecordingStore) {
        let (a, c, store) = try devices(temp)
        try a.save("seen.txt", "a segment for c to read")
        try settle([a, c])
        try a.save("next.txt", "one more")
        try a.engine.cycle(pushPull: true)
        return (a, c, store)
    }

    /// Saves `text` as a new file through `fs` (from a closure that cannot throw).
    static func create(_ fs: FileSystem, in dir: InodeNumber, _ name: String, _ text: String, caller: Caller) {
        guard let handle = try? fs.create(parent: dir, name: name, mode: 0o644, flags: OpenFlags(O_WRONLY), caller: caller).1 else { return }
        _ = try? Array(text.utf8).withUnsafeBytes { try fs.write(handle, offset: 0, data: $0) }
        try? fs.release(handle)
    }

    /// The known issue this fixed: `d`, renamed to `e` while `b`'s removal of `d/g.txt`
    /// came in, was made again (empty) by that reconcile, and its record stayed.
    @Test func aRenamedDirectoryDoesNotComeBack() throws {
        let temp = TempDirectory(prefix: "ubiquity-race")
        defer { temp.cleanup() }
        let (a, b, store) = try Self.devices(temp)
        try a.save("d/f.txt", "kept")
        try a.save("d/g.txt", "removed on b")
        try Self.settle([a, b])
        let dir = try #require(try b.directory("d", create: false))
        try b.fs.unlink(parent: dir, name: "g.txt")
        try b.engine.cycle(pushPull: true)

        try Self.cycleRenaming(a, "d", to: "e", store: store)
        let during = try a.tree()
        #expect(during["d"] == nil, "\(during)")
        try Self.settle([a, b])
        // A rename against a removal keeps the file (the removal's tombstone does not
        // descend from the rename's record).
        let expected = ["e": "dir 755", "e/f.txt": "file kept", "e/g.txt": "file removed on b"]
        for d in [a, b] {
            let tree = try d.tree()
            #expect(tree == expected, "\(d.name): \(tree)")
        }
    }

    /// `d/f.txt`, moved to `e/f.txt` while `b`'s new `e/f.txt` came in, was taken away for
    /// it (then its record tombstoned): it must stay, a conflict version where it lost.
    @Test func aFileMovedOntoAnIncomingPathIsKept() throws {
        let temp = TempDirectory(prefix: "ubiquity-race")
        defer { temp.cleanup() }
        let (a, b, store) = try Self.devices(temp)
        try a.save("d/f.txt", "from a")
        try Self.settle([a, b])
        try b.save("e/f.txt", "from b")
        try b.engine.cycle(pushPull: true)

        try Self.cycleRenaming(a, "d", to: "e", store: store)
        try Self.settle([a, b])
        let expected = ["e": "dir 755", "e/f.txt": "file from b"]
        for d in [a, b] {
            let tree = try d.tree()
            #expect(tree == expected, "\(d.name): \(tree)")
        }
        for d in [a, b] {
            let conflicts = try d.store.conflicts(at: "e/f.txt")
            #expect(conflicts.count == 1 && conflicts.first?.deviceName == "a", "\(d.name): \(conflicts)")
        }
    }
    /// The t-s3-sync flake: `c` made `t/a/b` and saved `t/a/b/deep.txt` while its cycle's
    /// pull waited on the network. Its push then sent the file's record (made at the save)
    /// without the directories' (made by the next cycle's recording of local changes), `a`
    /// moved `t/a` to `t/moved` with no directory record to tombstone, and `c`'s directory
    /// records, sent next, brought back an empty `t/a/b` everywhere. A push sends its
    /// records with every local change made before them recorded.
    @Test func directoriesMadeDuringAPullGoOutWithTheFilesInThem() throws {
        let temp = TempDirectory(prefix: "ubiquity-race")
        defer { temp.cleanup() }
        let (a, c, store) = try Self.devicesWithASegmentToRead(temp)

        let (fs, me) = (c.fs, c.me)
        try Self.cycle(c, store: store) {
            var dir = Store.rootInode
            for name in ["t", "a", "b"] { dir = (try? fs.mkdir(parent: dir, name: name, mode: 0o755, caller: me).ino) ?? .zero }
            Self.create(fs, in: dir, "deep.txt", "deep", caller: me)
        }

        try a.engine.cycle(pushPull: true)
        #expect(try a.tree()["t/a/b/deep.txt"] == "file deep")
        let t = try #require(try a.directory("t", create: false))
        try a.fs.rename(parent: t, name: "a", newParent: t, newName: "moved", flags: 0)
        try Self.settle([a, c])
        let expected = ["next.txt": "file one more", "seen.txt": "file a segment for c to read", "t": "dir 755",
                        "t/moved": "dir 755", "t/moved/b": "dir 755", "t/moved/b/deep.txt": "file deep"]
        for d in [a, c] {
            let tree = try d.tree()
            #expect(tree == expected, "\(d.name): \(tree)")
        }
    }

    /// The t-on-demand flake: `ubiquity pause` returned while a cycle's pull waited on the
    /// network, a file was saved, and that cycle's push sent it (so `ubiquity evict`
    /// found it uploaded). A save made after the pause returned stays here until resume.
    @Test func aSaveAfterPauseDoesNotGoOutInTheCycleUnderWay() throws {
        let temp = TempDirectory(prefix: "ubiquity-race")
        defer { temp.cleanup() }
        let (a, c, store) = try Self.devicesWithASegmentToRead(temp)

        let (fs, me, engine) = (c.fs, c.me, c.engine)
        try Self.cycle(c, store: store) {
            engine.pause()
            Self.create(fs, in: Store.rootInode, "after-pause.txt", "kept here", caller: me)
        }
        #expect(try a.tree()["next.txt"] != nil && c.tree()["next.txt"] != nil)
        #expect(c.fs.store.withLock { $0.pendingUploadCount } > 0, "the save made after pause went out")
        try a.engine.cycle(pushPull: true)
        #expect(try a.tree()["after-pause.txt"] == nil, "a peer has the save made after pause")

        c.engine.resume()
        try Self.settle([a, c])
        #expect(try a.tree()["after-pause.txt"] == "file kept here")
    }
}
