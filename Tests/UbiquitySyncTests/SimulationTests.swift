import Glibc
import Testing
import TestSupport
import UbiquityBacking
import UbiquityCrypto
import UbiquitySystem
@testable import UbiquityFS
@testable import UbiquityStore
@testable import UbiquitySync

/// Deterministic multi-device simulation: devices edit, rename, delete, resolve
/// conflicts, pause, lose their backing directory, prune their history and collect
/// garbage (in their stores and in the backing directory) in a seeded random order, each with its own skewed injected clock; sync cycles
/// run at random points. In the end, with everything reconnected, every device must show
/// the same tree and the same conflicts, every version any device committed (and no
/// device pruned) must be in every device's history, and every device's store must be
/// whole (fsck: no version lost a chunk to gc).
///
/// Replay one schedule: `UBQ_SIM_SEED=1234 swift test --filter Simulation`.
/// More schedules: `UBQ_SIM_SCHEDULES=5000`.
@Suite struct SimulationTests {
    @Test func devicesConverge() throws {
        let env = environment
        if let seed = env("UBQ_SIM_SEED").flatMap(UInt64.init) {
            try runSchedule(seed: seed, steps: Int(env("UBQ_SIM_STEPS") ?? "") ?? 120, encrypted: env("UBQ_SIM_ENCRYPTED") == "1")
            return
        }
        let count = Int(env("UBQ_SIM_SCHEDULES") ?? "") ?? 200
        let start = nowNanos()
        for seed in 1...UInt64(count) { try runSchedule(seed: seed, steps: 60) }
        print("simulation: \(count) schedules of 60 steps, 3 devices, in \((nowNanos() - start) / 1_000_000) ms")
    }

    /// The same schedules through an encrypted container (issue 25): sync, gc, repacking
    /// and the key-value exchange see no difference.
    @Test func devicesConvergeEncrypted() throws {
        let count = Int(environment("UBQ_SIM_ENCRYPTED_SCHEDULES") ?? "") ?? 40
        let start = nowNanos()
        for seed in 1...UInt64(count) { try runSchedule(seed: seed, steps: 60, encrypted: true) }
        print("simulation: \(count) encrypted schedules of 60 steps, 3 devices, in \((nowNanos() - start) / 1_000_000) ms")
    }

    /// Regression (t-differential seed 889786859): after a remount a hard-linked file's
    /// first name can be another one (entries load in key order); the sync step then
    /// deleted the name that used to come first.
    @Test func hardLinkNamesSurviveARemount() throws {
        let temp = TempDirectory(prefix: "ubiquity-sim")
        let root = temp.path
        defer { temp.cleanup() }
        mkdir(root + "/backing", 0o755)
        do {
            let d = try SimDevice(name: "one", root: root, backing: root + "/backing", clock: nowNanos)
            try d.save("z/a", "linked")
            let dir = try d.fs.lookup(parent: Store.rootInode, name: "z").ino
            let ino = try d.fs.lookup(parent: dir, name: "a").ino
            _ = try d.fs.link(ino, parent: Store.rootInode, name: "b")
            d.cycle()
            d.fs.drain()
        }
        let again = try SimDevice(name: "one", root: root, backing: root + "/backing", clock: nowNanos)
        again.cycle()
        again.cycle()
        #expect(try again.tree() == ["b": "file linked", "z": "dir 755", "z/a": "file linked"])
    }

    /// Regression (t-differential seed 308010073): a directory removed and replaced by a
    /// second name of a hard-linked symlink kept its record: the step took any symlink
    /// there for the directory's node, while the whole-tree scan (rightly) sees a
    /// symlink only at its primary name.
    @Test func hardLinkedSymlinkDoesNotKeepARemovedDirectory() throws {
        let temp = TempDirectory(prefix: "ubiquity-sim")
        defer { temp.cleanup() }
        mkdir(temp.path + "/backing", 0o755)
        let d = try SimDevice(name: "one", root: temp.path, backing: temp.path + "/backing", clock: nowNanos)
        _ = try d.directory("c d", create: true)
        let link = try d.fs.symlink(target: "x", parent: Store.rootInode, name: "a", caller: d.me)
        d.cycle()
        #expect(try d.store.replica.current(.directory("c d")) != nil)
        try d.fs.rmdir(parent: Store.rootInode, name: "c d")
        _ = try d.fs.link(link.ino, parent: Store.rootInode, name: "c d")
        d.cycle()
        #expect(try d.store.replica.current(.directory("c d")) == nil)
        #expect(try d.store.replica.current(.symlink("a"))?.target == "x")
        #expect(try d.store.replica.current(.symlink("c d")) == nil) // a local second name
    }

    /// Regression (t-differential seed 1949766429): a symlink replaced here by a
    /// directory kept its record under the directory's (a false conflict), and came back
    /// when the directory went. The step took a directory there for the symlink, and left
    /// alone a record the directory hid.
    @Test func symlinkReplacedByADirectoryIsGone() throws {
        let temp = TempDirectory(prefix: "ubiquity-sim")
        defer { temp.cleanup() }
        mkdir(temp.path + "/backing", 0o755)
        let d = try SimDevice(name: "one", root: temp.path, backing: temp.path + "/backing", clock: nowNanos)
        _ = try d.fs.symlink(target: "../\u{65E5}\u{672C}", parent: Store.rootInode, name: "\u{65E5}\u{672C}", caller: d.me)
        d.cycle()
        #expect(try d.store.replica.current(.symlink("\u{65E5}\u{672C}")) != nil)
        try d.fs.unlink(parent: Store.rootInode, name: "\u{65E5}\u{672C}")
        _ = try d.directory("\u{65E5}\u{672C}", create: true)
        d.cycle()
        #expect(try d.store.replica.current(.symlink("\u{65E5}\u{672C}")) == nil)
        #expect(try d.store.replica.state(at: "\u{65E5}\u{672C}").conflicts.isEmpty)
        try d.fs.rmdir(parent: Store.rootInode, name: "\u{65E5}\u{672C}")
        d.cycle()
        #expect(try d.tree() == [:])
    }

    /// The other side of that rule: a symlink that another device's directory hides is a
    /// conflict version, and stays one across a remount (the whole-tree step).
    @Test func symlinkUnderAnotherDevicesDirectoryStaysAConflict() throws {
        let temp = TempDirectory(prefix: "ubiquity-sim")
        let root = temp.path
        defer { temp.cleanup() }
        mkdir(root + "/backing", 0o755)
        mkdir(root + "/one", 0o755)
        mkdir(root + "/two", 0o755)
        do {
            let one = try SimDevice(name: "one", root: root + "/one", backing: root + "/backing", clock: nowNanos)
            let two = try SimDevice(name: "two", root: root + "/two", backing: root + "/backing", clock: nowNanos)
            _ = try one.fs.symlink(target: "t", parent: Store.rootInode, name: "p", caller: one.me)
            try two.save("p/x", "two's")
            for _ in 0..<3 { one.cycle(); two.cycle() }
            #expect(try one.tree() == ["p": "dir 755", "p/x": "file two's"])
            #expect(try one.store.replica.state(at: "p").conflicts.map(\.kind) == [.symlink])
            one.fs.drain()
            two.fs.drain()
        }
        let again = try SimDevice(name: "one", root: root + "/one", backing: root + "/backing", clock: nowNanos)
        again.cycle()
        #expect(try again.store.replica.current(.symlink("p"))?.target == "t")
        #expect(try again.store.replica.state(at: "p").conflicts.map(\.kind) == [.symlink])
    }

    /// Seeds that broke the incremental sync step (the change set instead of a walk of
    /// the whole tree): a tombstone that revealed another device's file (187), a save
    /// whose older mtime lost to another device's (250, 338), a conflict at a path (337).
    @Test func changeSetRegressions() throws {
        for seed: UInt64 in [187, 250, 337, 338] { try runSchedule(seed: seed, steps: 60) }
    }

    @Test func longSchedulesConverge() throws {
        for seed in UInt64(10_001)...10_010 { try runSchedule(seed: seed, steps: 400) }
    }
}

final class SimDevice {
    let name: String
    let store: Store
    let fs: FileSystem
    let engine: SyncEngine
    /// The device's way to the backing directory: a symlink the simulation breaks to
    /// make the directory unreachable.
    let link: String
    var paused = false
    let me = Caller(uid: getuid(), gid: getgid())

    /// A device syncing through the backing directory `backing`, by way of a symlink.
    /// With `key`, an encrypted container: every object sealed, files cut with the
    /// key's chunker.
    convenience init(name: String, root: String, backing: String, clock: @escaping @Sendable () -> Nanos,
                     options: SyncEngine.Options? = nil, fsOptions: FileSystem.Options = FileSystem.Options(),
                     key: ContainerKey? = nil) throws {
        let link = root + "/\(name)-backing"
        symlink(backing, link)
        let store: any BackingStore = key.map { EncryptedStore(DirectoryStore(root: link), key: $0) } ?? DirectoryStore(root: link)
        try self.init(name: name, root: root, link: link, backing: store, clock: clock, options: options,
                      fsOptions: fsOptions, chunker: key.map { Chunker.keyed(table: $0.chunkerTable())! } ?? .standard)
    }

    /// The simulation's options, but every cycle looks at the log (no backing off while
    /// idle): tests whose devices take turns faster than the idle poll interval.
    static var alwaysPolling: SyncEngine.Options {
        var o = SyncEngine.Options()
        o.pullSlice = 3
        o.pullSliceMost = 3
        o.activeWindow = .greatestFiniteMagnitude
        return o
    }

    /// A device syncing through any backing store (memory, counted, failing on purpose).
    /// `link` is the symlink the simulation breaks, empty when there is none; `options`
    /// default to the simulation's (a small pull slice).
    init(name: String, root: String, link: String = "", backing: any BackingStore, clock: @escaping @Sendable () -> Nanos,
         options: SyncEngine.Options? = nil, fsOptions: FileSystem.Options = FileSystem.Options(), chunker: Chunker = .standard) throws {
        self.name = name
        self.link = link
        // A cache of a few inodes: every path of the simulation also reads the tree back
        // from SQLite.
        store = try Store(directory: root + "/\(name)-store", deviceName: name, cachedInodes: 8, chunker: chunker)
        store.clock = clock
        fs = FileSystem(store: store, options: fsOptions)
        // Other devices' records arrive a few at a time (slices, as a device catching up
        // takes them).
        let options = options ?? {
            var o = SyncEngine.Options()
            o.pullSlice = 3
            o.pullSliceMost = 3
            return o
        }()
        engine = SyncEngine(store: fs.store, backing: backing, options: options)
    }

    func cycle() { _ = try? engine.cycle(pushPull: !paused) }

    func directory(_ path: String, create: Bool) throws -> InodeNumber? {
        var ino = Store.rootInode
        for component in path.split(separator: "/").map(String.init) {
            if let a = try? fs.lookup(parent: ino, name: component) {
                guard a.mode & UInt32(S_IFMT) == UInt32(S_IFDIR) else { return nil }
                ino = a.ino
            } else if create {
                ino = try fs.mkdir(parent: ino, name: component, mode: 0o755, caller: me).ino
            } else {
                return nil
            }
        }
        return ino
    }

    func save(_ path: String, _ text: String) throws {
        let (dir, name) = splitPath(path)!
        guard let parent = try directory(dir, create: true) else { return }
        let handle: HandleID
        if let existing = try? fs.lookup(parent: parent, name: name) {
            guard existing.mode & UInt32(S_IFMT) == UInt32(S_IFREG) else { return }
            handle = try fs.open(existing.ino, flags: OpenFlags(O_WRONLY | O_TRUNC))
        } else {
            handle = try fs.create(parent: parent, name: name, mode: 0o644, flags: OpenFlags(O_WRONLY), caller: me).1
        }
        _ = try Array(text.utf8).withUnsafeBytes { try fs.write(handle, offset: 0, data: $0) }
        try fs.release(handle)
    }

    /// Every file, directory and symlink: path -> what it is and holds.
    func tree() throws -> [String: String] {
        var result: [String: String] = [:]
        func walk(_ ino: InodeNumber, _ prefix: String) throws {
            let h = try fs.opendir(ino)
            defer { fs.releasedir(h) }
            for entry in try fs.readdir(h) where entry.name != "." && entry.name != ".." {
                if ino == Store.rootInode && (entry.name == ".versions" || entry.name == ".conflicts") { continue }
                let path = prefix + entry.name
                switch entry.attributes.mode & UInt32(S_IFMT) {
                case UInt32(S_IFDIR):
                    result[path] = "dir \(String(entry.attributes.mode & 0o7777, radix: 8))"
                    try walk(entry.attributes.ino, path + "/")
                case UInt32(S_IFLNK):
                    result[path] = "link " + (try fs.readlink(entry.attributes.ino))
                default:
                    let f = try fs.open(entry.attributes.ino, flags: OpenFlags(O_RDONLY))
                    defer { try? fs.release(f) }
                    result[path] = "file " + String(decoding: try fs.read(f, offset: 0, count: 1 << 20), as: UTF8.self)
                }
            }
        }
        try walk(Store.rootInode, "")
        return result
    }

    /// Sets or deletes a key of the key-value store through the mount's `.kv/` door.
    func kvSet(_ key: String, _ value: Int) throws {
        let (attributes, handle) = try fs.create(parent: KeyValueDoor.root, name: key, mode: 0o644, flags: OpenFlags(O_WRONLY | O_TRUNC), caller: me)
        try fs.setxattr(attributes.ino, name: KeyValueDoor.typeAttribute, value: Array("integer".utf8), flags: 0)
        _ = try Array("\(value)".utf8).withUnsafeBytes { try fs.write(handle, offset: 0, data: $0) }
        try fs.flush(handle)
        try fs.release(handle)
    }

    /// The live keys: key -> value and writer.
    func keyValues() -> [String: String] {
        fs.withMetaLock { _, store in
            var result: [String: String] = [:]
            for e in (try? store.keyValues.entries()) ?? [] {
                result[e.key] = String(decoding: e.value, as: UTF8.self) + " by " + e.stamp.device.hex
            }
            return result
        }
    }

    func conflicts() -> [String: [String]] {
        fs.withMetaLock { _, store in
            var result: [String: [String]] = [:]
            for path in (try? store.conflictedPaths()) ?? ["<error>"] {
                result[path] = (try? store.replica.state(at: path).conflicts.map(\.id.hex).sorted()) ?? ["<error>"]
            }
            return result
        }
    }
}

/// One schedule. Failures name the seed.
/// `encrypted`: the devices share an encrypted container (one random key).
func runSchedule(seed: UInt64, steps: Int, encrypted: Bool = false) throws {
    let key: ContainerKey? = encrypted ? .random() : nil
    var rng = SplitMix64(seed: seed)
    let temp = TempDirectory(prefix: "ubiquity-sim")
    let root = temp.path
    defer { temp.cleanup() }
    let backing = root + "/backing"
    mkdir(backing, 0o755)
    // One logical clock; each device reads it with its own skew (clocks disagree).
    let ticks = Locked<Nanos>(1_700_000_000_000_000_000)
    var devices: [SimDevice] = []
    for i in 0..<3 {
        let skew = Nanos(rng.next() % 4_000_000_000) - 2_000_000_000
        // dev1 takes contents on demand (files on demand): only what it reads comes; dev2
        // downloads everything but keeps at most 3,000 bytes of contents (a cache limit).
        var options = SyncEngine.Options()
        options.pullSlice = 3
        options.pullSliceMost = 3
        if i == 1 { options.download = .onDemand }
        var fsOptions = FileSystem.Options()
        if i == 2 { fsOptions.cacheSize = 3_000; options.cacheSize = 3_000 }
        devices.append(try SimDevice(name: "dev\(i)", root: root, backing: backing, clock: {
            ticks.withLock { t in t += 1_000_000; return t } + skew
        }, options: options, fsOptions: fsOptions, key: key))
        devices[i].fs.attach(sync: devices[i].engine) // evictions check the backing store through it
    }
    let names = ["a.txt", "b.txt", "d/c.txt", "d/e/f.txt", "g.tinypix.txt"]
    var trace: [String] = []
    var pruned: Set<String> = [], prunedOn: Set<String> = []
    var backingGcRuns: Int64 = 0
    // Key-value operations draw from their own generator, so the schedules of the file
    // operations stay those of every seed before them (the regression seeds).
    var kvRng = SplitMix64(seed: seed ^ 0x6b76_6b76)
    // Evictions by hand and the cache limit's passes, from a generator of their own too.
    var evictRng = SplitMix64(seed: seed ^ 0x6576_6963)
    // Folds with no sync step after them (the group commit's, as a mount runs it): this
    // device's records wait outside the synced view for the next step, while prune,
    // conflicts taken or discarded and pulls meet them. A generator of their own too.
    var foldRng = SplitMix64(seed: seed ^ 0x666f_6c64)
    for step in 0..<steps {
        let d = devices[Int(rng.next() % UInt64(devices.count))]
        let roll = rng.next() % 100
        let path = names[Int(rng.next() % UInt64(names.count))]
        let (dir, name) = splitPath(path)!
        trace.append("\(step) \(d.name) \(roll) \(path)")
        switch roll {
        case 0..<35:
            // Every seventh save is large enough to travel as an object, not inline, and
            // to be a chunk file (more than 2 KiB), which eviction can drop.
            try d.save(path, String(repeating: "\(d.name) step \(step) ", count: step % 7 == 0 ? 200 : 1))
        case 35..<45:
            if let parent = try d.directory(dir, create: false) { try? d.fs.unlink(parent: parent, name: name) }
        case 45..<55:
            let other = names[Int(rng.next() % UInt64(names.count))]
            let (newDir, newName) = splitPath(other)!
            if let parent = try d.directory(dir, create: false), let newParent = try d.directory(newDir, create: true) {
                try? d.fs.rename(parent: parent, name: name, newParent: newParent, newName: newName, flags: 0)
            }
        case 55..<60:
            if let parent = try d.directory("d", create: false) { try? d.fs.rmdir(parent: parent, name: "e") }
        case 60..<65:
            d.paused.toggle()
        case 65..<68:
            if access(d.link, F_OK) == 0 { unlink(d.link) } else { symlink(backing, d.link) }
        case 68..<74:
            try resolveSomeConflict(d, &rng)
        case 74..<77:
            if let parent = try d.directory(dir, create: true) {
                _ = try? d.fs.symlink(target: "../\(step)", parent: parent, name: "s\(step % 3)", caller: d.me)
            }
        case 77..<80:
            // Prune everything the policy lets go, then gc with every chunk an hour old
            // (the grace would otherwise keep all of them in a run this fast).
            var policy = RetentionPolicy.standard
            policy.apply(keepWithin: 1, keepDeletedWithin: 1)
            let report = try d.fs.prune(policy: policy, now: d.store.clock(), dryRun: false)
            pruned.formUnion(report.versions.map(\.id.hex))
            prunedOn.insert(d.name)
            for id in d.fs.chunks.allChunkIDs() { try d.fs.chunks.setLastUse(id, seconds: time(nil) - 3600) }
            _ = try d.fs.collectGarbage(grace: 0)
            // The backing directory's gc, each run a simulated eight days after the last:
            // this device's journal rewritten (always, or when due), unused objects made
            // fossils, the fossils of the run before deleted. Offline: it fails, as it would.
            _ = try? d.engine.checkpointJournal(force: rng.next() % 2 == 0)
            backingGcRuns += 1
            _ = try? BackingCollector(backing: d.engine.backing).run(now: Int64(time(nil)) + backingGcRuns * 8 * 86_400)
        default:
            d.cycle()
        }
        switch evictRng.next() % 100 {
        case 0..<8:
            let victim = names[Int(evictRng.next() % UInt64(names.count))]
            let (vDir, vName) = splitPath(victim)!
            if let parent = try d.directory(vDir, create: false), let ino = try? d.fs.lookup(parent: parent, name: vName).ino {
                trace.append("  evict \(victim): \(d.fs.evict(ino))")
            }
        case 8..<20:
            d.fs.keepCacheLimit()
            trace.append("  cache limit: \(d.fs.contentTotals()?.here ?? -1) bytes here")
        default: break
        }
        if foldRng.next() % 100 < 30 {
            let (asKept, rebuilt) = try d.fs.withMetaLock { (_, store) throws(StoreError) in
                try store.commitBatch()
                return try store.viewAsKeptAndRebuilt()
            }
            trace.append("  fold")
            if asKept != rebuilt {
                Issue.record("seed \(seed): after a fold, \(d.name)'s view is not what its viewed records build\ntrace:\n\(trace.suffix(40).joined(separator: "\n"))")
            }
        }
        if kvRng.next() % 100 < 25 {
            let key = "k\(kvRng.next() % 4)"
            if kvRng.next() % 4 == 0 {
                try? d.fs.unlink(parent: KeyValueDoor.root, name: key)
                trace.append("  kv rm \(key)")
            } else {
                try d.kvSet(key, step)
                trace.append("  kv set \(key)=\(step)")
            }
        }
    }
    // Reconnect everyone and let the records flow until nothing changes.
    for d in devices {
        d.paused = false
        if access(d.link, F_OK) != 0 { symlink(backing, d.link) }
    }
    for _ in 0..<4 { for d in devices { d.cycle() } }

    let context = "seed \(seed)\(encrypted ? " encrypted" : "") (replay: UBQ_SIM_SEED=\(seed) UBQ_SIM_STEPS=\(steps)\(encrypted ? " UBQ_SIM_ENCRYPTED=1" : "") swift test --filter Simulation)"
    let firstKeys = devices[0].keyValues()
    for d in devices.dropFirst() where d.keyValues() != firstKeys {
        Issue.record("key-value stores differ, \(context):\ndev0 \(firstKeys)\n\(d.name) \(d.keyValues())\ntrace:\n\(trace.suffix(60).joined(separator: "\n"))")
    }
    let first = try devices[0].tree()
    let firstConflicts = devices[0].conflicts()
    for d in devices.dropFirst() {
        let tree = try d.tree()
        if tree != first {
            let diff = Set(tree.keys).union(first.keys).sorted().filter { tree[$0] != first[$0] }
                .map { "\($0): dev0 \(first[$0] ?? "-") | \(d.name) \(tree[$0] ?? "-")" }
            var views = ""
            for key in Set(tree.keys).union(first.keys).sorted() where tree[key] != first[key] {
                for dev in devices {
                    guard let state = try? dev.store.replica.state(at: key) else { views += "\n  \(dev.name): no state"; continue }
                    let local = dev.store.locate(key).flatMap { dev.store.inode($0.2) }
                    if case .node(let r) = state.shown {
                        let rows = (try? dev.store.db.rows("SELECT row, id, parents, device_name, tombstone, meta, path FROM \(Store.versionsWithDevices) WHERE file_id = ? ORDER BY row", [.node(r.node)]) { "\($0.int(0)) \($0.versionID(1).hex.prefix(6)) p=\($0.versionIDs(2).map { $0.hex.prefix(6) }) \($0.text(3)) t=\($0.int(4)) m=\($0.int(5)) \($0.text(6))" }) ?? []
                        views += "\n    " + rows.joined(separator: "\n    ")
                    }
                    let total = (try? dev.store.db.rows("SELECT count(*), sum(uploaded) FROM versions WHERE local = 0", []) { "\($0.int(0)) records, \($0.int(1)) uploaded" }.first) ?? ""
                    views += "\n  \(dev.name): \(total)"
                    for r in (try? dev.store.replica.currentRecords(atOrBelow: key)) ?? [] {
                        views += "\n    node \(r.node.description.prefix(6)) current \(r.id.hex.prefix(6)) mtime \(r.mtime) heads \(((try? dev.store.replica.heads(r.node)) ?? []).map { "\($0.id.hex.prefix(6))/\($0.isTombstone)" })"
                    }
                    views += "\n  \(dev.name) \(key): shown \(state.shown) conflicts \(state.conflicts.map(\.id)) local \(String(describing: local?.fileID)) unreconciled \(dev.store.unreconciled.contains(NameKey(key)))"
                }
            }
            Issue.record("trees differ, \(context):\n\(diff.joined(separator: "\n"))\(views)\ntrace:\n\(trace.suffix(environment("UBQ_SIM_TRACE") != nil ? 10_000 : 40).joined(separator: "\n"))")
            return
        }
        let conflicts = d.conflicts()
        if conflicts != firstConflicts {
            let paths = Set(firstConflicts.keys).symmetricDifference(conflicts.keys)
                .union(firstConflicts.keys.filter { firstConflicts[$0] != conflicts[$0] })
            let describe = { (x: SimDevice) -> String in
                x.fs.withMetaLock { _, store in
                    ((try? store.replica.records(atPaths: Array(paths))) ?? [])
                        .map { "\($0.id) node=\($0.node) parents=\($0.parents) tomb=\($0.isTombstone) dev=\($0.device) path=\($0.path)" }
                        .sorted().joined(separator: "\n")
                }
            }
            Issue.record("conflict sets differ, \(context)\ndev0: \(firstConflicts)\n\(describe(devices[0]))\n\(d.name): \(conflicts)\n\(describe(d))")
        }
    }
    // The content totals the triggers kept are what the files say, on every device; the
    // device with a cache limit gets under it once all is uploaded, and still reads the
    // same tree (what it evicted comes back when read).
    for d in devices {
        let (kept, counted) = try d.fs.withMetaLock { (_, store) throws(StoreError) in (store.contentTotals(), try store.countedContentTotals()) }
        if kept != counted { Issue.record("\(d.name)'s content totals \(String(describing: kept)) are not the files' \(counted), \(context)") }
        // The synced view and `.versions/`' directory counts, as sync steps (slices that
        // remember what they wrote) kept them, are what building them again writes.
        let (asKept, rebuilt) = try d.fs.withMetaLock { (_, store) throws(StoreError) in try store.viewAsKeptAndRebuilt() }
        if asKept != rebuilt {
            let diff = Set(asKept).symmetricDifference(rebuilt).sorted().prefix(20)
            Issue.record("\(d.name)'s view differs from one built again, \(context):\n\(diff.joined(separator: "\n"))")
        }
    }
    devices[2].fs.keepCacheLimit()
    if let here = devices[2].fs.contentTotals()?.here, here > 3_000 {
        let files = devices[2].fs.withMetaLock { (_, store) -> [String] in
            (try? store.db.rows("SELECT id, size, allocated, absent, keep, used, head FROM inodes WHERE kind = 1", []) { r in
                let chunks: [String] = ((try? store.chunkList(row: r.int(6))).map { $0.chunks.map { "\($0.id.hex.prefix(6)):\($0.size):\(store.chunks.isLocal($0.id))" } }) ?? []
                return "\(store.path(of: r.inode(0)) ?? "?") \(r.int(0)) size \(r.int(1)) allocated \(r.int(2)) absent \(r.int(3)) keep \(r.int(4)) used \(r.int(5)) \(chunks)"
            }) ?? []
        }
        Issue.record("dev2 keeps \(here) bytes of contents, more than its cache limit of 3,000, \(context)\n\(files.joined(separator: "\n"))\ntrace:\n\(trace.suffix(30).joined(separator: "\n"))")
    }
    if try devices[2].tree() != first { Issue.record("dev2's tree changed when the cache limit evicted, \(context)") }
    // Every version committed anywhere is a record everywhere, with a history to show it.
    var committed: Set<String> = []
    for d in devices {
        try d.fs.withMetaLock { (_, store) throws(StoreError) in
            for id in try store.db.rows("SELECT id FROM \(Store.versionsWithDevices) WHERE device_id = ? AND tombstone = 0 AND local = 0 AND kind = 1 AND meta = 0",
                                          [.device(store.deviceID)], { $0.versionID(0).hex }) where !pruned.contains(id) { committed.insert(id) }
        }
        let fsck = try d.fs.withMetaLock { (_, store) throws(StoreError) in try Fsck.run(store: store) }
        if !fsck.problems.isEmpty {
            Issue.record("\(d.name)'s store is damaged, \(context): \(fsck.problems.prefix(5))\ntrace:\n\(trace.suffix(40).joined(separator: "\n"))")
        }
    }
    for d in devices {
        let missing = try d.fs.withMetaLock { (_, store) throws(StoreError) -> [String] in
            var missing: [String] = []
            for id in committed {
                guard let node = try store.replica.record(id: VersionID(hex: id) ?? .zero)?.node else { missing.append(id); continue }
                // A device that pruned may have dropped the copy of a version that shows
                // only through another history (the rename case below): the record stays.
                if prunedOn.contains(d.name) { continue }
                // A temp file saved once and renamed over a file has no history of its own
                // (by design): its content is the target's next version.
                if try store.db.rows("""
                    SELECT count(*) FROM versions v JOIN histories h ON v.file_id = h.file_id
                    WHERE v.file_id = ? OR v.chunks = (SELECT chunks FROM versions WHERE id = ?)
                    """, [.node(node), .id(VersionID(hex: id) ?? .zero)], { $0.int(0) }).first == 0 {
                    missing.append(id)
                }
            }
            return missing
        }
        if !missing.isEmpty {
            let detail = devices.map { x in
                x.fs.withMetaLock { m, store in
                    missing.map { id in
                        let r = try? store.replica.record(id: VersionID(hex: id) ?? .zero)
                        let h = (try? store.db.rows("SELECT path, live FROM histories WHERE file_id = ?", [r.map { .node($0.node) } ?? .null]) { "\($0.text(0)) live=\($0.int(1))" }) ?? []
                        let rows = (try? store.db.rows("SELECT id, parents, tombstone, meta, uploaded, device_name FROM \(Store.versionsWithDevices) WHERE file_id = ? ORDER BY row", [r.map { .node($0.node) } ?? .null]) {
                            "\($0.versionID(0).hex.prefix(6)) p=\($0.versionIDs(1).map { $0.hex.prefix(6) }) t=\($0.int(2)) m=\($0.int(3)) up=\($0.int(4)) \($0.text(5))"
                        }) ?? []
                        return "\(x.name): \(id) node=\(r.map { $0.node.description } ?? "-") path=\(r?.path ?? "-") dev=\(r?.device.hex ?? "-") history=\(h)\n    " + rows.joined(separator: "\n    ")
                    }.joined(separator: "\n")
                }
            }
            Issue.record("\(d.name) cannot reach \(missing.count) committed versions, \(context)\n\(detail.joined(separator: "\n"))\ntrace:\n\(trace.suffix(40).joined(separator: "\n"))")
        }
    }
}

/// Discards or takes one conflict version through the `.conflicts/` view, as `rm`/`mv` do.
func resolveSomeConflict(_ d: SimDevice, _ rng: inout SplitMix64) throws {
    let paths = try d.fs.withMetaLock { (_, store) throws(StoreError) in try store.conflictedPaths() }
    guard !paths.isEmpty else { return }
    let path = paths[Int(rng.next() % UInt64(paths.count))]
    var ino = try d.fs.lookup(parent: Store.rootInode, name: ".conflicts").ino
    for component in path.split(separator: "/") { ino = try d.fs.lookup(parent: ino, name: String(component)).ino }
    let h = try d.fs.opendir(ino)
    let versions = try d.fs.readdir(h).map(\.name).filter { $0 != "." && $0 != ".." }
    d.fs.releasedir(h)
    guard let name = versions.first else { return }
    if rng.next() % 2 == 0 {
        try d.fs.unlink(parent: ino, name: name)
    } else {
        let (dir, file) = splitPath(path)!
        guard let parent = try d.directory(dir, create: false) else { return }
        try? d.fs.rename(parent: ino, name: name, newParent: parent, newName: file, flags: 0)
    }
}

extension Store {
    /// The synced view's tables and `history_dirs` as kept, and as built again from the
    /// records and `histories` (in a transaction then rolled back).
    func viewAsKeptAndRebuilt() throws(StoreError) -> (kept: [String], rebuilt: [String]) {
        func dump() throws(StoreError) -> [String] {
            var rows: [String] = []
            rows += try db.rows("SELECT node, row FROM view_heads ORDER BY node, row", []) { "head \($0.text(0)) \($0.int(1))" }
            rows += try db.rows("SELECT node, row, path FROM view_current ORDER BY node", []) { "current \($0.text(0)) \($0.int(1)) \($0.text(2))" }
            rows += try db.rows("SELECT path, parent, nodes, below FROM view_paths ORDER BY path", []) {
                "path \($0.text(0)) in \($0.text(1)): \($0.int(2)) nodes, \($0.int(3)) below"
            }
            rows += try db.rows("SELECT path, count FROM view_conflicts ORDER BY path", []) { "conflicts \($0.text(0)) \($0.int(1))" }
            rows.append("conflicts in all \(try replica.totalConflicts())")
            rows += try db.rows("SELECT parent, name, leaves, total FROM history_dirs ORDER BY parent, name", []) {
                "history dir \($0.text(0))/\($0.text(1)): \($0.int(2)) leaves, \($0.int(3)) in all"
            }
            return rows
        }
        let kept = try dump()
        var rebuilt: [String] = []
        _ = try? db.transaction { () throws(StoreError) in
            for table in ["view_heads", "view_awaited", "view_current", "view_paths", "view_conflicts", "history_dirs"] {
                try db.execute("DELETE FROM \(table)")
            }
            try db.execute("DELETE FROM settings WHERE key = 'conflicts'")
            try Replica.build(db, progress: false)
            try Store.buildHistoryDirectories(db)
            rebuilt = try dump()
            throw StoreError.database("rolled back on purpose")
        }
        return (kept, rebuilt)
    }
}
