import Glibc
import Testing
import TestSupport
import UbiquitySystem
@testable import UbiquityFS
@testable import UbiquityStore

/// `.versions/` reads through the versions' reader (`VersionLog`), its own connection and
/// lock, once the index is brought up to the request (`SharedStore.prepareVersionReads`):
/// no statement, fold or settling of moves runs under the store's lock for it, and with
/// the index current it takes that lock not at all.
@Suite struct VersionReadsTests {
    /// Everything a reader of `.versions/` does: look up, list, stat and read the
    /// versions of `d/a`, which has `count` versions, the newest `newest`.
    static func readVersions(_ h: Harness, count: Int, newest: String) throws {
        let fs = h.fs!
        let root = try fs.lookup(parent: Store.rootInode, name: ".versions")
        let listed = try list(fs, root.ino)
        #expect(listed.map(\.name).contains("d"))
        let d = try fs.lookup(parent: root.ino, name: "d")
        #expect(try list(fs, d.ino).map(\.name) == ["a"])
        let a = try fs.lookup(parent: d.ino, name: "a")
        let versions = try list(fs, a.ino)
        #expect(versions.count == count)
        guard let last = versions.last else { return }
        let looked = try fs.lookup(parent: a.ino, name: last.name)
        #expect(try fs.getattr(looked.ino).size == Int64(newest.utf8.count))
        let handle = try fs.open(looked.ino, flags: OpenFlags(O_RDONLY))
        let bytes = try fs.read(handle, offset: 0, count: 4096)
        try fs.release(handle)
        #expect(String(decoding: bytes, as: UTF8.self) == newest)
        for ino in [root.ino, d.ino, a.ino, looked.ino] { fs.forget(ino, count: 1) }
    }

    static func list(_ fs: FileSystem, _ ino: InodeNumber) throws -> [DirectoryEntry] {
        let handle = try fs.opendir(ino)
        defer { fs.releasedir(handle) }
        return try fs.readdir(handle)
    }

    static func setUp() throws -> Harness {
        let h = try Harness()
        let d = try h.fs.mkdir(parent: Store.rootInode, name: "d", mode: 0o755, caller: h.me).ino
        for text in ["one", "two", "three"] { try h.save("a", text, in: d) }
        return h
    }

    @Test func versionRequestsTakeNotTheStoresLockOnceTheIndexIsCurrent() throws {
        let h = try Self.setUp()
        try Self.readVersions(h, count: 3, newest: "three") // brings the index up to now
        let before = h.fs.store.acquisitions
        for _ in 0..<20 { try Self.readVersions(h, count: 3, newest: "three") }
        #expect(h.fs.store.acquisitions == before, "acquisitions of the store's lock by 20 rounds of reads of .versions/")
    }

    /// The store's lock held by another thread until the reads are done, or for a minute:
    /// reads that needed it would wait the minute out.
    @Test func versionRequestsGoOnWhileAnotherThreadHoldsTheStoresLock() throws {
        let h = try Self.setUp()
        try Self.readVersions(h, count: 3, newest: "three")
        let finished = try ReaderLockTests.whileAnotherThreadHoldsTheStoresLock(h.fs) { () throws in
            try Self.readVersions(h, count: 3, newest: "three")
        }
        #expect(finished, "the reads of .versions/ finished while the store's lock was held")
    }

    /// A save the overlay holds, and a directory moved and not settled, show at the next
    /// read: the request folds and settles them first, the fold in parts with the lock let
    /// go when there are many.
    @Test func whatTheOverlayHoldsShowsAtTheNextRead() throws {
        let h = try Self.setUp()
        try Self.readVersions(h, count: 3, newest: "three")
        let d = try h.fs.lookup(parent: Store.rootInode, name: "d").ino
        try h.save("a", "four", in: d)
        try Self.readVersions(h, count: 4, newest: "four")

        let many = try h.fs.mkdir(parent: Store.rootInode, name: "many", mode: 0o755, caller: h.me).ino
        for i in 0..<(Store.foldAheadLeaves + 200) { try h.save("f\(i)", "x", in: many) }
        let parts = h.fs.withMetaLock { $1.foldsBegun }
        let versions = try h.fs.lookup(parent: Store.rootInode, name: ".versions").ino
        let listed = try Self.list(h.fs, try h.fs.lookup(parent: versions, name: "many").ino)
        #expect(listed.count == Store.foldAheadLeaves + 200)
        #expect(h.fs.withMetaLock { $1.foldsBegun } > parts, "the burst was folded in the group commit's parts")

        try h.fs.rename(parent: Store.rootInode, name: "many", newParent: Store.rootInode, newName: "moved", flags: 0)
        #expect(h.fs.withMetaLock { $1.hasUnsettledMoves }, "the move waits to be settled")
        let moved = try Self.list(h.fs, try h.fs.lookup(parent: versions, name: "moved").ino)
        #expect(moved.count == Store.foldAheadLeaves + 200)
        #expect(!h.fs.withMetaLock { $1.hasUnsettledMoves })
    }

    /// A big move is settled a slice a hold (`SharedStore.settleMoves`, which a read of
    /// `.versions/`, prune and a pull slice call first), not in one hold.
    @Test func aBigMoveIsSettledASliceAHold() throws {
        let h = try Harness()
        let many = try h.fs.mkdir(parent: Store.rootInode, name: "many", mode: 0o755, caller: h.me).ino
        let files = Store.movedEntriesPerSlice * 4
        for i in 0..<files { try h.save("f\(i)", "x", in: many) }
        try h.fs.store.prepareVersionReads()
        try h.fs.rename(parent: Store.rootInode, name: "many", newParent: Store.rootInode, newName: "moved", flags: 0)
        #expect(h.fs.withMetaLock { $1.hasUnsettledMoves })
        let before = h.fs.store.acquisitions
        try h.fs.store.settleMoves()
        #expect(h.fs.store.acquisitions - before > UInt(files / Store.movedEntriesPerSlice), "holds of the store's lock")
        #expect(!h.fs.withMetaLock { $1.hasUnsettledMoves })
    }

    /// Random saves, renames of files and directories, deletes, new directories and
    /// remounts (the log replayed); at random moments the whole of `.versions/` read
    /// through the filesystem (the versions' reader) equals what the store shows under its
    /// lock through the gate.
    @Test func theReaderShowsWhatTheStoreShows() throws {
        let seed = UInt64.random(in: 0 ... .max)
        print("VersionReadsTests.theReaderShowsWhatTheStoreShows seed \(seed)")
        var random = SplitMix64(seed: seed)
        let h = try Harness()
        var directories: [InodeNumber] = [Store.rootInode]
        for step in 0..<400 {
            if random.next() % 50 == 0 { try h.remount() }
            let fs = h.fs!
            let parent = directories[Int(random.next() % UInt64(directories.count))]
            let name = "n\(random.next() % 6)"
            switch random.next() % 10 {
            case 0...4:
                _ = try? h.save(name, String(repeating: "s", count: Int(random.next() % 40)), in: parent)
            case 5:
                if let made = try? fs.mkdir(parent: parent, name: name, mode: 0o755, caller: h.me) { directories.append(made.ino) }
            case 6, 7:
                let target = directories[Int(random.next() % UInt64(directories.count))]
                try? fs.rename(parent: parent, name: name, newParent: target, newName: "n\(random.next() % 6)", flags: 0)
            default:
                try? fs.unlink(parent: parent, name: name)
            }
            if random.next() % 40 == 0 || step == 399 {
                let seen = try Self.walk(fs)
                let shown = try fs.withMetaLock { (_, store) throws in try Self.walk(store) }
                #expect(seen == shown, "seed \(seed), step \(step)")
                if step == 399 { #expect(seen.contains { $0.hasPrefix("H ") }, "seed \(seed): histories were compared") }
            }
        }
    }

    /// `.versions/` through the filesystem, one line per node: a directory, a history
    /// with its versions' sizes and times, or nothing below.
    static func walk(_ fs: FileSystem) throws -> [String] {
        var lines: [String] = []
        func visit(_ ino: InodeNumber, _ path: String) throws {
            let entries = try list(fs, ino)
            if entries.isEmpty {
                lines.append("E \(path)")
            } else if entries.allSatisfy(\.attributes.isDirectory) {
                lines.append("D \(path)")
                for entry in entries { try visit(entry.attributes.ino, path.isEmpty ? entry.name : path + "/" + entry.name) }
            } else {
                lines.append("H \(path) " + entries.map { "\($0.attributes.size)@\($0.attributes.mtime)" }.joined(separator: ","))
            }
        }
        try visit(try fs.lookup(parent: Store.rootInode, name: ".versions").ino, "")
        return lines.sorted()
    }

    /// The same, from the store under its lock.
    static func walk(_ store: any FileSystemStore) throws -> [String] {
        var lines: [String] = []
        func visit(_ path: String, isHistory: Bool) throws {
            if isHistory {
                var all: [Version] = []
                for id in try store.histories(at: path) { all += try store.versions(of: id) }
                all.sort { ($0.committed, $0.id) < ($1.committed, $1.id) }
                lines.append(all.isEmpty ? "E \(path)" : "H \(path) " + all.map { "\($0.size)@\($0.committed)" }.joined(separator: ","))
                return
            }
            let children = try store.historyChildren(of: path)
            lines.append(children.isEmpty ? "E \(path)" : "D \(path)")
            for child in children { try visit(path.isEmpty ? child.name : path + "/" + child.name, isHistory: child.isHistory) }
        }
        try visit("", isHistory: false)
        return lines.sorted()
    }
}
