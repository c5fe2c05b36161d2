import Glibc
import Testing
import TestSupport
import UbiquityBacking
@testable import UbiquityFS
@testable import UbiquityStore
@testable import UbiquitySync

/// A pull slice takes other devices' fresh records (new nodes, alone at their paths) a
/// table at a time (`Store+FreshRecords`). Held against the one-at-a-time path: two
/// devices join the same random container, one in bulk and one not, and must end with
/// the same records, synced view, histories and tree; the bulk one's view must equal a
/// rebuild from its records. The bulk device's join fails at random statements on the
/// way (each failure leaves its slice's transaction unfinished, as a crash would), so
/// slices are taken in again over stores that hold part of the container.
///
/// Replay: `UBQ_FRESH_SEED=1234 swift test --filter FreshRecordsTests`.
@Suite struct FreshRecordsTests {
    /// Seed 153 is a regression: reconcile kept the paths it found absent as `String`s,
    /// equal for names that differ only in Unicode normalization, so a file whose twin
    /// path was absent was taken for absent too and never shown.
    @Test(arguments: [1, 2, 3, 116, 153, UInt64.random(in: 4...UInt64.max)])
    func aBulkJoinEndsAsAOneAtATimeJoin(seed: UInt64) throws {
        try join(seed: seed, bulk: true)
    }

    /// Regression: sync's lookups of the tree took a failed read for an absent entry
    /// (`Store.locate`, `path(of:)`), and went on in the same transaction: a pull slice
    /// then left paths of the view unshown for good (seed 2 lost three files and a
    /// directory one run in three), and a sync step could tombstone a file that was there.
    @Test(arguments: [2, 4, 5, 6])
    func aOneAtATimeJoinThatFailsOnTheWayEndsAsOneThatDoesNot(seed: UInt64) throws {
        try join(seed: seed, bulk: false)
    }

    /// Device `joining` (in bulk or not) joins a random container while statements fail
    /// at random; `clean` joins it one record at a time with none failing. They must end
    /// alike, and `joining`'s view as a rebuild makes it.
    func join(seed: UInt64, bulk: Bool) throws {
        let seed = environment("UBQ_FRESH_SEED").flatMap(UInt64.init) ?? seed
        print("FreshRecordsTests seed \(seed) (replay: UBQ_FRESH_SEED=\(seed) swift test --filter FreshRecordsTests)")
        var rng = SplitMix64(seed: seed)
        let temp = TempDirectory(prefix: "ubiquity-fresh")
        defer { temp.cleanup() }
        let backing = MemoryStore()
        try Self.fill(backing, in: temp, rng: &rng)

        var options = SimDevice.alwaysPolling
        options.pullSlice = rng.int(2..<40)
        options.pullSliceMost = options.pullSlice * rng.int(1..<5)
        options.download = .onDemand
        let joining = try SimDevice(name: "joining", root: temp.path, backing: backing, clock: nowNanos, options: options)
        let clean = try SimDevice(name: "clean", root: temp.path, backing: backing, clock: nowNanos, options: options)
        joining.store.takesFreshRecordsInBulk = bulk
        clean.store.takesFreshRecordsInBulk = false
        var failures = 0
        for _ in 0..<rng.int(1..<8) {
            let failing = joining.store.db.statements + rng.int(1..<600)
            joining.store.db.failingStatements = [failing]
            joining.cycle()
            if failing <= joining.store.db.statements { failures += 1 }
        }
        joining.store.db.failingStatements = []
        for _ in 0..<3 {
            joining.cycle()
            clean.cycle()
        }
        print("FreshRecordsTests seed \(seed): slices of \(options.pullSlice) to \(options.pullSliceMost), \(failures) failed on purpose, \(joining.store.freshRecordsTaken) records taken in bulk")
        #expect(bulk == (joining.store.freshRecordsTaken > 0), "seed \(seed): \(joining.store.freshRecordsTaken) taken in bulk")
        #expect(clean.store.freshRecordsTaken == 0)
        let (kept, rebuilt) = try joining.fs.withMetaLock { (_, store) throws(StoreError) in try store.viewAsKeptAndRebuilt() }
        #expect(kept == rebuilt, "seed \(seed): \(Set(kept).symmetricDifference(rebuilt).sorted())")
        let (j, c) = (try Self.rows(of: joining), try Self.rows(of: clean))
        let sameRows = j == c // not in the expectation: it would print every row of both
        #expect(sameRows, "seed \(seed): only where statements failed \(Set(j).subtracting(c).sorted().prefix(20)), only in the clean join \(Set(c).subtracting(j).sorted().prefix(20))")
        let (joinedTree, cleanTree) = (try Self.tree(of: joining), try Self.tree(of: clean))
        #expect(joinedTree == cleanTree, "seed \(seed): only where statements failed \(Set(joinedTree).subtracting(cleanTree).sorted()), only in the clean join \(Set(cleanTree).subtracting(joinedTree).sorted())")
        #expect(joining.conflicts() == clean.conflicts(), "seed \(seed)")
    }

    /// Two devices edit a container at random and upload it all: files saved again
    /// (several records of a node), saved on both without a sync between (conflicts),
    /// removed (tombstones), renamed, symlinks, empty directories, and names that differ
    /// only in Unicode normalization.
    static func fill(_ backing: MemoryStore, in temp: TempDirectory, rng: inout SplitMix64) throws {
        let a = try SimDevice(name: "a", root: temp.path, backing: backing, clock: nowNanos, options: SimDevice.alwaysPolling)
        let c = try SimDevice(name: "c", root: temp.path, backing: backing, clock: nowNanos, options: SimDevice.alwaysPolling)
        let dirs = ["", "d", "d/e", "d/e/f", "g", "caf\u{E9}", "cafe\u{301}"]
        func path() -> String {
            let dir = dirs[rng.int(0..<dirs.count)], name = "n\(rng.int(0..<12))"
            return dir.isEmpty ? name : dir + "/" + name
        }
        for step in 0..<rng.int(60..<200) {
            let d = rng.int(0..<2) == 0 ? a : c
            let roll = rng.int(0..<100)
            let p = path()
            let (dir, name) = splitPath(p)!
            switch roll {
            case 0..<50: try d.save(p, "\(d.name) \(step)")
            case 50..<58:
                if let parent = try d.directory(dir, create: false) { try? d.fs.unlink(parent: parent, name: name) }
            case 58..<63:
                if let parent = try d.directory(dir, create: true) {
                    _ = try? d.fs.symlink(target: "to \(step)", parent: parent, name: name, caller: d.me)
                }
            case 63..<68:
                if let parent = try d.directory(dir, create: true) { _ = try? d.fs.mkdir(parent: parent, name: name, mode: 0o750, caller: d.me) }
            case 68..<74:
                let (toDir, toName) = splitPath(path())!
                if let from = try d.directory(dir, create: false), let to = try d.directory(toDir, create: true) {
                    try? d.fs.rename(parent: from, name: name, newParent: to, newName: toName, flags: 0)
                }
            case 74..<90: d.cycle()
            default:
                a.cycle()
                c.cycle()
            }
        }
        for _ in 0..<3 {
            a.cycle()
            c.cycle()
        }
    }

    /// Every entry below the root with what it is and holds, its path's bytes in hex:
    /// `SimDevice.tree()` keys by `String`, which takes two names that differ only in
    /// Unicode normalization for one (the container has such names).
    static func tree(of device: SimDevice) throws -> [String] {
        var result: [String] = []
        func walk(_ ino: InodeNumber, _ prefix: [UInt8]) throws {
            let h = try device.fs.opendir(ino)
            defer { device.fs.releasedir(h) }
            for entry in try device.fs.readdir(h) where entry.name != "." && entry.name != ".." {
                if ino == Store.rootInode && (entry.name == ".versions" || entry.name == ".conflicts") { continue }
                let path = prefix + Array(entry.name.utf8)
                let hex = path.map { String($0, radix: 16) }.joined(separator: ".")
                switch entry.attributes.mode & UInt32(S_IFMT) {
                case UInt32(S_IFDIR):
                    result.append("\(hex) dir \(String(entry.attributes.mode & 0o7777, radix: 8))")
                    try walk(entry.attributes.ino, path + [UInt8(ascii: "/")])
                case UInt32(S_IFLNK):
                    result.append("\(hex) link " + (try device.fs.readlink(entry.attributes.ino)))
                default:
                    let f = try device.fs.open(entry.attributes.ino, flags: OpenFlags(O_RDONLY))
                    defer { try? device.fs.release(f) }
                    result.append("\(hex) file " + String(decoding: try device.fs.read(f, offset: 0, count: 1 << 20), as: UTF8.self))
                }
            }
        }
        try walk(Store.rootInode, [])
        return result.sorted()
    }

    /// What a join leaves, by ids and paths (rows and device numbers are local): every
    /// record, the synced view, the histories and `.versions/` directories, what waits.
    static func rows(of device: SimDevice) throws -> [String] {
        try device.fs.withMetaLock { (_, store) throws(StoreError) -> [String] in
            let db = store.db
            var rows: [String] = []
            rows += try db.rows("""
                SELECT hex(id), hex(file_id), hex(parents), device_id, committed, mtime, mode, size, tombstone, local, hex(path),
                       hex(chunks), kind, hex(target), hex(xattrs), meta, uploaded, lineage FROM \(Store.versionsWithDevices)
                """, []) { r in "version " + (0..<18).map { r.isNull($0) ? "null" : r.text($0) }.joined(separator: " ") }
            rows += try db.rows("SELECT hex(v.id) FROM view_heads h JOIN versions v ON v.row = h.row", []) { "head \($0.text(0))" }
            rows += try db.rows("SELECT hex(c.node), hex(v.id), hex(c.path) FROM view_current c JOIN versions v ON v.row = c.row", []) {
                "current \($0.text(0)) \($0.text(1)) \($0.text(2))"
            }
            rows += try db.rows("SELECT hex(id), hex(node) FROM view_awaited", []) { "awaited \($0.text(0)) \($0.text(1))" }
            rows += try db.rows("SELECT hex(path), hex(parent), nodes, below FROM view_paths", []) { "path \($0.text(0)) \($0.text(1)) \($0.int(2)) \($0.int(3))" }
            rows += try db.rows("SELECT hex(path), count FROM view_conflicts", []) { "conflicts \($0.text(0)) \($0.int(1))" }
            rows += try db.rows("SELECT hex(file_id), hex(path), live FROM histories", []) { "history \($0.text(0)) \($0.text(1)) \($0.int(2))" }
            rows += try db.rows("SELECT hex(parent), hex(name), leaves, total FROM history_dirs", []) { "history dir \($0.text(0)) \($0.text(1)) \($0.int(2)) \($0.int(3))" }
            rows += try db.rows("SELECT kind, hex(key) FROM pending", []) { "pending \($0.int(0)) \($0.text(1))" }
            return rows.sorted()
        }
    }
}
