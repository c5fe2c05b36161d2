import Glibc
import Synchronization
import Testing
import TestSupport
import UbiquitySystem
@testable import UbiquityStore

/// The group commit's fold written outside the store's lock (Store+BackgroundFold): a
/// folder thread takes parts of the overlay while tree changes come in under the lock.
@Suite struct BackgroundFoldTests {
    /// The group commit's loop of a mount: parts folded as fast as they come, each step's
    /// pause random, until told to stop.
    final class Folder: @unchecked Sendable {
        private let stopping = Atomic<Bool>(false)
        let failures = Atomic<Int>(0)
        private var thread: JoinableThread?

        init(_ shared: SharedStore, seed: UInt64) {
            thread = JoinableThread { [self] in
                var rng = SplitMix64(seed: seed)
                while !stopping.load(ordering: .relaxed) {
                    do { _ = try shared.groupCommit(lastRequest: 0) } catch { failures.add(1, ordering: .relaxed) }
                    usleep(UInt32(rng.int(0..<2_000)))
                }
            }
        }

        func stop() {
            stopping.store(true, ordering: .relaxed)
            thread?.join()
            thread = nil
        }
    }

    /// The model test of the overlay (`TreeOverlayModelTests`) with a folder thread: random
    /// tree changes, saves, editor saves, links and xattrs under the lock (some in a
    /// transaction, as sync makes them), folds of parts written meanwhile, barriers,
    /// rollbacks, and kill -9 at random points (the files copied as they are, sometimes
    /// while a part is being written). The tree equals the model throughout and after
    /// every crash.
    @Test(arguments: [1, 2, 3, 4] as [UInt64])
    func agreesWithTheModelWhileAFolderWrites(seed given: UInt64) throws {
        let seed = replayableSeed(given, variable: "UBQ_FOLDER_SEED", test: "agreesWithTheModelWhileAFolderWrites",
                                  filter: "BackgroundFoldTests")
        var rng = SplitMix64(seed: seed)
        var dir = TempDirectory()
        defer { dir.cleanup() }
        let historyNames = HistoryNames(budget: seed % 2 == 0 ? 24 : 131_072)
        func open(_ path: String) throws -> (SharedStore, Folder) {
            let store = try Store(directory: path, deviceName: "model")
            store.startBatching()
            store.historyNames = historyNames
            store.foldPolicy.quiet = 0
            store.foldPolicy.part = 1 + Int(seed % 7)
            let shared = SharedStore(store)
            return (shared, Folder(shared, seed: seed &+ 1_000))
        }
        var (shared, folder) = try open(dir.path)
        var model = TreeOverlayModelTests.Model()
        var crashes = 0, replayed = 0, folds = 0, aside = 0
        for round in 0..<500 {
            let context = "seed \(seed), round \(round)"
            try shared.withNamespaceLock { (store) throws in try TreeOverlayModelTests.step(store, &model, &rng) }
            switch rng.int(0..<40) {
            case 0: try shared.withNamespaceLock { (store) throws(StoreError) in try store.commitBatch() }
            case 1: try shared.withLock { (store) throws(StoreError) in try store.markDurable() }
            case 2:
                // A transaction that folds the overlay and fails: nothing is lost.
                shared.withNamespaceLock { (store) in
                    _ = try? store.db.transaction { () throws(StoreError) in
                        _ = try store.db.rows("SELECT count(*) FROM entries", []) { $0.int(0) }
                        throw StoreError.database("abandoned")
                    }
                }
            case 6, 7:
                // A part written whose bookkeeping is left to the lock's next holder, then a
                // sync step's transaction, as when one takes the lock between the folder's
                // write and its last step.
                let lender = shared
                let helper = JoinableThread {
                    guard case .fold(let part)? = lender.withLock({ (store) in try? store.beginFold() }) else { return }
                    part.write()
                }
                helper.join()
                fallthrough
            case 5:
                // A change in a transaction of its own, as a sync step makes one: straight to
                // SQLite, past whatever rows a part the folder wrote left in the overlay.
                try shared.withLock { (store) throws in
                    var failure: (any Error)?
                    try store.standaloneStep { () throws(StoreError) in
                        do { try TreeOverlayModelTests.step(store, &model, &rng) } catch { failure = error }
                    }
                    if let failure { throw failure }
                }
            case 3, 4:
                // kill -9, half the time without the lock: the folder may be writing.
                let copy = TempDirectory()
                if rng.int(0..<2) == 0 {
                    copyTree(dir.path, to: copy.path)
                } else {
                    shared.withNamespaceLock { _ in copyTree(dir.path, to: copy.path) }
                }
                unlink(copy.path + "/lock")
                folder.stop()
                shared.withLock { (store) in
                    folds += store.foldsBegun
                    aside += store.db.reader?.statements ?? 0
                }
                #expect(folder.failures.load(ordering: .relaxed) == 0, "\(context): a fold failed")
                (shared, folder) = try open(copy.path)
                dir.cleanup()
                dir = copy
                crashes += 1
                shared.withLock { (store) in
                    replayed += store.replayedTreeChanges
                    TreeOverlayModelTests.check(store, model, context + " after a crash")
                }
            default: break
            }
            if round % 25 == 0 { shared.withNamespaceLock { (store) in TreeOverlayModelTests.check(store, model, context) } }
        }
        folder.stop()
        #expect(folder.failures.load(ordering: .relaxed) == 0, "seed \(seed): a fold failed")
        try shared.withLock { (store) throws in
            folds += store.foldsBegun
            aside += store.db.reader?.statements ?? 0
            TreeOverlayModelTests.check(store, model, "seed \(seed) at the end")
            try store.commitBatch()
            #expect(store.overlay.isEmpty)
            for (id, count) in model.versions {
                let fileID = try #require(store.inode(id)?.fileID)
                #expect(try store.versions(of: fileID).count == count, "seed \(seed): file \(id)'s versions")
            }
            let tombstones = try store.db.rows("SELECT count(*) FROM versions WHERE tombstone = 1", []) { Int($0.int(0)) }.first
            #expect(tombstones == model.tombstones, "seed \(seed): tombstones")
        }
        print("BackgroundFoldTests seed \(seed): \(crashes) crashes, \(replayed) changes replayed, \(folds) parts folded by the folder, \(aside) reads on the second connection, \(model.nodes.count) inodes")
        #expect(crashes > 0 && folds > 0, "seed \(seed): the run must crash and fold")
    }

    /// The folder writes a part with the index and the part alone: here its store is gone
    /// before the part is written (its last reference dropped, its own fold at the end
    /// failed on purpose, so it wrote nothing), and the part still commits its rows, a
    /// save's version and history, and its mark, which the next open replays nothing
    /// after. A folder that reached the store (through a weak reference) failed here.
    @Test func aPartIsWrittenWithoutItsStore() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        do {
            let part: Store.FoldPart
            weak var gone: Store?
            do {
                let store = try Store(directory: dir.path, deviceName: "folder")
                store.startBatching()
                store.foldPolicy.quiet = 0
                let d = try store.create(parent: Store.rootInode, name: "d", kind: .directory, mode: 0o755, uid: 1, gid: 1)
                let f = try store.create(parent: d.id, name: "f", kind: .file, mode: 0o644, uid: 1, gid: 1)
                try IntentLogTests.save(store, f.id, "d/f", Array("bytes".utf8))
                try store.setXattr(f.id, "user.x", [1])
                guard case .fold(let taken) = try store.beginFold() else { throw StoreError.io(errno: EIO, "no part to fold") }
                #expect(taken.isLast)
                part = taken
                // The store's last commit folds through the gate on this thread, which
                // holds the index: its first statement fails, so it writes nothing.
                store.db.failingStatements = [store.db.statements + 1]
                gone = store
            }
            #expect(gone == nil, "the store is gone")
            part.write()
            #expect(part.index.foldOutcome?.number == part.number)
            #expect(part.index.foldOutcome?.error == nil)
        }
        let store = try Store(directory: dir.path, deviceName: "folder")
        #expect(store.replayedTreeChanges == 0, "the part's mark covers the log")
        let d = try #require(store.child(Store.rootInode, "d"))
        let f = try #require(store.child(d, "f"))
        #expect(try store.xattr(f, "user.x") == [1])
        let fileID = try #require(store.inode(f)?.fileID)
        #expect(try store.versions(of: fileID).count == 1)
        #expect(try store.histories(at: "d/f") == [fileID])
    }

    /// A burst that has not paused waits, and the group commit says so: not `.more`, which
    /// its loop takes for a part to fold at once. The same through a mount's three steps.
    @Test func aBurstThatGoesOnWaits() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let store = try Store(directory: dir.path, deviceName: "folder")
        store.startBatching()
        _ = try store.create(parent: Store.rootInode, name: "a", kind: .file, mode: 0o644, uid: 1, gid: 1)
        store.logTreeChanges()
        #expect(try store.groupCommit(lastRequest: monotonicNanos()) == .waiting)
        let shared = SharedStore(store)
        _ = try shared.withLock { (store) throws(StoreError) in
            try store.create(parent: Store.rootInode, name: "b", kind: .file, mode: 0o644, uid: 1, gid: 1)
        }
        #expect(try shared.groupCommit(lastRequest: monotonicNanos()) == .waiting)
        shared.withLock { $0.foldPolicy.quiet = 0 }
        #expect(try shared.groupCommit(lastRequest: 0) == .done)
        #expect(shared.withLock { $0.overlay.isEmpty })
    }

    /// A mounted store's way of committing (batches, the operation log), with bursts
    /// folded as soon as they are asked to be, and its shared store.
    static func folding(_ path: String) throws -> (Store, SharedStore) {
        let store = try Store(directory: path, deviceName: "folder")
        store.startBatching()
        store.foldPolicy.quiet = 0
        return (store, SharedStore(store))
    }

    /// A directory `burst` and `files` files made in it, a request each.
    static func burst(_ shared: SharedStore, files: Int) throws(StoreError) -> Inode {
        let burst = try shared.withLock { (store) throws(StoreError) in
            try store.create(parent: Store.rootInode, name: "burst", kind: .directory, mode: 0o755, uid: 1, gid: 1)
        }
        for f in 0..<files {
            _ = try shared.withLock { (store) throws(StoreError) in
                try store.create(parent: burst.id, name: "b\(f)", kind: .file, mode: 0o644, uid: 1, gid: 1)
            }
        }
        return burst
    }

    /// Work about to go through the gate under the lock (a barrier, a sync cycle) folds
    /// ahead first, with off-lock parts, even while the burst goes on: what is left for
    /// its fold under the lock is at most `Store.foldAheadLeaves` changes.
    @Test func foldAheadLeavesLittleForTheGate() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let store = try Store(directory: dir.path, deviceName: "folder")
        store.startBatching()
        let shared = SharedStore(store)
        let burst = try Self.burst(shared, files: 3_000)
        #expect(try shared.groupCommit(lastRequest: monotonicNanos()) == .waiting)
        let before = shared.withLock { $0.overlay.unfolded.count }
        try shared.foldAhead()
        let (left, parts) = shared.withLock { ($0.overlay.unfolded.count, $0.foldsBegun) }
        #expect(before > Store.foldAheadLeaves && left <= Store.foldAheadLeaves && parts > 0,
                "\(before) changes waited, \(left) left after \(parts) parts")
        // Nothing to do: no part, no commit.
        try shared.foldAhead()
        #expect(shared.withLock { $0.foldsBegun } == parts)
        #expect(shared.withLock { $0.entries(burst.id).count } == 3_000)
    }

    /// While the folder holds the index, requests on the namespace (create, lookup,
    /// listing, getattr, setattr, rename, link, unlink, xattrs) neither wait for it nor
    /// run a statement on it: they change the overlay, and read what it lacks from the
    /// second connection.
    @Test func requestsGoOnWhileAPartIsWritten() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        do {
            // A tree in SQLite, so that the requests below read some of it.
            let store = try Store(directory: dir.path, deviceName: "folder")
            for d in 0..<4 {
                let parent = try store.create(parent: Store.rootInode, name: "d\(d)", kind: .directory, mode: 0o755, uid: 1, gid: 1)
                for f in 0..<20 { _ = try store.create(parent: parent.id, name: "f\(f)", kind: .file, mode: 0o644, uid: 1, gid: 1) }
            }
        }
        let (_, shared) = try Self.folding(dir.path)
        // A burst for the folder to write.
        let burst = try Self.burst(shared, files: 200)
        let lent = Atomic<Bool>(false), requestsDone = Atomic<Bool>(false)
        let folder = JoinableThread {
            let start = shared.withLock { (store) in try? store.beginFold() }
            guard case .fold(let part) = start else { return }
            lent.store(true, ordering: .releasing)
            // Holds the connection until the requests are done (a bound, not a timing:
            // a request that waited would keep them from being done).
            for _ in 0..<10_000 where !requestsDone.load(ordering: .acquiring) { usleep(1_000) }
            part.write()
            _ = try? shared.withLock { (store) throws(StoreError) in try store.finishFold(part) }
        }
        while !lent.load(ordering: .acquiring) { usleep(100) }
        let (waits, statements, asideBefore) = shared.withNamespaceLock { (store) in
            (store.db.loanWaits, store.db.statements, store.db.reader?.statements ?? 0)
        }
        try shared.withNamespaceLock { (store) throws in
            let d1 = try #require(store.child(Store.rootInode, "d1"))
            #expect(store.entries(d1).count == 20)
            let f3 = try #require(store.child(d1, "f3"))
            var inode = try #require(store.inode(f3))
            inode.mode = 0o600
            try store.update(inode)
            _ = try store.create(parent: d1, name: "new", kind: .file, mode: 0o644, uid: 1, gid: 1)
            try store.moveEntry(from: d1, "f4", to: burst.id, "moved")
            try store.link(f3, parent: burst.id, name: "linked")
            _ = try store.removeEntry(parent: d1, name: "f5")
            try store.setXattr(f3, "user.x", [1, 2])
            #expect(store.child(burst.id, "b7") != nil)
            #expect(store.entries(burst.id).count == 202)
        }
        let (waitsAfter, statementsAfter, asideAfter) = shared.withNamespaceLock { (store) in
            (store.db.loanWaits, store.db.statements, store.db.reader?.statements ?? 0)
        }
        requestsDone.store(true, ordering: .releasing)
        folder.join()
        #expect(waitsAfter == waits, "a request waited for the folder")
        #expect(statementsAfter == statements, "a request ran a statement on the folder's connection")
        #expect(asideAfter > asideBefore, "the reads of what the overlay lacks went to the second connection")
        try shared.withLock { (store) throws in
            try store.commitBatch()
            #expect(store.overlay.isEmpty)
            let d1 = try #require(store.child(Store.rootInode, "d1"))
            #expect(store.entries(d1).map(\.name).sorted() == (0..<20).filter { $0 != 4 && $0 != 5 }.map { "f\($0)" }.sorted() + ["new"])
            #expect(store.entries(burst.id).count == 202)
            #expect(try store.xattr(try #require(store.child(d1, "f3")), "user.x") == [1, 2])
        }
    }

    /// A part that was all the overlay held, settled by a claim in the middle of a hold,
    /// leaves its rows in the overlay; a transaction after it writes SQLite past them, as
    /// a sync step does when it shows another device's version. Reads then see that
    /// write, not the part's rows (t-sync-garbage's flow stalled: the peer's version
    /// taken in and shown, the old one still read, until the next local change).
    @Test func rowsOfAFoldedPartDoNotShadowALaterTransaction() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let (_, shared) = try Self.folding(dir.path)
        let file = try shared.withLock { (store) throws(StoreError) in
            try store.create(parent: Store.rootInode, name: "f", kind: .file, mode: 0o644, uid: 1, gid: 1)
        }
        // The folder writes the whole overlay; the lock's next holder settles the part.
        let wrote = Atomic<Bool>(false)
        let folder = JoinableThread {
            guard case .fold(let part)? = shared.withLock({ (store) in try? store.beginFold() }) else { return }
            part.write()
            wrote.store(true, ordering: .releasing)
        }
        folder.join()
        let tookPart = wrote.load(ordering: .acquiring)
        #expect(tookPart, "the folder took a part")
        try shared.withLock { (store) throws(StoreError) in
            try store.db.transaction { () throws(StoreError) in
                guard var inode = store.inode(file.id) else { throw .database("inode \(file.id) is gone") }
                inode.mode = 0o600
                try store.update(inode)
            }
        }
        shared.withLock { (store) in #expect(store.inode(file.id)?.mode == 0o600, "the transaction's write is read back") }
        try shared.withLock { (store) throws(StoreError) in try store.commitBatch() }
        shared.withLock { (store) in #expect(store.inode(file.id)?.mode == 0o600, "and after the next commit") }
    }

    /// A shared store holding `d/saved`, saved and committed but not yet durable; and `d`.
    static func storeWithASave(_ path: String) throws -> (SharedStore, InodeNumber) {
        let store = try Store(directory: path, deviceName: "barrier")
        store.startBatching()
        let shared = SharedStore(store)
        let d = try shared.withLock { (store) throws in
            let d = try store.create(parent: Store.rootInode, name: "d", kind: .directory, mode: 0o755, uid: 1, gid: 1)
            let saved = try store.create(parent: d.id, name: "saved", kind: .file, mode: 0o644, uid: 1, gid: 1)
            try IntentLogTests.save(store, saved.id, "d/saved", Array("bytes".utf8))
            try store.commitBatch()
            return d
        }
        return (shared, d.id)
    }

    /// A durability barrier on a thread of its own: it holds the index from its first step
    /// (returned once it does) through `holding`, then commits and finishes.
    static func barrier(_ shared: SharedStore, holding: @escaping @Sendable () -> Void) -> JoinableThread {
        let lent = Atomic<Bool>(false)
        let thread = JoinableThread {
            guard let (store, commit) = try? shared.withLock({ (store) throws(StoreError) in (store, try store.beginBarrier(upTo: nil)) }) else {
                lent.store(true, ordering: .releasing)
                return
            }
            lent.store(true, ordering: .releasing)
            holding()
            do { try store.index.writeBarrier(commit) } catch { return }
            shared.withLock { $0.finishBarrier(commit) }
        }
        while !lent.load(ordering: .acquiring) { usleep(100) }
        return thread
    }

    /// A durability barrier's flush of the index (a transaction with synchronous=FULL)
    /// runs without the store's lock: requests on the namespace go on meanwhile, without
    /// a wait or a statement on its connection, and the barrier still marks the versions.
    @Test func requestsGoOnWhileABarrierFlushes() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let (shared, d) = try Self.storeWithASave(dir.path)
        #expect(try shared.withLock { (store) throws(StoreError) in try store.hasUndurableVersions() })
        let requestsDone = Atomic<Bool>(false)
        let barrier = Self.barrier(shared) {
            for _ in 0..<10_000 where !requestsDone.load(ordering: .acquiring) { usleep(1_000) }
        }
        let (waits, statements) = shared.withNamespaceLock { ($0.db.loanWaits, $0.db.statements) }
        try shared.withNamespaceLock { (store) throws in
            _ = try store.create(parent: d, name: "during", kind: .file, mode: 0o644, uid: 1, gid: 1)
            #expect(store.child(d, "saved") != nil)
            #expect(store.entries(d).count == 2)
        }
        let (waitsAfter, statementsAfter) = shared.withNamespaceLock { ($0.db.loanWaits, $0.db.statements) }
        requestsDone.store(true, ordering: .releasing)
        barrier.join()
        #expect(waitsAfter == waits, "a request waited for the barrier's flush")
        #expect(statementsAfter == statements, "a request ran a statement on the barrier's connection")
        #expect(try shared.withLock { (store) throws(StoreError) in try store.hasUndurableVersions() } == false)
        #expect(shared.withLock { $0.entries(d).count } == 2)
    }

    /// A request that folds the overlay itself (a commit through the gate) while a
    /// barrier's commit holds the index waits for the index: its fold writes with the
    /// serving connection, never through the read-only one that reads around the gate
    /// (which failed with "attempt to write a readonly database", an EIO to the caller).
    @Test func aFoldThroughTheGateWaitsForABarriersCommit() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let (shared, d) = try Self.storeWithASave(dir.path)
        let barrier = Self.barrier(shared) { usleep(200_000) } // the request below comes while the index is held
        try shared.withNamespaceLock { (store) throws in
            _ = try store.create(parent: d, name: "during", kind: .file, mode: 0o644, uid: 1, gid: 1)
            #expect(store.db.isLentElsewhere, "the request came while the barrier held the index")
            try store.commitBatch()
        }
        barrier.join()
        #expect(shared.withLock { $0.entries(d).map(\.name).sorted() } == ["during", "saved"])
        shared.withLock { #expect($0.overlay.isEmpty, "the request's fold was written") }
    }

    /// Work that needs the connection and was waiting for the store's lock while the
    /// folder was lent the index waits for the index with the store's lock let go:
    /// requests go on, and its body runs once the part is written.
    @Test func aHolderThatFindsTheIndexLentLetsTheLockGo() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let (_, shared) = try Self.folding(dir.path)
        let burst = try Self.burst(shared, files: 50)
        let ranLent = Atomic<Int>(-1)
        var background: JoinableThread?
        let part = try shared.withNamespaceLock { (store) throws -> Store.FoldPart in
            background = JoinableThread {
                shared.withLock { store in ranLent.store(store.db.isLentElsewhere ? 1 : 0, ordering: .relaxed) }
            }
            while !shared.hasWaiters { usleep(100) }
            guard case .fold(let part) = try store.beginFold() else { throw StoreError.io(errno: EIO, "no part to fold") }
            return part
        }
        // The background thread took the lock, found the index lent, and let go.
        for _ in 0..<10_000 where shared.waitingForIndex == 0 { usleep(1_000) }
        #expect(shared.waitingForIndex == 1)
        // A request meanwhile, from a thread of its own (this one holds the index).
        let listed = Atomic<Int>(-1)
        JoinableThread { listed.store(shared.withNamespaceLock { $0.entries(burst.id).count }, ordering: .relaxed) }.join()
        #expect(listed.load(ordering: .relaxed) == 50)
        #expect(ranLent.load(ordering: .relaxed) == -1, "it ran while the index was lent")
        part.write()
        _ = try shared.withLock { (store) throws(StoreError) in try store.finishFold(part) }
        background?.join()
        #expect(ranLent.load(ordering: .relaxed) == 0)
    }

    /// A holder asleep waiting for the index is woken by the first hold of the store's
    /// lock that ends with the index back, whoever's it is (here a request's, before the
    /// folder's own bookkeeping), and settles the part itself as it uses the connection.
    @Test func anyHoldAfterThePartWakesAHolderWaitingForTheIndex() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let (_, shared) = try Self.folding(dir.path)
        let burst = try Self.burst(shared, files: 20)
        let start = try shared.withNamespaceLock { (store) throws(StoreError) in try store.beginFold() }
        guard case .fold(let part) = start else { throw StoreError.io(errno: EIO, "no part to fold") }
        let folded = Atomic<Int>(-1)
        let background = JoinableThread {
            shared.withLock { store in
                do { try store.commitBatch() } catch { return }
                folded.store(store.overlay.isEmpty && store.foldInFlight == nil ? 1 : 0, ordering: .relaxed)
            }
        }
        for _ in 0..<10_000 where shared.waitingForIndex == 0 { usleep(1_000) }
        #expect(shared.waitingForIndex == 1)
        part.write()
        shared.withNamespaceLock { _ in }
        background.join()
        #expect(folded.load(ordering: .relaxed) == 1)
        #expect(shared.withLock { $0.entries(burst.id).count } == 20)
    }

    /// Letting the index go wakes a holder waiting for it by itself: no hold of the
    /// store's lock has to come after (a lender that fails or returns early).
    @Test func lettingTheIndexGoWakesAHolderWaitingForIt() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let (_, shared) = try Self.folding(dir.path)
        _ = try Self.burst(shared, files: 20)
        let start = try shared.withNamespaceLock { (store) throws(StoreError) in try store.beginFold() }
        guard case .fold(let part) = start else { throw StoreError.io(errno: EIO, "no part to fold") }
        let ran = Atomic<Bool>(false)
        let background = JoinableThread { shared.withLock { _ in ran.store(true, ordering: .releasing) } }
        for _ in 0..<10_000 where shared.waitingForIndex == 0 { usleep(1_000) }
        #expect(shared.waitingForIndex == 1)
        part.write()
        for _ in 0..<5_000 where !ran.load(ordering: .acquiring) { usleep(1_000) }
        let woke = ran.load(ordering: .acquiring)
        #expect(woke, "the holder still slept 5 s after the index was let go")
        shared.withNamespaceLock { _ in } // whatever the outcome, nothing is left asleep
        background.join()
    }
}
