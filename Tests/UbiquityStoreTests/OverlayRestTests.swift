import Glibc
import Testing
import TestSupport
import UbiquitySystem
@testable import UbiquityStore

/// The rest of an overlay rebuilt by the folder without the store's lock
/// (`TreeOverlay.Rest`), then the changes made meanwhile applied to it, gives the rows the
/// rebuild under the lock gives (`TreeOverlay.markFolded`): seeded random tree changes
/// through a store, a part's end at a frame, more changes after the rest was built.
@Suite struct OverlayRestTests {
    @Test(arguments: [1, 2, 3] as [UInt64])
    func aRestBuiltAsidePlusTheChangesSinceIsTheRebuild(seed given: UInt64) throws {
        let seed = replayableSeed(given, variable: "UBQ_REST_SEED", test: "aRestBuiltAsidePlusTheChangesSinceIsTheRebuild",
                                  filter: "OverlayRestTests")
        var random = SplitMix64(seed: seed)
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let store = try Store(directory: dir.path, deviceName: "rest")
        store.startBatching()
        store.foldPolicy.changes = .max
        store.foldPolicy.quiet = .max
        store.foldPolicy.age = .max
        var files: [(parent: InodeNumber, name: String)] = []
        var directories = [Store.rootInode]
        var made = 0
        func step() throws {
            switch Int.random(in: 0..<10, using: &random) {
            case 0..<2 where directories.count < 30:
                let parent = directories.randomElement(using: &random)!
                made += 1
                directories.append(try store.create(parent: parent, name: "d\(made)", kind: .directory, mode: 0o755, uid: 1, gid: 1).id)
            case 2 where !files.isEmpty:
                let i = Int.random(in: 0..<files.count, using: &random)
                _ = try store.removeEntry(parent: files[i].parent, name: files[i].name)
                files.remove(at: i)
            case 3 where !files.isEmpty:
                let i = Int.random(in: 0..<files.count, using: &random)
                let to = directories.randomElement(using: &random)!
                made += 1
                try store.moveEntry(from: files[i].parent, files[i].name, to: to, "m\(made)")
                files[i] = (to, "m\(made)")
            case 4 where !files.isEmpty:
                let file = files.randomElement(using: &random)!
                let id = try #require(store.child(file.parent, file.name))
                var inode = try #require(store.inode(id))
                inode.mode = UInt32.random(in: 0o600...0o777, using: &random)
                try store.update(inode)
            default:
                let parent = directories.randomElement(using: &random)!
                made += 1
                _ = try store.create(parent: parent, name: "f\(made)", kind: .file, mode: 0o644, uid: 1, gid: 1)
                files.append((parent, "f\(made)"))
            }
            store.logTreeChanges() // a frame per change, as a mount's requests
        }
        for _ in 0..<400 { try step() }
        let before = store.overlay
        // Three quarters folded, give or take: the part leaves the overlay at most half
        // unfolded even with the changes made after it, so its rows are rebuilt.
        let end = try #require(before.prefix(upTo: before.changes.count * 3 / 4 - Int.random(in: 0..<50, using: &random))?.end)
        var rest: TreeOverlay.Rest? = TreeOverlay.Rest(of: Array(before.changes[end...]), generation: before.generation, from: end)
        let restGeneration = rest?.overlay.generation
        for _ in 0..<Int.random(in: 0..<30, using: &random) { try step() }
        try #require(end >= store.overlay.changes.count - end, "seed \(seed): the part must leave a rebuild")
        var aside = store.overlay, here = store.overlay
        #expect(aside.generation == before.generation)
        aside.markFolded(through: end, prebuilt: &rest)
        here.markFolded(through: end)
        #expect(rest == nil && aside.generation == restGeneration, "seed \(seed): the rest built aside was taken")
        #expect(Self.rows(aside) == Self.rows(here), "seed \(seed)")
        // A rest of another overlay is not taken.
        var other = store.overlay
        var stranger: TreeOverlay.Rest? = TreeOverlay.Rest(of: Array(before.changes[end...]), generation: before.generation &+ 1_000_000, from: end)
        other.markFolded(through: end, prebuilt: &stranger)
        #expect(stranger != nil && Self.rows(other) == Self.rows(here))
    }

    /// What reads and folds see of an overlay, in an order that does not depend on hashing.
    static func rows(_ o: TreeOverlay) -> [String] {
        var lines = o.changes.map { "c \($0)" }
        lines += o.inodes.map { "i \($0.key) \(String(describing: $0.value))" }.sorted()
        lines += o.entries.flatMap { parent, names in names.map { "e \(parent) \($0.key) \($0.value)" } }.sorted()
        lines += o.removedEntries.flatMap { parent, names in names.map { "r \(parent) \($0)" } }.sorted()
        lines += o.saves.keys.map { "s \($0)" }.sorted() + o.tombstones.keys.map { "t \($0)" }.sorted()
        lines += o.newest.map { "n \($0.key) \($0.value.row)" }.sorted() + o.histories.map { "h \($0.key) \($0.value)" }.sorted()
        lines.append("unlogged \(o.unlogged) folded \(o.folded) frames \(o.frames.map { "\($0.end)/\($0.sequence)" })")
        return lines
    }
}
