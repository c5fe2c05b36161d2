import Glibc
import Testing
import TestSupport
import UbiquityBacking
import UbiquitySystem
@testable import UbiquityFS
@testable import UbiquityStore
@testable import UbiquitySync

/// What a deletion must leave, whenever its tombstone is written. Guards for the attempt
/// of 2026-11-28 (issue 26) that left an own file's tombstone to the next sync step, which
/// a review found wrong on both counts below, and which was taken back.
@Suite struct DeletionTests {
    /// `rm f && echo new > f` (make, git checkout, tar --unlink-first) before the sync
    /// step: the new file continues the deleted one's history, and no device shows the
    /// deleted content as a conflict. With the tombstone left to the step, the history
    /// was still live when the new file was made, so it got a history of its own, and the
    /// old one, no longer shown, was never tombstoned: `.conflicts/f` on every device.
    @Test func aFileDeletedAndMadeAgainBeforeTheStepLeavesNoConflict() throws {
        let temp = TempDirectory(prefix: "ubiquity-deletion")
        defer { temp.cleanup() }
        let (a, b, _) = try PullRaceTests.devices(temp)
        try a.save("f.txt", "old")
        try PullRaceTests.settle([a, b])
        try a.fs.unlink(parent: Store.rootInode, name: "f.txt")
        try a.save("f.txt", "new")
        try PullRaceTests.settle([a, b])
        for d in [a, b] {
            #expect(try d.tree() == ["f.txt": "file new"], "\(d.name)")
            #expect(try d.store.conflictedPaths() == [], "\(d.name)")
        }
    }

    /// Another device's edit that arrives while this device deletes the file (the unlink
    /// happens inside `a`'s pull, as it reads `b`'s segment with the edit) is concurrent
    /// with the deletion and comes back on both devices. A tombstone whose parents were
    /// taken after the edit arrived would delete it everywhere.
    @Test func anEditArrivingDuringADeletionComesBack() throws {
        let temp = TempDirectory(prefix: "ubiquity-deletion")
        defer { temp.cleanup() }
        let (a, b, store) = try PullRaceTests.devices(temp)
        try a.save("f.txt", "first")
        try PullRaceTests.settle([a, b])
        try b.save("f.txt", "edited on b")
        try b.engine.cycle(pushPull: true)

        let fs = a.fs
        try PullRaceTests.cycle(a, store: store) { try? fs.unlink(parent: Store.rootInode, name: "f.txt") }
        try PullRaceTests.settle([a, b])
        #expect(try a.tree() == ["f.txt": "file edited on b"])
        #expect(try b.tree() == ["f.txt": "file edited on b"])
    }
}

extension DeletionTests {
    /// A file whose head is a local-only version at a synced name (a hard link to a vim
    /// swap file, the swap name removed), deleted and made again before the fold. Its
    /// tombstone goes to the overlay unchecked; the fold writes none (a local-only
    /// version is no parent, and no device has a live one), so the new file must not
    /// continue the dead history the overlay showed until then: each version's parents
    /// are versions the store has, and both devices show the new file alone.
    @Test func aNewFileDoesNotContinueAHistoryWhoseTombstoneIsNeverWritten() throws {
        let temp = TempDirectory(prefix: "ubiquity-deletion")
        defer { temp.cleanup() }
        let (a, b, _) = try PullRaceTests.devices(temp)
        try a.save(".f.txt.swp", "scratch")
        try a.store.commitBatch() // the swap file's version is in SQLite, not the overlay
        let swap = try a.fs.lookup(parent: Store.rootInode, name: ".f.txt.swp").ino
        _ = try a.fs.link(swap, parent: Store.rootInode, name: "f.txt")
        try a.fs.unlink(parent: Store.rootInode, name: ".f.txt.swp")
        try a.fs.unlink(parent: Store.rootInode, name: "f.txt")
        try a.save("f.txt", "new")
        try PullRaceTests.settle([a, b])
        let versions = try a.store.db.rows("SELECT id, parents FROM versions", []) { (id: $0.versionID(0), parents: $0.versionIDs(1)) }
        let ids = Set(versions.map(\.id))
        for v in versions { #expect(v.parents.allSatisfy(ids.contains), "version \(v.id.hex) names a parent the store lacks: \(v.parents)") }
        for d in [a, b] {
            #expect(try d.tree() == ["f.txt": "file new"], "\(d.name)")
            #expect(try d.store.conflictedPaths() == [], "\(d.name)")
        }
    }
}
