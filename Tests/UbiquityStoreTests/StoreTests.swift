import Glibc
import Testing
import TestSupport
import UbiquitySystem
@testable import UbiquityStore

@Suite struct StoreTests {
    @Test func treeAndVersionsPersistAcrossReopen() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        var fileID = ""
        do {
            let store = try Store(directory: dir.path, deviceName: "test")
            let d = try store.create(parent: Store.rootInode, name: "docs", kind: .directory, mode: 0o755, uid: 1, gid: 1)
            let f = try store.create(parent: d.id, name: "a.txt", kind: .file, mode: 0o644, uid: 1, gid: 1)
            fileID = f.fileID!
            var list = ChunkList()
            let bytes = Array("hello".utf8)
            let id = ChunkID(hashing: bytes)
            try store.chunks.put(id, bytes)
            list.append(id, size: bytes.count)
            let v1 = try store.commit(f.id, content: list, path: "docs/a.txt", local: false)
            let v2 = try store.commit(f.id, content: list, path: "docs/a.txt", local: false)
            #expect(v2.parents == [v1.id])
            #expect(v1.parents.isEmpty)
        }
        let store = try Store(directory: dir.path)
        #expect(store.deviceName == "test")
        let d = try #require(store.child(Store.rootInode, "docs"))
        let f = try #require(store.child(d, "a.txt"))
        #expect(store.path(of: f) == "docs/a.txt")
        #expect(try store.versions(of: fileID).count == 2)
        #expect(store.inode(f)?.size == 5)
        #expect(store.inode(Store.rootInode)?.nlink == 3)
    }

    /// A format-2 store (before sparse files and indexed history views) opens: the new
    /// column and table are added, `history_dirs` is built from `histories`, and a newer
    /// store is refused by name rather than misread.
    @Test func formatTwoStoreIsUpgraded() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        do {
            let store = try Store(directory: dir.path, deviceName: "old")
            let d = try store.create(parent: Store.rootInode, name: "docs", kind: .directory, mode: 0o755, uid: 1, gid: 1)
            let f = try store.create(parent: d.id, name: "a.txt", kind: .file, mode: 0o644, uid: 1, gid: 1)
            var list = ChunkList()
            let bytes = Array("hello".utf8)
            try store.chunks.put(ChunkID(hashing: bytes), bytes)
            list.append(ChunkID(hashing: bytes), size: bytes.count)
            try store.commit(f.id, content: list, path: "docs/a.txt", local: false)
            // Back to format 2, as the previous release wrote it.
            try store.db.execute("DROP TABLE history_dirs")
            try store.db.execute("ALTER TABLE inodes DROP COLUMN allocated")
            try store.db.execute("UPDATE settings SET value = '2' WHERE key = 'format'")
        }
        do {
            let store = try Store(directory: dir.path)
            #expect(try store.historyChildren(of: "").map(\.name) == ["docs"])
            #expect(try store.historyChild(of: "docs", name: "a.txt") == true)
            let docs = try #require(store.child(Store.rootInode, "docs"))
            let f = try #require(store.child(docs, "a.txt"))
            #expect(store.inode(f)?.allocated == 5)
            try store.db.execute("UPDATE settings SET value = '99' WHERE key = 'format'")
        }
        #expect(throws: StoreError.self) { try Store(directory: dir.path) }
    }

    @Test func secondOpenIsRefusedWhileLocked() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let first = try Store(directory: dir.path)
        #expect(throws: StoreError.self) { try Store(directory: dir.path) }
        _ = first
        // A read-only inspection (status, fsck) works beside it.
        #expect(try Store(directory: dir.path, readOnly: true).deviceID == first.deviceID)
    }

    @Test func localVersionsKeepOnlyTheLatest() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let store = try Store(directory: dir.path)
        let f = try store.create(parent: Store.rootInode, name: "x.swp", kind: .file, mode: 0o644, uid: 0, gid: 0)
        for _ in 0..<3 { try store.commit(f.id, content: ChunkList(), path: "x.swp", local: true) }
        #expect(try store.versions(of: f.fileID!).isEmpty)
        #expect(try store.historyChildren(of: "").isEmpty)
        let rows = try store.db.rows("SELECT count(*) FROM versions", []) { $0.int(0) }
        #expect(rows == [1])
    }

    @Test func fsckFindsDamage() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let store = try Store(directory: dir.path)
        let f = try store.create(parent: Store.rootInode, name: "a", kind: .file, mode: 0o644, uid: 0, gid: 0)
        var list = ChunkList()
        for i in 0..<3 {
            let b = [UInt8](repeating: UInt8(i), count: 1000)
            let id = ChunkID(hashing: b)
            try store.chunks.put(id, b)
            list.append(id, size: b.count)
        }
        try store.commit(f.id, content: list, path: "a", local: false)
        #expect(try Fsck.run(store: store).problems.isEmpty)
        unlink(store.chunks.path(of: list.ids[1]))
        let path = store.chunks.path(of: list.ids[2])
        chmod(path, 0o644)
        let fd = open(path, O_WRONLY)
        var x: UInt8 = 0xAA
        pwrite(fd, &x, 1, 10)
        close(fd)
        let report = try Fsck.run(store: store)
        #expect(report.problems.count == 3) // corrupt chunk, version needs corrupt, version needs missing
        #expect(report.problems.contains { $0.contains(list.ids[1].hex) && $0.contains("missing") })
        #expect(report.problems.contains { $0.contains(list.ids[2].hex) && $0.contains("corrupt") })
    }
}
