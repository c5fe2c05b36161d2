import Glibc
import Testing
import TestSupport
import UbiquitySystem
@testable import UbiquityStore

/// The upgrade of a store of format 14, the last before the operation log (docs/FORMAT.md,
/// formats 15 to 17): the schema is the same, so the open rewrites nothing, and `log/`
/// starts empty. The migration is one transaction, and the format setting one statement
/// after it (`Schema.migrate`), so a crash leaves format 14 or the current one.
@Suite struct FormatUpgradeTests {
    /// A store of `files` files, each with two versions, set back to format 14: no log,
    /// no settings that formats 15 to 17 added. Returns its directory.
    static func format14Store(files: Int) throws -> TempDirectory {
        let dir = TempDirectory()
        do {
            let store = try Store(directory: dir.path, deviceName: "old")
            for i in 0..<files {
                let name = "f\(i)"
                let id = try store.create(parent: Store.rootInode, name: name, kind: .file, mode: 0o644, uid: 0, gid: 0).id
                for text in ["first \(i)", "second \(i)"] {
                    var list = ChunkList()
                    list.appendInline(Array(text.utf8))
                    _ = try store.commit(id, content: list, path: name, local: false)
                }
            }
            try store.syncFiles()
            try store.markDurable()
        }
        let db = try SQLiteDatabase(path: dir.path + "/meta.sqlite")
        try db.query("UPDATE settings SET value = '14' WHERE key = 'format'")
        try db.query("DELETE FROM settings WHERE key IN ('tree_log_mark', 'boot_id', 'withdrawn_at_open')")
        removeTree(dir.path + "/log")
        return dir
    }

    /// Opened, it is the current format with every file and version as before, and what
    /// its open does beyond a plain reopen of the same store (statements, and the rows
    /// they changed) is the same for 30 files and for 300: nothing is rewritten.
    @Test func aFormat14StoreOpensAsTheCurrentFormatWithoutARewrite() throws {
        var extra: [(statements: Int, changed: Int64)] = []
        func changed(_ store: Store) throws -> Int64 { try store.db.rows("SELECT total_changes()", []) { $0.int(0) }.first ?? 0 }
        for files in [30, 300] {
            let old = try Self.format14Store(files: files)
            defer { old.cleanup() }
            let current = IntentLogTests.killed(old) // the same store, upgraded first
            defer { current.cleanup() }
            _ = try Store(directory: current.path)
            let upgraded = try Store(directory: old.path)
            let reopened = try Store(directory: current.path)
            extra.append((upgraded.db.statements - reopened.db.statements, try changed(upgraded) - changed(reopened)))
            #expect(try upgraded.setting("format") == String(Schema.formatVersion))
            #expect(access(old.path + "/log", F_OK) == 0, "the operation log's directory")
            for i in [0, files / 2, files - 1] {
                let id = try #require(try upgraded.childID(Store.rootInode, "f\(i)"))
                let fileID = try #require(upgraded.inode(id)?.fileID)
                #expect(try upgraded.versions(of: fileID).count == 2, "f\(i)")
                let list = try upgraded.chunkList(row: try #require(upgraded.inode(id)?.head))
                #expect(list.count == 1 && list.inline[list.ids[0]] == Array("second \(i)".utf8), "f\(i)")
            }
        }
        #expect(extra[0].statements == extra[1].statements && extra[0].changed == extra[1].changed,
                "the upgrade's work beyond a reopen at 30 and 300 files: \(extra)")
    }
}
