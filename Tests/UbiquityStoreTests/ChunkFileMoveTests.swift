import Glibc
import Testing
import TestSupport
import UbiquitySystem
@testable import UbiquityStore

/// The chunk files of a store from before format 18 move into packs
/// (`ChunkStore.moveChunkFilesIntoPacks`): stopped and crashed at random points, with
/// gc's sweeps and claims between, every chunk stays readable from one place or the
/// other, and a run to the end leaves no file, no directory, and only damage in place.
@Suite struct ChunkFileMoveTests {
    @Test(arguments: [1, 2, 3] as [UInt64])
    func everyChunkStaysReadableThroughStopsAndCrashes(seed given: UInt64) throws {
        let seed = replayableSeed(given, variable: "UBQ_MOVE_SEED", test: "everyChunkStaysReadableThroughStopsAndCrashes",
                                  filter: "ChunkFileMoveTests")
        var rng = SplitMix64(seed: seed)
        var dir = TempDirectory()
        defer { dir.cleanup() }
        let chunksDir = { (d: TempDirectory) in d.path + "/chunks" }
        ChunkDamage.makeOldLayout(chunks: chunksDir(dir))
        // Chunk files as format 17 left them: big ones, small ones of format 4, a damaged
        // one and a temp file a crash left.
        var chunks: [ChunkID: [UInt8]] = [:]
        for i in 0..<400 {
            let bytes = rng.bytes(i % 5 == 0 ? 65 + rng.int(0..<1_900) : 2_049 + rng.int(0..<60_000))
            let id = ChunkID(hashing: bytes)
            chunks[id] = bytes
            Self.write(bytes, to: ChunkDamage.filePath(id, chunks: chunksDir(dir)))
        }
        let damaged = ChunkID(hashing: [1, 2, 3])
        Self.write([9, 9, 9], to: ChunkDamage.filePath(damaged, chunks: chunksDir(dir)))
        Self.write([0], to: chunksDir(dir) + "/ab/" + String(repeating: "c", count: 64) + ".tmp.1.2")
        let ids = chunks.keys.sorted { $0.hex < $1.hex }
        var store = try ChunkStore(directory: chunksDir(dir))
        var crashes = 0, stops = 0, swept = 0
        var finished = ChunkStore.ChunkFileMove()
        for run in 0..<40 {
            let context = "seed \(seed), run \(run)"
            // gc between runs: a sweep of some chunks; the ones it takes are gone for good.
            if rng.int(0..<3) == 0 {
                let asked = ids.filter { chunks[$0] != nil && rng.int(0..<20) == 0 }
                let freed = store.sweep(asked, unusedSince: nowNanos() + 1)
                for id in freed.keys { chunks[id] = nil }
                swept += freed.count
            }
            let stopAfter = rng.int(1..<120)
            let crash = rng.int(0..<2) == 0
            var asked = 0
            // Everything is flushed between runs (a stop flushes its batch; a crash's copy
            // was cut back to what was).
            var flushedPacks = LocalPacksModelTests.packSizes(chunksDir(dir) + "/packs")
            var copy: TempDirectory?
            finished = try store.moveChunkFilesIntoPacks(batchBytes: 1 + rng.int(0..<400_000), stop: {
                asked += 1
                guard asked == stopAfter else { return false }
                if crash {
                    // kill -9 and a power loss: the files as they are, packs cut back to
                    // what the last batch flushed.
                    let c = TempDirectory()
                    copyTree(dir.path, to: c.path)
                    for (name, size) in LocalPacksModelTests.packSizes(chunksDir(c) + "/packs") {
                        #expect(truncate(chunksDir(c) + "/packs/" + name, off_t(min(size, flushedPacks[name] ?? 0))) == 0)
                    }
                    copy = c
                }
                return true
            }, progress: { _ in flushedPacks = LocalPacksModelTests.packSizes(chunksDir(dir) + "/packs") })
            if let c = copy {
                store = try ChunkStore(directory: chunksDir(c))
                dir.cleanup()
                dir = c
                crashes += 1
            } else if asked >= stopAfter {
                stops += 1
            }
            for id in ids where chunks[id] != nil {
                #expect(try store.read(id) == chunks[id], "\(context): chunk \(id.hex) after \(crash ? "a crash" : "a stop")")
            }
            if finished.finished { break }
        }
        // To the end.
        finished = try store.moveChunkFilesIntoPacks()
        #expect(!finished.finished, "\(seed): the damaged file keeps the store looking for files")
        #expect(store.legacyFiles)
        #expect(throws: StoreError.corruptChunk(damaged)) { try store.read(damaged) }
        unlink(ChunkDamage.filePath(damaged, chunks: chunksDir(dir)))
        finished = try store.moveChunkFilesIntoPacks()
        #expect(finished.finished && !store.legacyFiles, "seed \(seed)")
        let left = (0..<256).filter { access(chunksDir(dir) + "/" + Hex.byte($0), F_OK) == 0 }
        #expect(left.isEmpty, "seed \(seed): chunk directories left: \(left)")
        for id in ids where chunks[id] != nil { #expect(try store.read(id) == chunks[id], "seed \(seed) at the end: chunk \(id.hex)") }
        let reopened = try ChunkStore(directory: chunksDir(dir))
        #expect(!reopened.legacyFiles)
        for id in ids where chunks[id] != nil { #expect(try reopened.read(id) == chunks[id], "seed \(seed) reopened: chunk \(id.hex)") }
        print("ChunkFileMoveTests seed \(seed): \(crashes) crashes, \(stops) stops, \(swept) swept, \(chunks.count) chunks left")
        #expect(crashes > 0 && stops > 0, "seed \(seed): the run must crash and stop")
    }

    /// A commit that claims a chunk file while the move takes it keeps the chunk: gc's
    /// sweep after the move does not free it, though the file was old.
    @Test func aClaimDuringTheMoveKeepsTheChunk() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        ChunkDamage.makeOldLayout(chunks: dir.path + "/chunks")
        var rng = SplitMix64(seed: 7)
        let bytes = rng.bytes(10_000)
        let id = ChunkID(hashing: bytes)
        Self.write(bytes, to: ChunkDamage.filePath(id, chunks: dir.path + "/chunks"))
        let store = try ChunkStore(directory: dir.path + "/chunks")
        try store.setLastUse(id, seconds: 1_000) // an old file
        var claimed = false
        try store.moveChunkFilesIntoPacks(stop: {
            if !claimed { claimed = store.contains(id) } // a commit reuses it
            return false
        })
        #expect(claimed)
        let cutoff = nowNanos() - 60_000_000_000
        #expect(store.sweep(id, unusedSince: cutoff) == nil, "claimed within the grace: kept")
        #expect(try store.read(id) == bytes)
    }

    /// A file goes only while its record is there: gc that removed the record between
    /// the move's put and its flush (a commit had claimed the file since, so gc kept the
    /// file) leaves the file, and the chunk readable from it.
    @Test func aRecordSweptBeforeItsFileGoesKeepsTheFile() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        ChunkDamage.makeOldLayout(chunks: dir.path + "/chunks")
        var rng = SplitMix64(seed: 9)
        // Two chunks in one directory, so that the move asks to stop between them.
        var pair: [[UInt8]] = []
        while pair.count < 2 {
            let bytes = rng.bytes(10_000)
            if pair.isEmpty || ChunkID(hashing: bytes).hex.prefix(2) == ChunkID(hashing: pair[0]).hex.prefix(2) { pair.append(bytes) }
        }
        for bytes in pair { Self.write(bytes, to: ChunkDamage.filePath(ChunkID(hashing: bytes), chunks: dir.path + "/chunks")) }
        let store = try ChunkStore(directory: dir.path + "/chunks")
        var asked = 0, swept: ChunkID?
        let moved = try store.moveChunkFilesIntoPacks(stop: {
            asked += 1
            // Before the second file of the directory: the first is a record, not flushed.
            if swept == nil, let first = pair.map({ ChunkID(hashing: $0) }).first(where: { store.packs.contains($0) }) {
                var held = GraceHeld()
                #expect(store.packs.sweep([first], unusedSince: nowNanos() + 1, held: &held).count == 1)
                swept = first
            }
            return false
        })
        let first = try #require(swept)
        #expect(access(ChunkDamage.filePath(first, chunks: dir.path + "/chunks"), F_OK) == 0, "the file of the swept record went")
        #expect(try store.read(first) == pair.first { ChunkID(hashing: $0) == first })
        #expect(!moved.finished && moved.files == 1)
    }

    static func write(_ bytes: [UInt8], to path: String) {
        let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0o444)
        _ = bytes.withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) }
        close(fd)
    }
}
