import Glibc
import Synchronization
import Testing
import TestSupport
import UbiquitySystem
@testable import UbiquityStore

/// The tree's write-ahead overlay against a model: seeded random tree changes through the
/// store, acknowledged as a mount acknowledges them (one log frame per change), with folds,
/// group commits, durability barriers, transactions that roll back after folding, and
/// kill -9 at random points (the store's files copied as they are, sometimes with a torn
/// frame at the log's end). After every crash the reopened tree equals the model: names,
/// inode numbers, kinds, modes, link counts, and the sync step's change set still holds
/// every inode changed.
@Suite struct TreeOverlayModelTests {
    struct Node {
        var kind: NodeKind
        var mode: UInt32
        var children: [NameKey: InodeNumber] = [:]
    }

    struct Model {
        var nodes: [InodeNumber: Node] = [Store.rootInode: Node(kind: .directory, mode: 0o755)]
        /// Inodes changed since the store was made: the change set must hold each.
        var touched: Set<InodeNumber> = []
        /// Each file's saved content and how many versions it has; tombstones written.
        var content: [InodeNumber: ChunkList] = [:]
        var versions: [InodeNumber: Int] = [:]
        var tombstones = 0
        /// Histories of temp files an editor's save renamed over a file: no record and no
        /// history left (a local-only temp's version folded before the rename stays, as
        /// local versions do until prune).
        var withdrawn: [FileID] = []
        /// User xattrs set on each inode (full names).
        var xattrs: [InodeNumber: [String: [UInt8]]] = [:]

        var directories: [InodeNumber] { nodes.filter { $0.value.kind == .directory }.map(\.key).sorted { $0.rawValue < $1.rawValue } }

        func names(of id: InodeNumber) -> Int {
            nodes.values.reduce(0) { $0 + $1.children.values.filter { $0 == id }.count }
        }

        func nlink(_ id: InodeNumber) -> UInt32 {
            guard let node = nodes[id] else { return 0 }
            if node.kind == .directory {
                return UInt32(2 + node.children.values.filter { nodes[$0]?.kind == .directory }.count)
            }
            return UInt32(names(of: id))
        }

        func isAncestor(_ a: InodeNumber, of b: InodeNumber) -> Bool {
            if a == b { return true }
            guard let node = nodes[a], node.kind == .directory else { return false }
            return node.children.values.contains { isAncestor($0, of: b) }
        }

        /// Inodes no name reaches any more (dropped from the model as the store forgets them).
        mutating func collect() -> [InodeNumber] {
            var reachable: Set<InodeNumber> = [Store.rootInode], pending = [Store.rootInode]
            while let next = pending.popLast() {
                for child in nodes[next]?.children.values ?? [:].values where reachable.insert(child).inserted { pending.append(child) }
            }
            let gone = nodes.keys.filter { !reachable.contains($0) }
            for id in gone { nodes[id] = nil }
            return gone
        }
    }

    /// "n.swp" is local-only (an editor's scratch name): its saves are local versions.
    static let names = ["a", "b", "c", "d", "\u{e9}", "e\u{301}", "long name.txt", "n.swp"]

    static func check(_ store: Store, _ model: Model, _ context: String) {
        checkWorkingSet(store.workingSet, model, context)
        var seen: Set<InodeNumber> = []
        var pending = [Store.rootInode]
        while let dir = pending.popLast() {
            guard seen.insert(dir).inserted else { continue }
            let listed = store.entries(dir)
            let expected = model.nodes[dir]?.children ?? [:]
            let got = Dictionary(listed.map { (NameKey($0.name), $0.id) }, uniquingKeysWith: { a, _ in a })
            #expect(got == expected, "\(context): directory \(dir): \(listed.map(\.name).sorted()) against \(expected.keys.map(\.name).sorted())")
            #expect(store.isEmptyDirectory(dir) == expected.isEmpty, "\(context): directory \(dir) empty")
            for (key, id) in expected {
                #expect(store.child(dir, key.name) == id, "\(context): lookup \(key.name) in \(dir)")
                if model.nodes[id]?.kind == .directory { pending.append(id) }
            }
        }
        for (id, node) in model.nodes {
            guard let inode = store.inode(id) else {
                Issue.record("\(context): inode \(id) missing")
                continue
            }
            #expect(inode.kind == node.kind && inode.mode == node.mode, "\(context): inode \(id): \(inode.kind) \(inode.mode) against \(node.kind) \(node.mode)")
            #expect(inode.nlink == model.nlink(id), "\(context): inode \(id) nlink \(inode.nlink) against \(model.nlink(id))")
        }
        for (id, expected) in model.content {
            guard let inode = store.inode(id), let head = inode.head else {
                Issue.record("\(context): file \(id) has no version")
                continue
            }
            #expect((try? store.chunkList(row: head)) == expected, "\(context): file \(id)'s content")
            #expect(inode.size == expected.totalSize, "\(context): file \(id)'s size")
        }
        for id in model.nodes.keys {
            let expected = model.xattrs[id] ?? [:]
            let names = (try? store.xattrNames(id)) ?? ["(failed)"]
            #expect(names == expected.keys.sorted { $0.utf8.lexicographicallyPrecedes($1.utf8) }, "\(context): inode \(id)'s xattrs \(names)")
            for (name, value) in expected { #expect((try? store.xattr(id, name)) == value, "\(context): inode \(id)'s xattr \(name)") }
        }
        // Where a new file would continue a history: the answers that trust the names
        // read at the last check (`HistoryNames`), the directories' histories read at
        // the mark (`StoredHistories`, each directory read whole) and the overlay's newest
        // versions made since SQLite's (`TreeOverlay.newestMarks`) are the ones read
        // afresh, name by name.
        var paths: [String] = []
        for dir in model.directories {
            guard let path = store.path(of: dir) else { continue }
            paths += names.map { path.isEmpty ? $0 : path + "/" + $0 }
        }
        // The directories read whole stay for the next check while SQLite reads the same:
        // the overlay's changes in between are what the answers must see through them.
        let kept = paths.map { try? store.deadHistory(at: $0) }
        let stored = store.storedHistories
        store.historyNames.removeAll()
        store.overlay.forgetNewestMarks()
        store.storedHistories = StoredHistories(readAfter: .max)
        defer { store.storedHistories = stored }
        for (path, kept) in zip(paths, kept) {
            let fresh = try? store.deadHistory(at: path)
            #expect(kept?.fileID == fresh?.fileID && kept?.head == fresh?.head && kept?.headID == fresh?.headID,
                    "\(context): dead history at \(path)")
        }
        let missing = model.touched.filter { model.nodes[$0] != nil && !store.changed.contains($0) }
        #expect(missing.isEmpty, "\(context): changed inodes not in the change set: \(missing.sorted { $0.rawValue < $1.rawValue })")
    }

    /// One random tree change, done to the store and the model alike (or refused by the
    /// model first, as the filesystem's checks would).
    static func step(_ store: Store, _ model: inout Model, _ rng: inout SplitMix64) throws {
        let dirs = model.directories
        let dir = dirs[rng.int(0..<dirs.count)]
        let name = names[rng.int(0..<names.count)]
        let key = NameKey(name)
        let existing = model.nodes[dir]!.children[key]
        switch rng.int(0..<14) {
        case 12, 13: // setxattr, or removexattr of one set
            guard let id = existing else { return }
            let xattr = ["user.a", "user.b", "user.\u{e9}"][rng.int(0..<3)]
            if rng.int(0..<2) == 0 {
                let value = rng.bytes(rng.int(0..<20))
                try store.setXattr(id, xattr, value)
                model.xattrs[id, default: [:]][xattr] = value
            } else {
                let removed = try store.removeXattr(id, xattr)
                #expect(removed == (model.xattrs[id]?[xattr] != nil), "removexattr \(xattr) of \(id)")
                model.xattrs[id]?[xattr] = nil
            }
            model.touched.insert(id)
        case 10, 11: // an editor's save: a temp file saved once, renamed over a saved file, as the filesystem does it
            // The temp name syncs ("~name") or is local-only ("name.swp", as gedit's is).
            let tempName = rng.int(0..<2) == 0 ? "~" + name : name + ".swp"
            guard let target = existing, model.nodes[target]?.kind == .file, model.versions[target, default: 0] > 0,
                  model.names(of: target) == 1, let before = store.inode(target), let continued = before.fileID,
                  let targetPath = store.path(of: target), !LocalOnly.contains(targetPath),
                  model.nodes[dir]!.children[NameKey(tempName)] == nil else { return }
            let temp = try store.create(parent: dir, name: tempName, kind: .file, mode: 0o600, uid: 1, gid: 1, target: nil)
            var list = ChunkList()
            list.appendInline(rng.bytes(1 + rng.int(0..<40)))
            let tempPath = try #require(store.path(of: temp.id))
            _ = try store.commit(temp.id, content: list, path: tempPath, local: LocalOnly.contains(tempPath))
            store.logTreeChanges()
            // Sometimes folded before the rename (the group commit came in between).
            if rng.int(0..<4) == 0 { try store.foldTree() }
            _ = try store.removeEntry(parent: dir, name: name)
            try store.adoptHistory(target, fileID: .new(), head: nil)
            try store.forget(target)
            try store.moveEntry(from: dir, tempName, to: dir, name)
            let old = try #require(temp.fileID)
            try store.endHistoryRenamedOver(old, of: temp.id)
            try store.adoptHistory(temp.id, fileID: continued, head: before.head, knownFrom: target)
            _ = try store.commit(temp.id, content: list, path: try #require(store.path(of: temp.id)), local: false)
            model.nodes[target] = nil
            model.nodes[temp.id] = Node(kind: .file, mode: 0o600)
            model.nodes[dir]!.children[key] = temp.id
            model.content[temp.id] = list
            model.content[target] = nil
            model.xattrs[target] = nil
            model.versions[temp.id] = model.versions[target, default: 0] + 1
            model.versions[target] = nil
            model.touched.insert(temp.id)
            model.withdrawn.append(old)
        case 8, 9: // a save: a new version of a file (a tiny content, kept in its list)
            guard let id = existing, model.nodes[id]?.kind == .file, let path = store.path(of: id) else { return }
            var list = ChunkList()
            list.appendInline(rng.bytes(1 + rng.int(0..<40)))
            let local = LocalOnly.contains(path)
            _ = try store.commit(id, content: list, path: path, local: local)
            model.content[id] = list
            if !local { model.versions[id, default: 0] += 1 }
            model.touched.insert(id)
        case 0, 1: // create
            guard existing == nil else { return }
            let kind: NodeKind = [.file, .directory, .symlink][rng.int(0..<3)]
            let mode: UInt32 = kind == .symlink ? 0o777 : [0o644, 0o600, 0o755][rng.int(0..<3)]
            let inode = try store.create(parent: dir, name: name, kind: kind, mode: mode, uid: 1, gid: 1,
                                         target: kind == .symlink ? "target" : nil)
            model.nodes[inode.id] = Node(kind: kind, mode: mode)
            model.nodes[dir]!.children[key] = inode.id
            model.touched.formUnion([inode.id])
        case 2: // unlink or rmdir
            guard let id = existing, let node = model.nodes[id], node.children.isEmpty else { return }
            let path = store.path(of: id) ?? name
            let before = store.inode(id)
            // A local version as the head of a file at a synced name (moved there without
            // the filesystem's new version): whether it gets a tombstone depends on the
            // view, which the model does not keep; left out.
            let headIsLocal = try before?.head.flatMap { (row) throws(StoreError) in try store.version(row: row) }?.isLocal == true
            if headIsLocal && !LocalOnly.contains(path) && model.names(of: id) == 1 { return }
            let after = try store.removeEntry(parent: dir, name: name)
            model.nodes[dir]!.children[key] = nil
            // The last name of a saved file: its tombstone, as the filesystem writes it
            // (none at a local-only name).
            if after?.nlink == 0, let before, let fileID = before.fileID, before.head != nil, !LocalOnly.contains(path) {
                try store.commitTombstone(fileID: fileID, head: before.head, path: path, of: id)
                model.tombstones += 1
            }
            if after?.nlink == 0 { try store.forget(id) }
            for gone in model.collect() {
                model.content[gone] = nil
                model.versions[gone] = nil
                model.xattrs[gone] = nil
            }
        case 3: // rename to a free name
            guard let id = existing else { return }
            let to = dirs[rng.int(0..<dirs.count)], toName = names[rng.int(0..<names.count)]
            guard model.nodes[to]!.children[NameKey(toName)] == nil, !model.isAncestor(id, of: to) else { return }
            try store.moveEntry(from: dir, name, to: to, toName)
            model.nodes[dir]!.children[key] = nil
            model.nodes[to]!.children[NameKey(toName)] = id
            model.touched.insert(id)
        case 4: // exchange
            guard let a = existing else { return }
            let to = dirs[rng.int(0..<dirs.count)], toName = names[rng.int(0..<names.count)]
            guard let b = model.nodes[to]!.children[NameKey(toName)], a != b,
                  !model.isAncestor(a, of: to), !model.isAncestor(b, of: dir) else { return }
            try store.exchangeEntries(dir, name, to, toName)
            model.nodes[dir]!.children[key] = b
            model.nodes[to]!.children[NameKey(toName)] = a
            model.touched.formUnion([a, b])
        case 5: // hard link of a file
            guard let id = existing, model.nodes[id]?.kind == .file else { return }
            let to = dirs[rng.int(0..<dirs.count)], toName = names[rng.int(0..<names.count)]
            guard model.nodes[to]!.children[NameKey(toName)] == nil else { return }
            try store.link(id, parent: to, name: toName)
            model.nodes[to]!.children[NameKey(toName)] = id
            model.touched.insert(id)
        default: // chmod
            guard let id = existing, var inode = store.inode(id), inode.kind != .symlink else { return }
            let mode: UInt32 = [0o640, 0o700, 0o444][rng.int(0..<3)]
            inode.mode = mode
            try store.update(inode)
            model.nodes[id]!.mode = mode
            model.touched.insert(id)
        }
    }

    /// A store in `dir` that batches its statements, as a mount's does.
    static func batchingStore(in dir: TempDirectory) throws -> Store {
        let store = try Store(directory: dir.path, deviceName: "model")
        store.startBatching()
        return store
    }

    /// The store in `dir` as kill -9 leaves it (its files as they are), opened from a copy.
    static func openedAfterKill(_ dir: TempDirectory) throws -> (TempDirectory, Store) {
        let copy = TempDirectory()
        copyTree(dir.path, to: copy.path)
        unlink(copy.path + "/lock")
        return (copy, try Store(directory: copy.path, deviceName: "model"))
    }

    /// A write the batch holds and the tree changes of the same hold of the lock are kept
    /// by a crash together: when the lock goes with the batch open, the batch commits
    /// with the overlay folded (a frame written after the batch's commit would leave a
    /// window where kill -9 keeps the write and loses the changes it belongs with).
    @Test func aBatchWriteAndTheTreeChangesOfItsHoldSurviveACrashTogether() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let store = try Self.batchingStore(in: dir)
        let made = try store.create(parent: Store.rootInode, name: "moved", kind: .file, mode: 0o644, uid: 1, gid: 1)
        try store.db.statement("REPLACE INTO settings(key, value) VALUES('batch_write', 'kept')", [])
        #expect(store.db.hasOpenBatch && !store.overlay.isEmpty)
        store.logTreeChanges()
        #expect(store.overlay.isEmpty && !store.db.hasOpenBatch, "the batch and the hold's tree changes commit together")
        let (copy, again) = try Self.openedAfterKill(dir)
        defer { copy.cleanup() }
        #expect(try again.setting("batch_write") == "kept")
        #expect(again.child(Store.rootInode, "moved") == made.id)
    }

    /// The drop of an unlinked inode at FORGET takes no frame of its own: kill -9 before
    /// the next frame loses it, and the next open drops the inode again (no entry names
    /// it), with its xattrs.
    @Test func aDropAtForgetThatNoFrameHoldsIsMadeAgainAtOpen() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let store = try Self.batchingStore(in: dir)
        let made = try store.create(parent: Store.rootInode, name: "doomed", kind: .file, mode: 0o644, uid: 1, gid: 1)
        try store.setXattr(made.id, "user.tag", [1])
        store.logTreeChanges()
        try store.foldTree()
        _ = try store.removeEntry(parent: Store.rootInode, name: "doomed")
        store.logTreeChanges()
        let frames = store.treeLog!.nextSequence
        try store.forget(made.id)
        store.logTreeChanges()
        #expect(store.treeLog!.nextSequence == frames, "the drop took a frame")
        let (copy, again) = try Self.openedAfterKill(dir)
        defer { copy.cleanup() }
        #expect(again.inode(made.id) == nil, "the unlinked inode is back after a crash")
        let rows: [Int64] = try again.db.rows("SELECT count(*) FROM inodes WHERE id = ?", [.inode(made.id)]) { $0.int(0) }
        let xattrs: [Int64] = try again.db.rows("SELECT count(*) FROM xattrs WHERE inode = ?", [.inode(made.id)]) { $0.int(0) }
        #expect(rows == [0] && xattrs == [0], "rows of the dropped inode: \(rows), xattrs: \(xattrs)")
    }

    /// A directory with an entry whose inode row is gone (or damaged) is not held in
    /// memory: each of its names is looked up by itself, so none reads as absent.
    @Test func aDirectoryWithADanglingEntryIsNotHeldInMemory() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let store = try Store(directory: dir.path, deviceName: "model")
        let a = try store.create(parent: Store.rootInode, name: "a", kind: .file, mode: 0o644, uid: 1, gid: 1)
        let b = try store.create(parent: Store.rootInode, name: "b", kind: .file, mode: 0o644, uid: 1, gid: 1)
        try store.db.execute("DELETE FROM inodes WHERE id = \(b.id.rawValue)")
        store.forgetCachedTree()
        #expect(store.child(Store.rootInode, "a") == a.id)
        #expect(store.child(Store.rootInode, "b") == b.id, "the entry is there; its inode row is not")
        #expect(store.tree.withLock { $0.directories.count(Store.rootInode) } == nil)
    }

    /// Frames round-trip, and no bytes make the decoder trap or allocate without bound:
    /// every prefix of a frame, every frame with a byte flipped, and random bytes decode
    /// to a frame or to nil.
    @Test func framesRoundTripAndDamageIsRefused() {
        let seed = replayableSeed(5, variable: "UBQ_OVERLAY_SEED", test: "framesRoundTripAndDamageIsRefused",
                                  filter: "TreeOverlayModelTests")
        var rng = SplitMix64(seed: seed)
        var inode = Inode(id: InodeNumber(rawValue: 42), kind: .file, mode: 0o640, uid: 7, gid: 8, size: 12345,
                          time: 99, rdev: 3, target: nil, fileID: .new())
        inode.head = 17
        inode.nlink = 2
        inode.allocated = 4096
        inode.keep = .pinned
        var symlink = Inode(id: InodeNumber(rawValue: 43), kind: .symlink, mode: 0o777, uid: 0, gid: 0, time: 1, target: "t\u{e9}")
        symlink.nlink = 1
        let changes: [TreeChange] = [
            .putInode(TreeNode(inode: inode, link: EntryRef(parent: Store.rootInode, name: "e\u{301}"))),
            .putInode(TreeNode(inode: symlink, link: nil)),
            .dropInode(InodeNumber(rawValue: 9)),
            .putEntry(parent: Store.rootInode, name: "a b", inode: InodeNumber(rawValue: 42)),
            .removeEntry(parent: InodeNumber(rawValue: 5), name: "x"),
            .pending(kind: PendingKind.vacated.rawValue, key: "dir/file"),
            .withdraw(row: 77, id: .new(), fileID: .new()),
            .localSave(SavedVersion(row: 78, id: .new(), fileID: .new(), parents: [.new()], deviceName: "d", committed: 5, mtime: 6,
                                    mode: 0o600, path: "x/n.swp", chunks: ChunkList(), xattrs: []),
                       inode: InodeNumber(rawValue: 42), replaces: 12),
            .xattr(InodeNumber(rawValue: 42), name: "user.\u{e9}", value: [0, 1, 255]),
            .xattr(InodeNumber(rawValue: 43), name: "user.x", value: nil),
            .xattr(InodeNumber(rawValue: 43), name: "user.y", value: []),
        ]
        let frame = TreeChange.encode(changes)
        #expect(TreeChange.decode(frame) == changes, "seed \(seed)")
        for cut in 0..<frame.count { #expect(TreeChange.decode(frame.prefix(cut)) == nil, "seed \(seed): prefix \(cut)") }
        for _ in 0..<2000 {
            var damaged = frame
            damaged[rng.int(0..<damaged.count)] ^= UInt8(1 + rng.int(0..<255))
            _ = TreeChange.decode(damaged)
            _ = TreeChange.decode(rng.bytes(rng.int(0..<64)))
        }
        // A path longer than 64 KiB (thousands of names deep) round-trips: a frame the
        // encoder writes, the decoder reads.
        let deep = String(repeating: "d/", count: 40_000) + "f"
        let long: [TreeChange] = [.pending(kind: PendingKind.vacated.rawValue, key: deep), .history(.new(), path: deep, live: false)]
        #expect(TreeChange.decode(TreeChange.encode(long)) == long)
        // A count of four billion changes in a short frame is refused, not reserved.
        #expect(TreeChange.decode([TreeChange.frameVersion, 0xff, 0xff, 0xff, 0xff, 2]) == nil)
    }

    /// What lookup and getattr read without the store's lock (`TreeCache`): whatever it
    /// holds is the tree as it is now.
    static func checkWorkingSet(_ tree: TreeCache, _ model: Model, _ context: String) {
        var answered = 0
        for (dir, node) in model.nodes where node.kind == .directory {
            for (key, id) in node.children {
                switch tree.lookUp(dir, key.name, holding: { $0 }) {
                case .found(_, _, let found)?:
                    #expect(found == id, "\(context): working set: \(key.name) in \(dir) is \(found), not \(id)")
                    answered += 1
                case .absent?: Issue.record("\(context): working set: \(key.name) in \(dir) is absent")
                case nil: break
                }
            }
            if case .found(_, _, let found)? = tree.lookUp(dir, "never-made", holding: { $0 }) {
                Issue.record("\(context): working set: never-made in \(dir) is \(found)")
            }
        }
        let highest = model.nodes.keys.map(\.rawValue).max() ?? 1
        for raw in 1...(highest + 8) {
            let id = InodeNumber(rawValue: raw)
            guard let (inode, _, _) = tree.inode(id, holding: { _ in () }) else { continue }
            guard let node = model.nodes[id] else {
                #expect(inode.nlink == 0, "\(context): working set holds inode \(id), which is gone")
                continue
            }
            #expect(inode.kind == node.kind && inode.mode == node.mode && inode.nlink == model.nlink(id),
                    "\(context): working set: inode \(id) \(inode.kind) \(inode.mode) nlink \(inode.nlink) against \(node.kind) \(node.mode) nlink \(model.nlink(id))")
            answered += 1
        }
        workingSetAnswers.add(answered, ordering: .relaxed)
    }

    /// Answers the working set gave in the checks (a check that never finds anything
    /// there proves nothing).
    static let workingSetAnswers = Atomic<Int>(0)

    @Test(arguments: [1, 2, 3, 4, 5, 6] as [UInt64])
    func agreesWithTheModelAcrossCrashes(seed given: UInt64) throws {
        let seed = replayableSeed(given, variable: "UBQ_OVERLAY_SEED", test: "agreesWithTheModelAcrossCrashes",
                                  filter: "TreeOverlayModelTests")
        var rng = SplitMix64(seed: seed)
        var dir = TempDirectory()
        defer { dir.cleanup() }
        var store = try Store(directory: dir.path, deviceName: "model")
        store.startBatching()
        // Even seeds keep few history names: directories too big to keep, and the sets
        // dropped and read again as the budget runs out.
        let historyNames = HistoryNames(budget: seed % 2 == 0 ? 24 : 131_072)
        store.historyNames = historyNames
        // Every directory read whole at its first look (`StoredHistories`); with even
        // seeds, also too big to keep, and forgotten as the budget runs out.
        let storedHistories = StoredHistories(budget: seed % 2 == 0 ? 24 : 131_072, readAfter: 1)
        store.storedHistories = storedHistories
        var model = Model()
        var crashes = 0, replayed = 0, parts = 0, heldFolded = 0
        for round in 0..<600 {
            let context = "seed \(seed), round \(round)"
            try Self.step(store, &model, &rng)
            // What a mount does when the store's lock goes: the change is acknowledged.
            store.logTreeChanges()
            switch rng.int(0..<40) {
            case 0...4 where seed > 4:
                // Seeds from 5 fold only in parts: the overlay grows, and mostly holds
                // changes already folded ahead of those not yet (`TreeOverlay.folded`).
                break
            case 9, 10, 11:
                // The group commit's parts: a run of whole frames folded, the rest left
                // in the overlay (a crash in a later round replays it after the new mark).
                store.foldPolicy.quiet = 0
                store.foldPolicy.part = 1 + rng.int(0..<6)
                for _ in 0..<(1 + rng.int(0..<3)) where try store.groupCommit() == .more {
                    parts += 1
                    heldFolded = max(heldFolded, store.overlay.folded)
                }
                Self.check(store, model, context + " after a part of the overlay was folded")
            case 0, 1, 2: try store.commitBatch()
            case 3, 4: try store.foldTree()
            case 5: try store.markDurable()
            case 6:
                // A transaction that folds the overlay (its first statement reads the tree)
                // and then fails: the folded changes go back to the overlay, none is lost.
                struct Abandoned: Error {}
                _ = try? store.db.transaction { () throws(StoreError) in
                    _ = try store.db.rows("SELECT count(*) FROM entries", []) { $0.int(0) }
                    throw StoreError.database("abandoned")
                }
                Self.check(store, model, context + " after a rollback")
            case 7, 8:
                // kill -9: the files as they are; sometimes a frame torn halfway at the end.
                let copy = TempDirectory()
                copyTree(dir.path, to: copy.path)
                unlink(copy.path + "/lock")
                if rng.int(0..<2) == 0, let last = try? OperationLog.segmentFiles(copy.path + "/log").last {
                    let fd = open(last.path, O_WRONLY | O_APPEND)
                    _ = write(fd, [UInt8(40), 0, 0, 0, 1, 2, 3], 7)
                    close(fd)
                }
                store = try Store(directory: copy.path, deviceName: "model")
                store.startBatching()
                store.historyNames = historyNames
                store.storedHistories = storedHistories
                dir.cleanup()
                dir = copy
                crashes += 1
                replayed += store.replayedTreeChanges
                Self.check(store, model, context + " after a crash")
                // Kept until the intents are applied: only saves that were never written.
                for id in try store.index.withdrawnSetting() {
                    #expect(try !store.db.aroundGate { () throws(StoreError) in try store.index.versionExists(id) }, "\(context): \(id) is withdrawn and written")
                }
            default: break
            }
            if round % 50 == 0 { Self.check(store, model, context) }
        }
        Self.check(store, model, "seed \(seed) at the end")
        for (id, count) in model.versions {
            let fileID = try #require(store.inode(id)?.fileID)
            #expect(try store.versions(of: fileID).count == count, "seed \(seed): file \(id)'s versions")
        }
        let tombstones = try store.db.rows("SELECT count(*) FROM versions WHERE tombstone = 1", []) { Int($0.int(0)) }.first
        #expect(tombstones == model.tombstones, "seed \(seed): tombstones")
        for old in model.withdrawn {
            let left = try store.db.rows("SELECT (SELECT count(*) FROM versions WHERE file_id = ?1 AND local = 0) + (SELECT count(*) FROM histories WHERE file_id = ?1)",
                                         [.id(old)]) { $0.int(0) }.first
            #expect(left == 0, "seed \(seed): a withdrawn history left \(left ?? -1) rows")
        }
        print("TreeOverlayModelTests seed \(seed): \(crashes) crashes, \(replayed) changes replayed, \(model.nodes.count) inodes, \(model.versions.values.reduce(0, +)) versions, \(model.tombstones) tombstones, \(model.withdrawn.count) withdrawn, \(parts) folds of a part, at most \(heldFolded) folded changes held")
        #expect(crashes > 0 && replayed > 0 && parts > 0, "seed \(seed): the run must crash, replay and fold parts")
        if seed > 4 { #expect(heldFolded > 0, "seed \(seed): the overlay must hold folded changes at times") }
        #expect(Self.workingSetAnswers.load(ordering: .relaxed) > 0, "seed \(seed): the working set must answer in the checks")
    }
}
