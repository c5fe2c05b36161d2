import Glibc
import Testing
import TestSupport
import UbiquitySystem
@testable import UbiquityStore

/// The intent log (store format 7): a save acknowledged while its metadata batch was still
/// open survives a kill of the process, recorded again at the next open.
@Suite struct IntentLogTests {
    static func save(_ store: Store, _ id: InodeNumber, _ path: String, _ bytes: [UInt8]) throws {
        let chunk = ChunkID(hashing: bytes)
        try store.chunks.put(chunk, bytes)
        var list = ChunkList()
        list.append(chunk, size: bytes.count)
        try store.commit(id, content: list, path: path, local: false)
    }

    /// An editor's save as the filesystem does it: the temp file renamed over the target,
    /// whose history it continues, and saved there.
    static func renameOver(_ store: Store, _ temp: InodeNumber, _ tempName: String, _ target: InodeNumber, _ name: String,
                           _ bytes: [UInt8]) throws {
        let before = try #require(store.inode(target))
        let tempHistory = try #require(store.inode(temp)?.fileID)
        _ = try store.removeEntry(parent: Store.rootInode, name: name)
        try store.adoptHistory(target, fileID: .new(), head: nil)
        try store.forget(target)
        try store.moveEntry(from: Store.rootInode, tempName, to: Store.rootInode, name)
        try store.endHistoryRenamedOver(tempHistory)
        try store.adoptHistory(temp, fileID: try #require(before.fileID), head: before.head)
        try save(store, temp, name, bytes)
    }

    static func file(_ store: Store, _ name: String) throws -> InodeNumber {
        try store.create(parent: Store.rootInode, name: name, kind: .file, mode: 0o644, uid: 0, gid: 0).id
    }

    static func inode(_ store: Store, _ path: String) -> InodeNumber? {
        var id = Store.rootInode
        for name in path.split(separator: "/") {
            guard let child = store.child(id, String(name)) else { return nil }
            id = child
        }
        return id
    }

    static func content(_ store: Store, _ path: String) throws -> [UInt8]? {
        guard let id = inode(store, path) else { return nil }
        return try store.openContent(id).read(offset: 0, count: 1 << 20)
    }

    static func versionCount(_ store: Store, _ path: String) throws -> Int {
        let fileID = try #require(inode(store, path).flatMap { store.inode($0)?.fileID })
        return try store.versions(of: fileID).count
    }

    /// What a kill -9 leaves: the files as they are on disk while the batch is open.
    static func killed(_ dir: TempDirectory) -> TempDirectory {
        let copy = TempDirectory()
        copyTree(dir.path, to: copy.path)
        unlink(copy.path + "/lock")
        return copy
    }

    @Test func savesInAnOpenBatchSurviveAKill() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let small = Array("twenty bytes of text".utf8), big = [UInt8](repeating: 7, count: 5000)
        let store = try Store(directory: dir.path, deviceName: "test")
        let old = try store.create(parent: Store.rootInode, name: "old", kind: .file, mode: 0o600, uid: 0, gid: 0).id
        try Self.save(store, old, "old", Array("first".utf8))
        store.startBatching()
        // In the batch: a directory, a file in it, a second version of an older file.
        let d = try store.create(parent: Store.rootInode, name: "d", kind: .directory, mode: 0o755, uid: 0, gid: 0).id
        let f = try store.create(parent: d, name: "f", kind: .file, mode: 0o640, uid: 0, gid: 0).id
        try Self.save(store, f, "d/f", small)
        try Self.save(store, old, "old", big)
        // A tiny content kept in its list (store format 14): the frame's list carries it.
        let t = try store.create(parent: d, name: "tiny", kind: .file, mode: 0o644, uid: 0, gid: 0).id
        try store.commit(t, content: try store.chunks.listOfOneChunk(Array("tiny".utf8)), path: "d/tiny", local: false)
        let copy = Self.killed(dir)
        defer { copy.cleanup() }

        let reopened = try Store(directory: copy.path)
        #expect(reopened.recoveredSaves.sorted() == ["d/f", "d/tiny", "old"])
        #expect(try Self.content(reopened, "d/tiny") == Array("tiny".utf8))
        #expect(try Self.content(reopened, "d/f") == small)
        #expect(try Self.content(reopened, "old") == big)
        #expect(Self.inode(reopened, "d").flatMap { reopened.inode($0)?.kind } == .directory)
        #expect(Self.inode(reopened, "d/f").flatMap { reopened.inode($0)?.mode } == 0o640)
        #expect(try Self.versionCount(reopened, "old") == 2, "the replayed save continues the file's history")
        // The log is empty now, and a second open replays nothing.
        #expect(try IntentLog.read(path: copy.path + "/intent.seg").isEmpty)
    }

    @Test func aCommittedBatchIsNotReplayed() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let store = try Store(directory: dir.path, deviceName: "test")
        store.startBatching()
        let f = try Self.file(store, "f")
        try Self.save(store, f, "f", Array("one".utf8))
        let log = try #require(try readFile(dir.path + "/intent.seg", limit: 1 << 20))
        try store.commitBatch()
        // A kill between the batch's commit and the log's truncation: the log still holds
        // the save, and the database says it is applied.
        let fd = open(dir.path + "/intent.seg", O_WRONLY | O_TRUNC)
        _ = log.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        close(fd)
        let copy = Self.killed(dir)
        defer { copy.cleanup() }
        let reopened = try Store(directory: copy.path)
        #expect(reopened.recoveredSaves.isEmpty)
        #expect(try Self.versionCount(reopened, "f") == 1)
    }

    /// A mounted store logs each change when its lock is let go: a save in the operation
    /// log whose chunk a power loss took is replayed, found damaged by the recovery and
    /// rolled back to the version before it; the file and its name stay.
    @Test func aLoggedSaveWhoseChunkIsLostIsRolledBack() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let store = try Store(directory: dir.path, deviceName: "test")
        store.startBatching()
        let f = try Self.file(store, "f")
        try Self.save(store, f, "f", Array("first".utf8))
        try store.commitBatch()
        try store.markDurable()
        let lost = [UInt8](repeating: 7, count: 5000)
        try Self.save(store, f, "f", lost)
        store.logTreeChanges() // what the shared store does before the reply
        #expect(store.treeLog!.nextSequence.value > 1)
        let copy = Self.killed(dir)
        defer { copy.cleanup() }
        try ChunkDamage.lose(ChunkID(hashing: lost), chunks: copy.path + "/chunks")
        try reboot(copy.path)
        let reopened = try Store(directory: copy.path)
        #expect(reopened.replayedTreeChanges > 0)
        #expect(reopened.recovery.rolledBack.count == 1, "\(reopened.recovery)")
        #expect(try Self.content(reopened, "f") == Array("first".utf8))
    }

    /// kill -9 after a small file's save and a rename: the save's chunk was in
    /// small.sqlite's open batch (lost), its bytes in the intent log, its record and the
    /// rename in the operation log. The chunk comes back before the recovery checks the
    /// save, so the file shows the save at its new name and the old name stays gone.
    @Test func aLoggedSaveOfASmallFileSurvivesAKillWithItsRename() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let store = try Store(directory: dir.path, deviceName: "test")
        store.startBatching()
        let f = try Self.file(store, "a")
        let bytes = [UInt8](repeating: 42, count: 1500)
        try store.commit(f, content: try store.chunks.listOfOneChunk(bytes), path: "a", local: false)
        store.logTreeChanges()
        try store.moveEntry(from: Store.rootInode, "a", to: Store.rootInode, "b")
        store.logTreeChanges()
        let copy = Self.killed(dir)
        defer { copy.cleanup() }
        let reopened = try Store(directory: copy.path)
        #expect(reopened.recovery.rolledBack.isEmpty, "\(reopened.recovery)")
        #expect(reopened.recoveredSaves.isEmpty)
        #expect(reopened.child(Store.rootInode, "a") == nil)
        #expect(try Self.content(reopened, "b") == bytes)
    }

    /// An editor's save, then a kill before the intents were noted as applied; the temp
    /// file's save is gone for good, and its intent is still in the log. The open must
    /// not record it again (a stray temp file came back):
    /// - withdrawn in the overlay, and that folded in a part of the overlay (the group
    ///   commit's): the withdrawal's frame is behind the log's mark;
    /// - (review finding) folded before the rename, so withdrawn in SQLite, and the batch
    ///   committed without the fold that notes the intents (a burst still waits).
    @Test(arguments: [false, true]) func anEditorsWithdrawnSaveIsNotRecordedAgain(foldedBeforeTheRename: Bool) throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let store = try Store(directory: dir.path, deviceName: "test")
        store.startBatching()
        let f = try Self.file(store, "f")
        try Self.save(store, f, "f", Array("first".utf8))
        try store.commitBatch()
        let temp = try Self.file(store, ".f.swp")
        try Self.save(store, temp, ".f.swp", Array("second".utf8))
        store.logTreeChanges()
        if foldedBeforeTheRename { try store.foldTree() }
        try Self.renameOver(store, temp, ".f.swp", f, "f", Array("second".utf8))
        store.logTreeChanges()
        _ = try Self.file(store, "later")
        store.logTreeChanges()
        if foldedBeforeTheRename {
            try store.commitBatchWithoutFold()
        } else {
            // A part: every frame but the last.
            let frames = store.overlay.frames
            #expect(frames.count == 3)
            try store.foldTree(alone: true, limit: frames[1].end - store.overlay.folded)
            #expect(!store.overlay.isEmpty, "the last frame is not folded")
        }
        let copy = Self.killed(dir)
        defer { copy.cleanup() }
        let reopened = try Store(directory: copy.path)
        #expect(reopened.recoveredSaves.isEmpty, "\(reopened.recoveredSaves)")
        #expect(reopened.child(Store.rootInode, ".f.swp") == nil)
        #expect(try Self.content(reopened, "f") == Array("second".utf8))
        #expect(reopened.child(Store.rootInode, "later") != nil)
    }

    /// A write that went straight to SQLite (a synced save over a local version, in a
    /// transaction) waits in the batch; a change logged after it commits the batch first,
    /// so a kill cannot keep the rename and lose the version the inode names.
    @Test func aLoggedChangeCommitsTheDirectWritesBeforeIt() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let store = try Store(directory: dir.path, deviceName: "test")
        store.startBatching()
        let f = try Self.file(store, "a")
        store.logTreeChanges()
        var local = ChunkList()
        local.appendInline(Array("local".utf8))
        _ = try store.commit(f, content: local, path: "a", local: true)
        store.logTreeChanges()
        #expect(!store.db.hasOpenBatch, "a local-only file's save goes to the overlay")
        try store.commitBatch()
        var synced = ChunkList()
        synced.appendInline(Array("synced".utf8))
        _ = try store.commit(f, content: synced, path: "a", local: false)
        #expect(store.db.hasOpenBatch)
        try store.moveEntry(from: Store.rootInode, "a", to: Store.rootInode, "b")
        store.logTreeChanges()
        #expect(!store.db.hasOpenBatch, "the batch was committed before the frame")
        let copy = Self.killed(dir)
        defer { copy.cleanup() }
        let reopened = try Store(directory: copy.path)
        #expect(try Self.content(reopened, "b") == Array("synced".utf8))
    }

    @Test func aTornFrameEndsTheLogAndMissingChunksAreSkipped() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let store = try Store(directory: dir.path, deviceName: "test")
        store.startBatching()
        let a = try Self.file(store, "a")
        let b = try Self.file(store, "b")
        let lost = [UInt8](repeating: 9, count: 5000)
        try Self.save(store, a, "a", Array("kept".utf8))
        try Self.save(store, b, "b", lost)
        let copy = Self.killed(dir)
        defer { copy.cleanup() }
        // A power loss took b's chunk file; the crash cut the log's last write short.
        try ChunkDamage.lose(ChunkID(hashing: lost), chunks: copy.path + "/chunks")
        let fd = open(copy.path + "/intent.seg", O_WRONLY | O_APPEND)
        _ = write(fd, [UInt8(200), 0, 0, 0, 1, 2], 6)
        close(fd)
        try reboot(copy.path)
        let reopened = try Store(directory: copy.path)
        #expect(reopened.recoveredSaves == ["a"])
        #expect(try Self.content(reopened, "a") == Array("kept".utf8))
        #expect(reopened.child(Store.rootInode, "b") == nil, "b's create was in the lost batch, its save lost its data")
    }

    /// fsync of a small file writes one frame with its bytes and fdatasyncs the log: a
    /// power loss that takes the database's unsynced WAL and the chunk file keeps the save.
    @Test func anFsyncedFrameSurvivesAPowerLoss() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let bytes = [UInt8](repeating: 3, count: 5000)
        let store = try Store(directory: dir.path, deviceName: "test")
        try store.checkpoint() // the schema is in the database file, not only in the WAL
        store.startBatching()
        let f = try Self.file(store, "f")
        try Self.save(store, f, "f", bytes)
        let fd = try #require(try store.logDurably(f))
        #expect(fdatasync(fd) == 0)
        close(fd)
        let copy = Self.killed(dir)
        defer { copy.cleanup() }
        // The power loss: the WAL and the chunk file never reached the disk.
        #expect(truncate(copy.path + "/meta.sqlite-wal", 0) == 0)
        try ChunkDamage.lose(ChunkID(hashing: bytes), chunks: copy.path + "/chunks")
        try reboot(copy.path)
        let reopened = try Store(directory: copy.path)
        #expect(reopened.recoveredSaves == ["f"])
        #expect(try Self.content(reopened, "f") == bytes)
        #expect(try Self.versionCount(reopened, "f") == 1)
    }

    /// Review finding: the batch that notes an fsynced save's intent as applied can reach
    /// the disk (a checkpoint fsyncs the WAL) before the save's chunk file does (only a
    /// barrier flushes it). A power loss then took the chunk, and the open skipped the
    /// applied frame that carries its bytes: the save was rolled back.
    @Test func anFsyncedSaveNotedAsAppliedKeepsItsBytesAfterAPowerLoss() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let bytes = [UInt8](repeating: 4, count: 5000)
        let store = try Store(directory: dir.path, deviceName: "test")
        store.startBatching()
        let f = try Self.file(store, "f")
        try Self.save(store, f, "f", bytes)
        let fd = try #require(try store.logDurably(f))
        #expect(fdatasync(fd) == 0)
        close(fd)
        try store.commitBatch()
        try store.checkpoint() // the batch noting the intent as applied is on the disk
        let copy = Self.killed(dir)
        defer { copy.cleanup() }
        try ChunkDamage.lose(ChunkID(hashing: bytes), chunks: copy.path + "/chunks")
        try reboot(copy.path)
        let reopened = try Store(directory: copy.path)
        #expect(reopened.recovery.rolledBack.isEmpty, "\(reopened.recovery)")
        #expect(try Self.content(reopened, "f") == bytes)
    }


    /// Review finding: a local-only file (a vim swap file) keeps only its newest version;
    /// a fold of a part deletes the one it replaces while that save's intent is not
    /// applied yet, and after a kill the open recorded the older content again, over the
    /// newer.
    @Test func aLocalVersionReplacedInAFoldedPartIsNotRecordedAgain() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let store = try Store(directory: dir.path, deviceName: "test")
        store.startBatching()
        let swap = try Self.file(store, ".f.swp")
        for text in ["older", "newer"] {
            var list = ChunkList()
            list.appendInline(Array(text.utf8))
            _ = try store.commit(swap, content: list, path: ".f.swp", local: true)
            store.logTreeChanges()
        }
        _ = try Self.file(store, "later")
        store.logTreeChanges()
        let frames = store.overlay.frames
        #expect(frames.count == 3)
        try store.foldTree(alone: true, limit: frames[1].end - store.overlay.folded)
        let copy = Self.killed(dir)
        defer { copy.cleanup() }
        let reopened = try Store(directory: copy.path)
        #expect(reopened.recoveredSaves.isEmpty, "\(reopened.recoveredSaves)")
        #expect(try Self.content(reopened, ".f.swp") == Array("newer".utf8))
    }

    /// A file over the frame limit, or with extended attributes, goes the barrier's way.
    @Test func bigFilesAndFilesWithXattrsAreLeftToTheBarrier() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let store = try Store(directory: dir.path, deviceName: "test")
        store.startBatching()
        let big = try Self.file(store, "big")
        var list = ChunkList()
        for i in 0..<5 {
            let chunk = [UInt8](repeating: UInt8(i), count: 256 << 10)
            try store.chunks.put(ChunkID(hashing: chunk), chunk)
            list.append(ChunkID(hashing: chunk), size: chunk.count)
        }
        try store.commit(big, content: list, path: "big", local: false)
        #expect(try store.logDurably(big) == nil)
        let tagged = try Self.file(store, "tagged")
        try Self.save(store, tagged, "tagged", Array("x".utf8))
        try store.setXattr(tagged, "user.tag", [1])
        #expect(try store.logDurably(tagged) == nil)
    }

    /// A barrier drops the frames it made durable and keeps those logged during its
    /// flush, so a log that saves never let go idle still shrinks.
    @Test func aBarrierKeepsOnlyTheFramesLoggedDuringItsFlush() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let store = try Store(directory: dir.path, deviceName: "test")
        store.startBatching()
        let a = try Self.file(store, "a"), b = try Self.file(store, "b")
        try Self.save(store, a, "a", Array("before the mark".utf8))
        let mark = try store.durabilityMark()
        try Self.save(store, b, "b", Array("during the flush".utf8))
        try store.syncFiles()
        try store.markDurable(upTo: mark)
        #expect(try IntentLog.read(path: dir.path + "/intent.seg").map(\.path) == ["b"])
        let next = try store.durabilityMark()
        try store.syncFiles()
        try store.markDurable(upTo: next)
        #expect(try IntentLog.read(path: dir.path + "/intent.seg").isEmpty)
        // A mark no barrier followed (the sync engine's, when nothing waits) leaves no
        // state behind: the next barrier still empties the log (it once kept it forever,
        // found by WorkTests).
        _ = try store.durabilityMark()
        try Self.save(store, b, "b", Array("later".utf8))
        let third = try store.durabilityMark()
        try store.syncFiles()
        try store.markDurable(upTo: third)
        #expect(try IntentLog.read(path: dir.path + "/intent.seg").isEmpty)
        // Appends go on in the replaced file.
        try Self.save(store, a, "a", Array("after".utf8))
        #expect(try IntentLog.read(path: dir.path + "/intent.seg").map(\.path) == ["a"])
    }

    /// Store format 19: an `intent.log` of formats 7 to 18 (SHA-256 checked frames) that a
    /// kill -9 left is converted at open and its saves recorded again, whether the log has
    /// a torn tail, and whether an earlier open was killed inside the conversion (before
    /// its rename: a temp file; after it: both logs).
    @Test(arguments: [1, 2, 3, UInt64.random(in: 4...UInt64.max)])
    func anIntentLogOfTheOlderFormatIsConvertedAtOpen(seed: UInt64) throws {
        print("IntentLogTests.anIntentLogOfTheOlderFormatIsConvertedAtOpen seed \(seed)")
        var rng = SplitMix64(seed: seed)
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let store = try Store(directory: dir.path, deviceName: "test")
        store.startBatching()
        var expected: [String: [UInt8]] = [:]
        for i in 0..<rng.int(1..<6) {
            let bytes = [UInt8](repeating: UInt8(i), count: rng.int(1..<5000))
            try Self.save(store, try Self.file(store, "f\(i)"), "f\(i)", bytes)
            expected["f\(i)"] = bytes
        }
        let copy = Self.killed(dir)
        defer { copy.cleanup() }
        // What an older version's kill -9 left: the same frames, checked the older way.
        let current = copy.path + "/intent.seg", older = copy.path + "/intent.log"
        var legacy: [UInt8] = []
        for intent in try IntentLog.read(path: current) {
            let payload = IntentLog.encode(intent)
            legacy += withUnsafeBytes(of: UInt32(payload.count).littleEndian) { Array($0) } + payload
            legacy += payload.withUnsafeBytes { FrameCheck.sha256.compute($0) }
        }
        let torn = rng.int(0..<2) == 0
        if torn { legacy += [UInt8](repeating: 0x5a, count: rng.int(1..<40)) }
        try writeFileAtomically(older, legacy, tempPrefix: ".t")
        let stage = rng.int(0..<3)
        switch stage {
        case 0: unlink(current)                                          // never converted
        case 1: unlink(current); try writeFileAtomically(current + ".tmp", [1, 2, 3], tempPrefix: ".t") // killed before the rename
        default: break                                                   // killed after the rename
        }
        let reopened = try Store(directory: copy.path)
        #expect(reopened.recoveredSaves.sorted() == expected.keys.sorted(), "seed \(seed), stage \(stage), torn \(torn)")
        for (path, bytes) in expected { #expect(try Self.content(reopened, path) == bytes, "seed \(seed): \(path)") }
        #expect(access(older, F_OK) != 0 && access(current + ".tmp", F_OK) != 0, "seed \(seed): the older log is gone")
    }

    /// The log as a model: frames appended (small, and some bigger than the zeros written
    /// ahead), emptied, cut by a barrier's mark, and reopened after a kill -9 at random
    /// points. A reader finds exactly the frames since the log was last emptied, in order:
    /// never an earlier round's frame that an emptied log's new frames did not overwrite
    /// (the same length as the one before it, so its frame is whole and checks).
    @Test(arguments: [1, 2, UInt64.random(in: 3...UInt64.max)])
    func aModelOfAppendsEmptyingsAndKills(seed: UInt64) throws {
        print("IntentLogTests.aModelOfAppendsEmptyingsAndKills seed \(seed)")
        var rng = SplitMix64(seed: seed)
        let dir = TempDirectory()
        defer { dir.cleanup() }
        var log = IntentLog(directory: dir.path)
        var model: [(intent: Intent, end: Int64)] = []
        var sequence: Int64 = 0
        var sameLength = false
        for step in 0..<600 {
            switch rng.int(0..<20) {
            case 0..<12:
                sequence += 1
                // Runs of frames of one length: after an emptying, a new frame then ends
                // exactly where an old one did.
                if rng.int(0..<4) == 0 { sameLength.toggle() }
                let size = sameLength ? 100 : (rng.int(0..<30) == 0 ? rng.int(200_000..<2_500_000) : rng.int(0..<3000))
                let bytes = [UInt8](repeating: UInt8(truncatingIfNeeded: sequence), count: size)
                let intent = Intent(sequence: sequence, version: .new(), path: "f\(sequence % 7)", mode: 0o644, uid: 0, gid: 0,
                                    mtime: sequence, content: ChunkList(), chunkBytes: size == 0 ? [:] : [ChunkID(hashing: bytes): bytes])
                try log.append(intent)
                model.append((intent, log.size))
            case 12..<14:
                log.clear()
                model = []
            case 14..<16:
                // A barrier's mark: the frames before it go, those after it stay.
                let k = rng.int(0..<(model.count + 1))
                let mark = k == 0 ? 0 : model[k - 1].end
                try log.dropPrefix(mark)
                model = model.dropFirst(k).map { ($0.intent, $0.end - mark) }
            default:
                // kill -9: what the process wrote is in the page cache; the next open reads it.
                let (found, end) = try IntentLog.frames(path: log.path)
                let same = found == model.map(\.intent)
                #expect(same, "seed \(seed), step \(step): \(found.map(\.sequence)) read, \(model.map(\.intent.sequence)) expected")
                #expect(end == (model.last?.end ?? 0), "seed \(seed), step \(step)")
                log = IntentLog(directory: dir.path)
                try log.keepExisting(wholeBytes: end)
            }
        }
        let last = try IntentLog.read(path: log.path) == model.map(\.intent)
        #expect(last, "seed \(seed): at the end")
    }

    /// An fsync's flush of the log writes data blocks only: frames go into zeros written
    /// ahead, so the file's size (which ext4 flushes with the inode) changes once per
    /// `growStep`, not at every frame. Counted: the sizes the file had over 300 saves.
    @Test func framesOverwriteZerosWrittenAhead() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let log = IntentLog(directory: dir.path)
        var sizes: Set<Int64> = []
        for n in 1...300 {
            let bytes = [UInt8](repeating: UInt8(n % 250), count: 4096)
            try log.append(Intent(sequence: Int64(n), version: .new(), path: "doc.txt", mode: 0o644, uid: 0, gid: 0, mtime: 0,
                                  content: ChunkList(), chunkBytes: [ChunkID(hashing: bytes): bytes]))
            var st = stat()
            #expect(stat(log.path, &st) == 0)
            sizes.insert(Int64(st.st_size))
        }
        print("IntentLogTests.framesOverwriteZerosWrittenAhead: \(sizes.count) file sizes over 300 frames of 4 KiB")
        #expect(sizes.count == 2, "file sizes: \(sizes.sorted())")
        #expect(try IntentLog.read(path: log.path).count == 300)
        // Emptied, the file stays written and the next frames go from its start.
        log.clear()
        #expect(try IntentLog.read(path: log.path).isEmpty)
        try log.append(Intent(sequence: 301, version: .new(), path: "doc.txt", mode: 0o644, uid: 0, gid: 0, mtime: 0,
                              content: ChunkList(), chunkBytes: [:]))
        var st = stat()
        #expect(stat(log.path, &st) == 0 && Int64(st.st_size) == IntentLog.growStep * 2)
        #expect(try IntentLog.read(path: log.path).map(\.sequence) == [301])
    }

    @Test func framesRoundTrip() throws {
        var list = ChunkList()
        list.append(ChunkID(hashing: [1, 2, 3]), size: 3)
        list.appendHole(1 << 40)
        list.appendInline([9, 8, 7])
        let intent = Intent(sequence: 42, version: VersionID(hex: "00112233445566778899aabbccddeeff")!, path: "dir/naïve name", mode: 0o4755,
                            uid: 1000, gid: 100, mtime: -5, content: list, chunkBytes: [ChunkID(hashing: [1, 2, 3]): [1, 2, 3]])
        #expect(IntentLog.decode(IntentLog.encode(intent)) == intent)
        #expect(IntentLog.decode(IntentLog.encode(intent))?.content.inline == [ChunkID(hashing: [9, 8, 7]): [9, 8, 7]])
        var damaged = IntentLog.encode(intent)
        damaged.removeLast()
        #expect(IntentLog.decode(damaged) == nil)
    }
}
