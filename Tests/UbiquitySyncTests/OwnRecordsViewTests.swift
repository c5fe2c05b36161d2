import Glibc
import Testing
import TestSupport
@testable import UbiquityFS
@testable import UbiquityStore
@testable import UbiquitySync

/// This device's own records enter the synced view in the sync step, not in the fold
/// (store format 21, `Index.viewOwnRecords`): what reads the view between the two (a pull,
/// prune, a delete's tombstone, an open after a crash) must not see a view that lacks them.
@Suite struct OwnRecordsViewTests {
    /// Folds what the overlay holds, and nothing more (no sync step).
    static func fold(_ d: SimDevice) throws {
        try d.fs.withMetaLock { (_, store) throws(StoreError) in try store.commitBatch() }
    }

    static func unviewedRows(_ d: SimDevice) throws -> Int64 {
        try d.fs.withMetaLock { (_, store) throws(StoreError) -> Int64 in
            try store.db.rows("SELECT count(*) FROM versions WHERE viewed = 0", []) { $0.int(0) }.first ?? -1
        }
    }

    /// Devices a and b syncing through one backing directory, both with a file `f`
    /// ("one") a made.
    static func twoDevicesWithAFile(in temp: TempDirectory) throws -> (SimDevice, SimDevice) {
        let backing = temp.path + "/backing"
        mkdir(backing, 0o755)
        let a = try SimDevice(name: "a", root: temp.path, backing: backing, clock: nowNanos, options: SimDevice.alwaysPolling)
        let b = try SimDevice(name: "b", root: temp.path, backing: backing, clock: nowNanos, options: SimDevice.alwaysPolling)
        try a.save("f", "one")
        a.cycle()
        b.cycle()
        #expect(try b.tree()["f"] == "file one")
        return (a, b)
    }

    static func fileID(_ d: SimDevice, _ name: String) throws -> FileID {
        let ino = try d.fs.lookup(parent: Store.rootInode, name: name).ino
        return try #require(d.fs.withMetaLock { (_, store) in store.inode(ino)?.fileID })
    }

    /// A save's record waits, unviewed, between its fold and the sync step; the step's
    /// catch-up views it, and the view is then what building it from the records gives.
    @Test func aFoldedSaveEntersTheViewAtTheSyncStep() throws {
        let temp = TempDirectory(prefix: "ubiquity-ownview")
        defer { temp.cleanup() }
        let d = try SimDevice(name: "a", root: temp.path, backing: temp.path + "/backing", clock: nowNanos)
        try d.save("a.txt", "one")
        try Self.fold(d)
        let node = NodeID.file(try Self.fileID(d, "a.txt"))
        #expect(try Self.unviewedRows(d) == 1)
        try d.fs.withMetaLock { (_, store) throws(StoreError) in
            #expect(try store.replica.current(node) == nil)
            let (kept, rebuilt) = try store.viewAsKeptAndRebuilt()
            #expect(kept == rebuilt)
            try store.recordLocalChanges(busy: [])
            #expect(try store.replica.current(node)?.path == "a.txt")
            let (keptAfter, rebuiltAfter) = try store.viewAsKeptAndRebuilt()
            #expect(keptAfter == rebuiltAfter)
        }
        #expect(try Self.unviewedRows(d) == 0)
    }

    /// Killed between the fold and the sync step: the rows stay unviewed in SQLite, the
    /// open finds them, and the first step views them (and the upload offers them).
    @Test func anOpenAfterTheFoldViewsWhatTheFoldWrote() throws {
        let temp = TempDirectory(prefix: "ubiquity-ownview")
        defer { temp.cleanup() }
        var node: NodeID?
        do {
            let d = try SimDevice(name: "a", root: temp.path, backing: temp.path + "/backing", clock: nowNanos)
            try d.save("a.txt", "one")
            try Self.fold(d)
            node = .file(try Self.fileID(d, "a.txt"))
            #expect(try Self.unviewedRows(d) == 1)
        }
        let store = try Store(directory: temp.path + "/a-store")
        #expect(store.index.mayHaveUnviewed)
        #expect(try store.replica.current(try #require(node)) == nil)
        try store.recordLocalChanges(busy: [])
        #expect(try store.replica.current(try #require(node))?.path == "a.txt")
        #expect(!store.index.mayHaveUnviewed)
        #expect(try store.pendingUploads(limit: 10).contains { $0.node == node && !$0.isTombstone })
    }

    /// A pull that meets a save folded since the last sync step: the other device's edit
    /// of the same version is a conflict, and the later save (this one) stays shown.
    /// Without the catch-up before the pull, the other device's record was the file's
    /// only head, and the pull put its content over the local save.
    @Test func aPullMeetsASaveFoldedSinceTheLastStep() throws {
        let temp = TempDirectory(prefix: "ubiquity-ownview")
        defer { temp.cleanup() }
        let (a, b) = try Self.twoDevicesWithAFile(in: temp)
        try a.save("f", "from a")
        a.cycle()
        // a's edit (b has the rest), as a pull slice takes it.
        let fromA = try a.fs.withMetaLock { (_, store) throws(StoreError) in
            try store.ownRecords("1 = 1", after: 0, limit: 100).map(\.record).suffix(1)
        }
        try b.save("f", "from b")
        try Self.fold(b)
        #expect(try Self.unviewedRows(b) == 1)
        _ = try b.fs.withMetaLock { (_, store) throws(StoreError) in try store.takeIn(Array(fromA), busy: []) }
        #expect(try b.tree()["f"] == "file from b")
        #expect(b.conflicts()["f"]?.count == 1)
        #expect(try Self.unviewedRows(b) == 0)
    }

    /// Space pressure between folds and the sync step (t-space: a disk filled by saves
    /// that no sync step had run after): pruneOldest has the view take them in first,
    /// then drops what no head or inode holds, the edit the next one superseded among them.
    @Test func pruneOldestViewsWhatWasFoldedFirst() throws {
        let temp = TempDirectory(prefix: "ubiquity-ownview")
        defer { temp.cleanup() }
        let d = try Self.deviceWithFoldedEdits(in: temp)
        let dropped = try d.fs.withMetaLock { (_, store) throws(StoreError) in try store.pruneOldest(limit: 100, after: 0) }
        // f's first version and the edit the next one superseded, and g's version.
        #expect(dropped.versions.map(\.path).sorted() == ["f", "f", "g"])
        #expect(try Self.unviewedRows(d) == 0)
        try Self.expectViewAndTree(d)
    }

    /// The same when the view cannot take them in (a statement fails, as on a full disk):
    /// records the view lacks are not known not to be heads, so they stay. Dropped, the
    /// superseded edit left the view awaiting it for good as its child's parent (a lookup
    /// more for every record taken in after).
    @Test func pruneOldestKeepsRecordsTheViewLacks() throws {
        let temp = TempDirectory(prefix: "ubiquity-ownview")
        defer { temp.cleanup() }
        let d = try Self.deviceWithFoldedEdits(in: temp)
        let dropped = try d.fs.withMetaLock { (_, store) throws(StoreError) in
            store.db.failingStatements = [store.db.statements + 1]
            defer { store.db.failingStatements = [] }
            return try store.pruneOldest(limit: 100, after: 0)
        }
        // f's and g's first versions are still the view's heads, and the rest unviewed.
        #expect(dropped.versions.isEmpty)
        #expect(try Self.unviewedRows(d) == 3)
        try Self.expectViewAndTree(d)
    }

    /// A device whose f has two edits and whose g is deleted since the last sync step,
    /// all three folded.
    static func deviceWithFoldedEdits(in temp: TempDirectory) throws -> SimDevice {
        let d = try SimDevice(name: "a", root: temp.path, backing: temp.path + "/backing", clock: nowNanos)
        try d.save("f", "one")
        try d.save("g", "one")
        d.cycle()
        for text in ["two", "three"] {
            try d.save("f", text)
            try fold(d)
        }
        try d.fs.unlink(parent: Store.rootInode, name: "g")
        try fold(d)
        #expect(try unviewedRows(d) == 3)
        return d
    }

    /// After a sync step: f shows its last edit, g is gone, nothing waits for a parent,
    /// and the view is what its records build.
    static func expectViewAndTree(_ d: SimDevice) throws {
        d.cycle()
        #expect(try d.tree() == ["f": "file three"])
        try d.fs.withMetaLock { (_, store) throws(StoreError) in
            #expect(try store.db.rows("SELECT count(*) FROM view_awaited", []) { $0.int(0) } == [0])
            let (kept, rebuilt) = try store.viewAsKeptAndRebuilt()
            #expect(kept == rebuilt)
        }
    }

    /// An edit and a delete between two sync steps: the tombstone descends from the edit
    /// alone (as when the edit was in the view at once), not from the edit and the
    /// version it replaced, which the view still holds as the file's head.
    @Test func aTombstoneOfAnUnviewedEditDescendsFromItAlone() throws {
        let temp = TempDirectory(prefix: "ubiquity-ownview")
        defer { temp.cleanup() }
        let d = try SimDevice(name: "a", root: temp.path, backing: temp.path + "/backing", clock: nowNanos)
        try d.save("f", "one")
        d.cycle()
        let fileID = try Self.fileID(d, "f")
        try d.save("f", "two")
        try Self.fold(d)
        try d.fs.unlink(parent: Store.rootInode, name: "f")
        try Self.fold(d)
        #expect(try Self.unviewedRows(d) == 2)
        let (edit, tombstoneParents) = try d.fs.withMetaLock { (_, store) throws(StoreError) -> (VersionID?, [VersionID]) in
            let rows = try store.db.rows("SELECT id, parents, tombstone FROM versions WHERE file_id = ? ORDER BY row", [.id(fileID)]) {
                (id: $0.versionID(0), parents: $0.versionIDs(1), tombstone: $0.int(2) != 0)
            }
            return (rows.dropLast().last?.id, rows.last?.tombstone == true ? rows.last!.parents : [])
        }
        #expect(tombstoneParents == [try #require(edit)])
        d.cycle()
        #expect(try d.tree()["f"] == nil)
        try d.fs.withMetaLock { (_, store) throws(StoreError) in
            let (kept, rebuilt) = try store.viewAsKeptAndRebuilt()
            #expect(kept == rebuilt)
            #expect(try store.replica.current(.file(fileID)) == nil)
        }
    }

    /// A file moved to a local-only name and deleted before the sync step: its save never
    /// entered the view, and the step still tells the other devices the file is gone.
    @Test func aFileMovedToALocalNameAndDeletedIsGoneForThePeer() throws {
        let temp = TempDirectory(prefix: "ubiquity-ownview")
        defer { temp.cleanup() }
        let (a, b) = try Self.twoDevicesWithAFile(in: temp)
        try a.save("f", "two")
        try Self.fold(a)
        try a.fs.rename(parent: Store.rootInode, name: "f", newParent: Store.rootInode, newName: "f.swp", flags: 0)
        try Self.fold(a)
        try a.fs.unlink(parent: Store.rootInode, name: "f.swp")
        try Self.fold(a)
        a.cycle()
        b.cycle()
        #expect(try a.tree()["f"] == nil)
        #expect(try b.tree()["f"] == nil)
    }
}
