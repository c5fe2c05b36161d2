import Glibc
import Testing
import TestSupport
import UbiquitySystem
@testable import UbiquityStore

/// Recovery at open after an unclean stop (Store+Recovery): a simulated power loss drops
/// the chunks written after the last durability barrier.
@Suite struct RecoveryTests {

    static func save(_ store: Store, _ id: InodeNumber, _ path: String, _ bytes: [UInt8]) throws -> Version {
        let chunk = ChunkID(hashing: bytes)
        try store.chunks.put(chunk, bytes)
        var list = ChunkList()
        list.append(chunk, size: bytes.count)
        return try store.commit(id, content: list, path: path, local: false)
    }

    static func read(_ store: Store, _ id: InodeNumber) throws -> [UInt8] {
        let content = try store.openContent(id)
        return try content.read(offset: 0, count: 1 << 20)
    }

    @Test func versionsThatLostTheirBytesAreRolledBack() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let old = [UInt8](repeating: 1, count: 3000), lost = [UInt8](repeating: 2, count: 3000)
        let smallLost = Array("never reached the disk".utf8), kept = Array("written, not yet durable".utf8)
        var a = InodeNumber.zero, b = InodeNumber.zero, c = InodeNumber.zero
        var aFile = FileID.zero, durableID = VersionID.zero
        do {
            let store = try Store(directory: dir.path, deviceName: "test")
            a = try store.create(parent: Store.rootInode, name: "a", kind: .file, mode: 0o644, uid: 0, gid: 0).id
            b = try store.create(parent: Store.rootInode, name: "b", kind: .file, mode: 0o644, uid: 0, gid: 0).id
            c = try store.create(parent: Store.rootInode, name: "c", kind: .file, mode: 0o644, uid: 0, gid: 0).id
            durableID = try Self.save(store, a, "a", old).id
            aFile = try #require(store.inode(a)?.fileID)
            try store.syncFiles()
            try store.markDurable()
            // After the barrier: a's second version (a chunk file), b's first (a row), c's first.
            _ = try Self.save(store, a, "a", lost)
            _ = try Self.save(store, b, "b", smallLost)
            _ = try Self.save(store, c, "c", kept)
            try store.commitBatch()
        }
        // The power loss: the chunk file and the row never reached the disk.
        try ChunkDamage.lose(ChunkID(hashing: lost), chunks: dir.path + "/chunks")
        _ = try withDatabase(dir.path + "/chunks/small.sqlite") { (db) throws(StoreError) in
            try db.query("DELETE FROM chunks WHERE id = ?", [.blob(ChunkID(hashing: smallLost).raw)])
        }
        try reboot(dir.path)

        let store = try Store(directory: dir.path)
        #expect(store.recovery.checked == 3)
        #expect(store.recovery.rolledBack.count == 2, "\(store.recovery.rolledBack)")
        #expect(store.recovery.rolledBack.contains { $0.hasPrefix("a: ") && $0.contains(durableID.hex) })
        #expect(store.recovery.rolledBack.contains { $0.hasPrefix("b: ") && $0.contains("no content") })
        #expect(store.recovery.damaged.isEmpty)
        #expect(try Self.read(store, a) == old)
        #expect(store.inode(a)?.size == 3000)
        #expect(try Self.read(store, b) == [])
        #expect(store.inode(b)?.size == 0)
        #expect(try Self.read(store, c) == kept)
        #expect(try store.versions(of: aFile).map(\.id) == [durableID])
        // The synced view agrees: a's current record is the durable version, and only
        // records whose bytes exist are offered for upload.
        #expect(try store.replica.current(.file(aFile))?.id == durableID)
        #expect(try store.pendingUploads(limit: 100).filter { $0.kind == .file }.map(\.path).sorted() == ["a", "c"])
        #expect(try Fsck.run(store: store).problems.isEmpty)
    }

    /// A lost version that a later, intact one descends from is not a head: it goes as
    /// prune would take it, and its parent must not become a head again (a false conflict).
    @Test func aLostMiddleVersionLeavesNoFalseConflict() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let first = [UInt8](repeating: 1, count: 3000), lost = [UInt8](repeating: 2, count: 3000)
        let last = [UInt8](repeating: 3, count: 3000)
        var a = InodeNumber.zero, file = FileID.zero, lastID = VersionID.zero
        do {
            let store = try Store(directory: dir.path, deviceName: "test")
            a = try store.create(parent: Store.rootInode, name: "a", kind: .file, mode: 0o644, uid: 0, gid: 0).id
            file = try #require(store.inode(a)?.fileID)
            _ = try Self.save(store, a, "a", first)
            try store.syncFiles()
            try store.markDurable()
            _ = try Self.save(store, a, "a", lost)
            lastID = try Self.save(store, a, "a", last).id
            try store.commitBatch()
        }
        try ChunkDamage.lose(ChunkID(hashing: lost), chunks: dir.path + "/chunks")
        try reboot(dir.path)
        let store = try Store(directory: dir.path)
        #expect(store.recovery.rolledBack.count == 1)
        #expect(store.recovery.rolledBack.first?.contains("current version still") == true, "\(store.recovery.rolledBack)")
        #expect(try Self.read(store, a) == last)
        #expect(try store.replica.heads(.file(file)).map(\.id) == [lastID])
        #expect(try store.totalConflicts() == 0)
        #expect(try Fsck.run(store: store).problems.isEmpty)
    }

    /// A crash of the process in the boot of the last open: the page cache kept every
    /// write, so the open reads nothing back (a mount after kill -9 serves at once), and
    /// the next barrier flushes the whole store before it marks those versions durable.
    @Test func aCrashInTheSameBootChecksNothingAndTheBarrierFlushesTheStore() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let bytes = [UInt8](repeating: 7, count: 3000)
        do {
            let store = try Store(directory: dir.path, deviceName: "test")
            let a = try store.create(parent: Store.rootInode, name: "a", kind: .file, mode: 0o644, uid: 0, gid: 0).id
            _ = try Self.save(store, a, "a", bytes)
            try store.commitBatch()
        }
        // Not what a crash of the process can do; the open must not look.
        try ChunkDamage.lose(ChunkID(hashing: bytes), chunks: dir.path + "/chunks")
        let store = try Store(directory: dir.path)
        #expect(store.recovery == Store.RecoveryReport())
        #expect(try store.hasUndurableVersions())
        let flushes = store.chunks.wholeStoreFlushes
        try store.syncFiles()
        #expect(store.chunks.wholeStoreFlushes == flushes + 1, "the first barrier flushes what the dead process wrote")
        try store.markDurable()
        try store.syncFiles()
        #expect(store.chunks.wholeStoreFlushes == flushes + 1, "only the first")
        #expect(try !store.hasUndurableVersions())
    }

    @Test func aCleanStopChecksNothing() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        do {
            let store = try Store(directory: dir.path, deviceName: "test")
            let a = try store.create(parent: Store.rootInode, name: "a", kind: .file, mode: 0o644, uid: 0, gid: 0).id
            _ = try Self.save(store, a, "a", Array("fine".utf8))
            try store.syncFiles()
            try store.markDurable()
        }
        let store = try Store(directory: dir.path)
        #expect(store.recovery == Store.RecoveryReport())
    }

    /// A damaged version that was uploaded (or came from another device) is not rolled
    /// back: the backing directory has its bytes, and `fsck --repair` fetches them.
    @Test func anUploadedVersionIsLeftForRepair() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let bytes = [UInt8](repeating: 9, count: 3000)
        do {
            let store = try Store(directory: dir.path, deviceName: "test")
            let a = try store.create(parent: Store.rootInode, name: "a", kind: .file, mode: 0o644, uid: 0, gid: 0).id
            let v = try Self.save(store, a, "a", bytes)
            try store.markUploaded([v.id])
            try store.commitBatch()
        }
        try ChunkDamage.lose(ChunkID(hashing: bytes), chunks: dir.path + "/chunks")
        try reboot(dir.path)
        let store = try Store(directory: dir.path)
        #expect(store.recovery.rolledBack.isEmpty)
        #expect(store.recovery.damaged.count == 1)
        #expect(store.recovery.damaged.first?.contains("missing") == true, "\(store.recovery.damaged)")
    }

    /// Review finding: a barrier marked every version durable, including one saved while
    /// its chunks were being flushed (its chunks possibly not on disk). Only the versions
    /// up to the mark taken before the flush are.
    @Test func aBarrierMarksOnlyTheVersionsBeforeItsFlush() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let store = try Store(directory: dir.path, deviceName: "one")
        let f = try store.create(parent: Store.rootInode, name: "a.txt", kind: .file, mode: 0o644, uid: 1, gid: 1)
        try store.commit(f.id, content: ChunkList(), path: "a.txt", local: false)
        let mark = try store.durabilityMark()
        #expect(mark.row > 0)
        try store.commit(f.id, content: ChunkList(), path: "a.txt", local: false) // during the flush
        try store.markDurable(upTo: mark)
        #expect(try store.hasUndurableVersions())
        #expect(try store.durabilityMark().row > mark.row)
        try store.markDurable(upTo: try store.durabilityMark())
        #expect(try !store.hasUndurableVersions())
        #expect(try store.durabilityMark().row == 0)
    }
}
