import Glibc
import Testing
import TestSupport
import UbiquitySystem
@testable import UbiquityStore

@Suite struct StoreTests {
    /// Regression (bench-scale, session 8): `temp_store=MEMORY` kept every savepoint
    /// journal in memory, where SQLite walks it from its start; a second device catching up
    /// on 100,000 records took 225 s instead of 43 s. Temporary data stays SQLite's default.
    @Test func temporaryDataIsNotForcedIntoMemory() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let store = try Store(directory: dir.path, deviceName: "test")
        #expect(try store.db.rows("PRAGMA temp_store", []) { $0.int(0) }.first == 0)
    }

    /// Issue 26: the group-commit batch keeps its journals in memory (a savepoint's journal
    /// spilled to /var/tmp was never emptied, and every later operation of the batch wrote
    /// its pages there). So does a step of its own (`standalone`: a pull slice, a fold
    /// part), whose statement journals would spill the same way. The barrier keeps SQLite's
    /// default, so its UPDATE of every version spills to disk instead of holding the table.
    @Test func onlyTheBarrierKeepsItsJournalOnDisk() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let store = try Store(directory: dir.path, deviceName: "test")
        store.startBatching()
        let tempStore = { try store.db.rows("PRAGMA temp_store", []) { $0.int(0) }.first }
        // A create goes to the overlay; its fold opens the batch.
        _ = try store.create(parent: Store.rootInode, name: "a", kind: .directory, mode: 0o755, uid: 1, gid: 1)
        try store.foldTree()
        #expect(try tempStore() == 2)
        try store.markDurable()
        #expect(try tempStore() == 0)
        try store.standaloneStep { () throws(StoreError) in
            _ = try store.create(parent: Store.rootInode, name: "b", kind: .directory, mode: 0o755, uid: 1, gid: 1)
        }
        #expect(try tempStore() == 2)
        try store.markDurable()
        #expect(try tempStore() == 0)
        _ = try store.create(parent: Store.rootInode, name: "c", kind: .directory, mode: 0o755, uid: 1, gid: 1)
        try store.foldTree()
        #expect(try tempStore() == 2)
        try store.commitBatch()
    }

    /// Regression (review of issue 26): the gc's compaction committed the open batch by
    /// itself, before the small chunks its saves name and without noting the intent log's
    /// sequence (a replay after a crash would then have recorded those saves again).
    @Test func compactionCommitsTheBatchAsTheStoreDoes() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let store = try Store(directory: dir.path, deviceName: "test")
        store.startBatching()
        let f = try store.create(parent: Store.rootInode, name: "a.txt", kind: .file, mode: 0o644, uid: 1, gid: 1)
        let bytes = Array("small".utf8)
        let id = ChunkID(hashing: bytes)
        try store.chunks.put(id, bytes)
        var list = ChunkList()
        list.append(id, size: bytes.count)
        try store.commit(f.id, content: list, path: "a.txt", local: false)
        #expect(!store.chunks.uncommittedSmallChunks([id]).isEmpty)
        _ = try store.compactDatabaseStep()
        #expect(store.chunks.uncommittedSmallChunks([id]).isEmpty)
        #expect(try store.setting("intent_applied") == "1")
    }

    @Test func treeAndVersionsPersistAcrossReopen() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        var fileID = FileID.zero
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
            // `commit` builds the version it returns instead of reading it back.
            #expect(try store.version(row: v1.row) == v1)
            #expect(try store.version(row: v2.row) == v2)
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
    /// What format 12 added (a store of an older format has none of it).
    static func dropFormat12(_ store: Store) throws {
        for trigger in ["insert", "delete", "update"] { try store.db.execute("DROP TRIGGER content_totals_\(trigger)") }
        try store.db.execute("DROP TABLE content_totals")
        try store.db.execute("DROP INDEX inodes_cached")
        try store.db.execute("ALTER TABLE inodes DROP COLUMN used")
    }

    /// Format 12 keeps content totals by triggers and when files were used: a format-11
    /// store gets the totals from one count of its files, and the triggers from then on.
    /// A path is its names from the root, joined by "/", whatever bytes they hold; the
    /// root's is empty (`treePath` builds the string in one piece).
    @Test func pathsJoinNamesOfAnyLength() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let store = try Store(directory: dir.path, deviceName: "test")
        var parent = Store.rootInode
        var names: [String] = []
        for name in ["a", "naïve dir", String(repeating: "x", count: 255), "日本", "ß"] {
            parent = try store.create(parent: parent, name: name, kind: .directory, mode: 0o755, uid: 0, gid: 0).id
            names.append(name)
            #expect(store.path(of: parent) == names.joined(separator: "/"))
        }
        #expect(store.path(of: Store.rootInode) == "")
    }

    /// Names are keys byte for byte: canonically equivalent spellings are two names on
    /// Linux, and a prefix or a longer name is another name.
    @Test func namesCompareByteForByte() {
        let nfc = "caf\u{E9}", nfd = "cafe\u{301}"
        #expect(nfc == nfd) // Swift's String says so; a directory may hold both
        #expect(NameKey(nfc) != NameKey(nfd))
        #expect(NameKey(nfc) == NameKey(String(decoding: Array(nfc.utf8), as: UTF8.self)))
        #expect(NameKey("") == NameKey("") && NameKey("") != NameKey("a"))
        #expect(NameKey("ab") != NameKey("abc") && NameKey(String(repeating: "x", count: 255)) == NameKey(String(repeating: "x", count: 255)))
        #expect(Set([NameKey(nfc), NameKey(nfd), NameKey(nfc)]).count == 2)
    }

    @Test func formatElevenStoreGetsContentTotals() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        do {
            let store = try Store(directory: dir.path, deviceName: "old")
            for (name, text) in [("a.txt", "hello"), ("b.txt", "a longer file")] {
                let f = try store.create(parent: Store.rootInode, name: name, kind: .file, mode: 0o644, uid: 1, gid: 1)
                var list = ChunkList()
                let bytes = Array(text.utf8)
                try store.chunks.put(ChunkID(hashing: bytes), bytes)
                list.append(ChunkID(hashing: bytes), size: bytes.count)
                try store.commit(f.id, content: list, path: name, local: false)
            }
            _ = try store.create(parent: Store.rootInode, name: "dir", kind: .directory, mode: 0o755, uid: 1, gid: 1)
            // Back to format 11, as the previous release wrote it.
            try Self.dropFormat12(store)
            try store.db.execute("UPDATE settings SET value = '11' WHERE key = 'format'")
        }
        let store = try Store(directory: dir.path)
        #expect(store.contentTotals() == ContentTotals(files: 2, size: 18, allocated: 18, absent: 0, absentFiles: 0))
        let c = try store.create(parent: Store.rootInode, name: "c.txt", kind: .file, mode: 0o644, uid: 1, gid: 1)
        _ = try store.removeEntry(parent: Store.rootInode, name: "a.txt")
        #expect(store.contentTotals() == ContentTotals(files: 2, size: 13, allocated: 13, absent: 0, absentFiles: 0))
        #expect(store.inode(c.id)?.size == 0)
        #expect(try store.evictionCandidates(after: (0, .zero), limit: 10).isEmpty) // b.txt is small: it came inline
    }

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
            try Self.dropFormat12(store)
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

    /// Format 4 keeps the synced view in tables; a format 3 store gets them built from its
    /// records, and the result is what adding the records one by one made. Link counts
    /// and primary names are computed from the entries.
    /// `rm f; echo new > f`: the new file continues the deleted one's history from the
    /// overlay's tombstone without reading SQLite. A version of the history written since
    /// the delete (another device's, taken in; the write folds the overlay first) is read
    /// and continued when newer.
    @Test func aFileMadeAgainReadsItsHistoryOnlyWhenAVersionCameSinceTheDelete() throws {
        for peerVersionSinceTheDelete in [false, true] {
            let dir = TempDirectory()
            defer { dir.cleanup() }
            let store = try Store(directory: dir.path, deviceName: "here")
            store.startBatching() // as mounted: tree changes go to the overlay
            let d = try store.create(parent: Store.rootInode, name: "docs", kind: .directory, mode: 0o755, uid: 1, gid: 1)
            let f = try store.create(parent: d.id, name: "a.txt", kind: .file, mode: 0o644, uid: 1, gid: 1)
            let first = try store.commit(f.id, content: ChunkList(), path: "docs/a.txt", local: false)
            try store.commitBatch()
            let fileID = try #require(f.fileID)
            try store.removeEntry(parent: d.id, name: "a.txt")
            try store.commitTombstone(fileID: fileID, head: first.row, path: "docs/a.txt", of: f.id)
            if peerVersionSinceTheDelete {
                let peer = SyncRecord(id: VersionID(hex: String(repeating: "a", count: 32))!, node: .file(fileID), kind: .file,
                                      parents: [first.id], deviceID: DeviceID(hex: "ffffffffffffffff")!, deviceName: "other",
                                      committed: store.clock() + 60_000_000_000, mtime: 1, mode: 0o644, isTombstone: false,
                                      isMeta: false, path: "docs/a.txt")
                try store.addRemote([peer])
            }
            let statements = store.db.statements
            let dead = try #require(try store.deadHistory(at: "docs/a.txt"))
            let read = store.db.statements - statements
            store.overlay.forgetNewestMarks()
            let afresh = try #require(try store.deadHistory(at: "docs/a.txt"))
            #expect(dead.fileID == fileID && dead.head == afresh.head && dead.headID == afresh.headID,
                    "peer version since the delete: \(peerVersionSinceTheDelete)")
            if peerVersionSinceTheDelete {
                #expect(read > 0, "the history is read: a version came since the delete")
                #expect(dead.headID == VersionID(hex: String(repeating: "a", count: 32)), "the newer version is continued")
            } else {
                #expect(read == 0, "nothing is read: \(read) statements")
                #expect(dead.head != first.row, "the tombstone is continued")
            }
        }
    }

    /// A temp file saved once and folded, renamed over another file: its one version is
    /// withdrawn with its history without a read (the working set knows the save began
    /// it). Once another device's version of it came (taken in), it keeps its history.
    @Test func aFoldedTempFileRenamedOverIsWithdrawnWithoutARead() throws {
        for peerVersion in [false, true] {
            let dir = TempDirectory()
            defer { dir.cleanup() }
            let store = try Store(directory: dir.path, deviceName: "here")
            store.startBatching()
            let t = try store.create(parent: Store.rootInode, name: "a.tmp", kind: .file, mode: 0o644, uid: 1, gid: 1)
            let saved = try store.commit(t.id, content: ChunkList(), path: "a.tmp", local: false)
            try store.commitBatch()
            let fileID = try #require(t.fileID)
            if peerVersion {
                let peer = SyncRecord(id: VersionID(hex: String(repeating: "a", count: 32))!, node: .file(fileID), kind: .file,
                                      parents: [saved.id], deviceID: DeviceID(hex: "ffffffffffffffff")!, deviceName: "other",
                                      committed: store.clock(), mtime: 1, mode: 0o644, isTombstone: false, isMeta: false, path: "a.tmp")
                try store.addRemote([peer])
            }
            let statements = store.db.statements
            try store.endHistoryRenamedOver(fileID, of: t.id)
            let read = store.db.statements - statements
            try store.commitBatch()
            let shown = try store.histories(at: "a.tmp")
            if peerVersion {
                #expect(shown == [fileID], "a history of two versions stays shown")
            } else {
                #expect(read == 0, "\(read) statements")
                #expect(shown.isEmpty, "the one version's history is withdrawn")
            }
        }
    }

    @Test func formatThreeStoreGetsItsViewBuilt() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let dump = { (store: Store) throws -> [String] in
            var lines: [String] = []
            for table in ["view_heads", "view_awaited", "view_current", "view_paths", "view_conflicts"] {
                lines += try store.db.rows("SELECT * FROM \(table) ORDER BY 1, 2", []) { r in
                    "\(table): " + (0..<3).map { r.shown(Int32($0)) }.joined(separator: " ")
                }
            }
            return lines + ["conflicts: \(try store.totalConflicts())"]
        }
        var before: [String] = []
        do {
            let store = try Store(directory: dir.path, deviceName: "old")
            let d = try store.create(parent: Store.rootInode, name: "docs", kind: .directory, mode: 0o755, uid: 1, gid: 1)
            let f = try store.create(parent: d.id, name: "a.txt", kind: .file, mode: 0o644, uid: 1, gid: 1)
            _ = try store.create(parent: d.id, name: "sub", kind: .directory, mode: 0o755, uid: 1, gid: 1)
            try store.link(f.id, parent: Store.rootInode, name: "z-link")
            let first = try store.commit(f.id, content: ChunkList(), path: "docs/a.txt", local: false)
            try store.commit(f.id, content: ChunkList(), path: "docs/a.txt", local: false)
            try store.recordLocalChanges(busy: [])
            // Another device edited the first version too (a conflict), and named a parent
            // this device has not seen yet (awaited).
            let other = { (id: String, node: String, parents: [String], path: String) in
                SyncRecord(id: VersionID(hex: id)!, node: .file(FileID(hex: node)!), kind: .file, parents: parents.map { VersionID(hex: $0)! }, deviceID: DeviceID(hex: "ffffffffffffffff")!, deviceName: "other",
                           committed: 1, mtime: 1, mode: 0o644, isTombstone: false, isMeta: false, path: path)
            }
            try store.addRemote([other(String(repeating: "a", count: 32), f.fileID!.hex, [first.id.hex], "docs/a.txt"),
                                 other(String(repeating: "b", count: 32), String(repeating: "c", count: 32),
                                       [String(repeating: "d", count: 32)], "notes/b.txt")])
            #expect(try store.totalConflicts() == 1)
            before = try dump(store)
            // Back to format 3, as the previous release wrote it.
            for table in ["view_heads", "view_awaited", "view_current", "view_paths", "view_conflicts"] {
                try store.db.execute("DROP TABLE \(table)")
            }
            try store.db.execute("DELETE FROM settings WHERE key = 'conflicts'")
            try store.db.execute("DROP TABLE pending")
            try Self.dropFormat12(store)
            try store.db.execute("DROP INDEX inodes_unlinked")
            for column in ["nlink", "parent", "name"] { try store.db.execute("ALTER TABLE inodes DROP COLUMN \(column)") }
            try store.db.execute("UPDATE settings SET value = '3' WHERE key = 'format'")
        }
        let store = try Store(directory: dir.path)
        #expect(try dump(store) == before)
        let docs = try #require(store.child(Store.rootInode, "docs"))
        let file = try #require(store.child(docs, "a.txt"))
        #expect(store.inode(Store.rootInode)?.nlink == 3)
        #expect(store.inode(docs)?.nlink == 3)
        #expect(store.inode(file)?.nlink == 2)
        #expect(store.path(of: file) == "z-link") // the first by (parent, name), as older stores loaded it
        #expect(store.needsFullScan)
        #expect(before.contains { $0.hasPrefix("view_awaited: xdddd") }) // an id, as bytes (format 13)
        #expect(try store.conflictedPaths() == ["docs/a.txt"])
    }

    /// Format 6 adds journal generations (sync_peers.generation), pruned_records and the
    /// records' lineage: a format 5 store keeps its records (without lineage, as they
    /// were) and its journal offsets (generation 0); new records get a lineage.
    @Test func formatFiveStoreIsUpgraded() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let device = DeviceID(hex: "00000000000000aa")!
        do {
            let store = try Store(directory: dir.path, deviceName: "old")
            let f = try store.create(parent: Store.rootInode, name: "a.txt", kind: .file, mode: 0o644, uid: 1, gid: 1)
            try store.commit(f.id, content: ChunkList(), path: "a.txt", local: false)
            try store.setPeerPosition(device, Store.JournalPosition(generation: 0, offset: 1234))
            // Back to format 5, as the previous release wrote it.
            try store.db.execute("DROP TABLE pruned_records")
            try store.db.execute("DROP TABLE own_dots")
            try store.db.execute("UPDATE versions SET lineage = NULL")
            try store.db.execute("ALTER TABLE versions DROP COLUMN lineage")
            try store.db.execute("CREATE TABLE old_peers(device TEXT PRIMARY KEY, offset INTEGER NOT NULL)")
            try store.db.execute("INSERT INTO old_peers SELECT device, offset FROM sync_peers")
            try store.db.execute("DROP TABLE sync_peers")
            try store.db.execute("ALTER TABLE old_peers RENAME TO sync_peers")
            try store.db.execute("UPDATE settings SET value = '5' WHERE key = 'format'")
        }
        let store = try Store(directory: dir.path)
        #expect(try store.setting("format") == String(Schema.formatVersion))
        #expect(try store.peerPosition(device) == Store.JournalPosition(generation: 0, offset: 1234))
        let f = try #require(store.child(Store.rootInode, "a.txt"))
        let old = try #require(try store.replica.current(.file(store.inode(f)!.fileID!)))
        #expect(old.lineage.isEmpty)
        try store.commit(f, content: ChunkList(), path: "a.txt", local: false)
        let new = try #require(try store.replica.current(.file(store.inode(f)!.fileID!)))
        #expect(new.lineage.dot == 1 && new.lineage.context.isEmpty) // the old parent has no dot
        #expect(try store.replica.heads(new.node).map(\.id) == [new.id])
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
            let b = [UInt8](repeating: UInt8(i), count: 3000) // pack records (over SmallChunks.limit)
            let id = ChunkID(hashing: b)
            try store.chunks.put(id, b)
            list.append(id, size: b.count)
        }
        try store.commit(f.id, content: list, path: "a", local: false)
        #expect(try Fsck.run(store: store).problems.isEmpty)
        store.chunks.discard(list.ids[1])
        try ChunkDamage.flip(list.ids[2], chunks: dir.path + "/chunks", at: 10)
        let report = try Fsck.run(store: store)
        #expect(report.problems.count == 3) // corrupt chunk, version needs corrupt, version needs missing
        #expect(report.problems.contains { $0.contains(list.ids[1].hex) && $0.contains("missing") })
        #expect(report.problems.contains { $0.contains(list.ids[2].hex) && $0.contains("corrupt") })
    }
}

/// An open of a file whose version the fold has written takes its chunk list from the
/// working set: kept at the save, or read with its directory's at the first open there.
@Suite struct HeadChunkListTests {
    @Test func openingTheFilesOfAFoldedTreeReadsEachDirectoryOnce() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let store = try Store(directory: dir.path, deviceName: "test")
        store.startBatching()
        var files: [(parent: InodeNumber, name: String, id: InodeNumber, text: String)] = []
        for d in 0..<3 {
            let parent = try store.create(parent: Store.rootInode, name: "d\(d)", kind: .directory, mode: 0o755, uid: 0, gid: 0).id
            for f in 0..<40 {
                let name = "f\(f)", text = "file \(f) of directory \(d)"
                let id = try store.create(parent: parent, name: name, kind: .file, mode: 0o644, uid: 0, gid: 0).id
                var list = ChunkList()
                list.appendInline(Array(text.utf8))
                _ = try store.commit(id, content: list, path: "d\(d)/\(name)", local: false)
                files.append((parent, name, id, text))
            }
        }
        try store.commitBatch()
        _ = try store.reservedRanges(Store.rootInode) // the table in memory, read once (a mount's first fold)
        func openAll() throws -> Int {
            let s0 = store.db.statements
            for file in files {
                let content = try store.openContent(file.id)
                #expect(String(decoding: try content.read(offset: 0, count: 100), as: UTF8.self) == file.text)
            }
            return store.db.statements - s0
        }
        #expect(try openAll() == 0, "the lists kept at the saves")
        // As after the working set let them go: the kernel's lookups read the inodes again.
        store.workingSet.withLock { $0.inodes.removeAll() }
        for d in 0..<3 { _ = try store.lookUp(Store.rootInode, "d\(d)") }
        for file in files { _ = try store.lookUp(file.parent, file.name) }
        let statements = try openAll()
        print("HeadChunkListTests: \(statements) statements to open \(files.count) files in 3 directories")
        #expect(statements == 3, "one read a directory")
        #expect(try openAll() == 0)
    }
}
