import Dispatch
import Glibc
import Synchronization
import Testing
import TestSupport
import UbiquitySystem
@testable import UbiquityStore

@Suite struct ChunkStoreTests {
    @Test func storesVerifiesAndRefusesCorruptChunks() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let store = try ChunkStore(directory: dir.path + "/chunks")
        var gen = SplitMix64(seed: 1)
        let bytes = gen.bytes(100_000)
        let id = ChunkID(hashing: bytes)
        try store.put(id, bytes)
        try store.put(id, bytes) // idempotent
        #expect(try store.read(id) == bytes)

        // Flip one byte on disk: the read must fail, never return the changed bytes.
        store.dropCache()
        try ChunkDamage.flip(id, chunks: dir.path + "/chunks", at: 500)
        #expect(throws: StoreError.corruptChunk(id)) { try store.read(id) }
        #expect(store.location(of: id).contains("/packs/00000001.pack, 100000 bytes at 64"), "\(store.location(of: id))")

        // A missing chunk is reported as missing.
        let other = ChunkID(hashing: gen.bytes(10))
        #expect(throws: StoreError.missingChunk(other)) { try store.read(other) }
    }

    /// A store from before format 18 keeps chunks as files: they stay readable (and damage
    /// in them is caught), a put of the same bytes claims the file instead of adding a
    /// record, gc collects it.
    @Test func chunkFilesOfAnOlderStoreStayReadable() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        ChunkDamage.makeOldLayout(chunks: dir.path + "/chunks")
        let store = try ChunkStore(directory: dir.path + "/chunks")
        var gen = SplitMix64(seed: 3)
        let bytes = gen.bytes(100_000)
        let id = ChunkID(hashing: bytes)
        let path = store.path(of: id)
        let fd = open(path, O_WRONLY | O_CREAT, 0o444)
        _ = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        close(fd)
        #expect(try store.read(id) == bytes)
        #expect(store.location(of: id) == path)
        try store.put(id, bytes)
        #expect(store.packs.count == 0, "no second copy as a record")
        #expect(store.allChunkIDs() == [id])

        chmod(path, 0o644)
        let writer = open(path, O_WRONLY)
        var flipped: UInt8 = bytes[500] ^ 0xFF
        pwrite(writer, &flipped, 1, 500)
        close(writer)
        store.dropCache()
        #expect(throws: StoreError.corruptChunk(id)) { try store.read(id) }

        #expect(store.sweep(id, unusedSince: nowNanos() + 1_000_000_000) != nil)
        #expect(access(path, F_OK) != 0)
        #expect(throws: StoreError.missingChunk(id)) { try store.read(id) }
    }

    /// A chunk bigger than a row is a pack record: claimed by `put` and `contains`, swept
    /// by its last use, compacted away by gc, and read back after a reopen from the index
    /// that the close wrote.
    @Test func recordsFollowTheContractOfFiles() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        var gen = SplitMix64(seed: 4)
        let chunks = (0..<8).map { _ in gen.bytes(50_000) }
        do {
            let store = try ChunkStore(directory: dir.path + "/chunks")
            for chunk in chunks { try store.put(ChunkID(hashing: chunk), chunk) }
            #expect(access(dir.path + "/chunks/00", F_OK) != 0, "a new store has no chunk files' directories")
            let old = ChunkID(hashing: chunks[0]), renewed = ChunkID(hashing: chunks[1])
            try store.setLastUse(old, seconds: 1_000)
            try store.setLastUse(renewed, seconds: 1_000)
            #expect(store.contains(renewed))
            var held = GraceHeld()
            let cutoff = nowNanos() - 60_000_000_000
            #expect(Array(store.sweep([old, renewed], unusedSince: cutoff, held: &held).keys) == [old])
            #expect(held.chunks == 1, "the claimed one is kept")
            #expect(!store.contains(old))
            #expect(throws: StoreError.missingChunk(old)) { try store.read(old) }
            try store.sync()
        }
        let reopened = try ChunkStore(directory: dir.path + "/chunks")
        #expect(access(dir.path + "/chunks/packs/00000001.idx", F_OK) == 0, "sealed at the close")
        // The index the close wrote lists the live records only.
        #expect(Set(reopened.allChunkIDs()) == Set(chunks.dropFirst().map { ChunkID(hashing: $0) }))
        for chunk in chunks.dropFirst() { #expect(try reopened.read(ChunkID(hashing: chunk)) == chunk) }
        let gone = chunks.prefix(6).map { ChunkID(hashing: $0) }
        #expect(reopened.sweep(gone, unusedSince: nowNanos() + 1).count == 5)
        let before = reopened.chunkFileBytes()
        try reopened.compact()
        #expect(reopened.chunkFileBytes() < before / 2, "the pack, three quarters swept, is rewritten")
        for chunk in chunks.suffix(2) { #expect(try reopened.read(ChunkID(hashing: chunk)) == chunk) }
        #expect(Set(reopened.allChunkIDs()) == Set(chunks.suffix(2).map { ChunkID(hashing: $0) }))
    }

    /// Readers of a chunk at the same moment (a read-ahead and the read behind it) read
    /// and hash it once: the others wait for that read and take its bytes.
    /// A sequential reader's chunks lie back to back in a pack: the read of a window of
    /// them, and a read-ahead of them, each make one read per run (at most 1 MiB), and
    /// hash each chunk once.
    @Test func neighboursInAPackAreReadWithOneReadPerRun() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let store = try ChunkStore(directory: dir.path + "/chunks")
        var gen = SplitMix64(seed: 11)
        let chunks = (0..<32).map { _ in gen.bytes(60_000) }
        for bytes in chunks { try store.put(ChunkID(hashing: bytes), bytes) }
        let wants = chunks.map { ChunkWant(id: ChunkID(hashing: $0), size: $0.count) }
        for background in [false, true] {
            store.dropCache()
            let reads = store.packs.diskReads.load(ordering: .relaxed), hashed = store.readsFromDisk.load(ordering: .relaxed)
            if background {
                store.prefetch(wants)
                for (want, bytes) in zip(wants, chunks) { #expect(try store.read(want.id) == bytes) }
            } else {
                try store.read(wants)
                for (want, bytes) in zip(wants, chunks) { #expect(try store.read(want.id) == bytes) }
            }
            // 32 records of 60,048 bytes: runs of 18 and 14 (a run stops once it holds 1 MiB).
            #expect(store.packs.diskReads.load(ordering: .relaxed) - reads == 2, "background: \(background)")
            #expect(store.readsFromDisk.load(ordering: .relaxed) - hashed == 32, "background: \(background)")
        }
    }

    /// A long sequential read passes through the streaming part only: it neither holds
    /// more than that part nor pushes out the chunks random readers verified.
    @Test func readAheadChunksDoNotPushOutTheRest() {
        var cache = ChunkCache(capacityBytes: 8 << 20, streamingBytes: 1 << 20)
        var gen = SplitMix64(seed: 12)
        let kept = (0..<32).map { _ in gen.bytes(64 << 10) } // 2 MiB
        for bytes in kept { cache.put(ChunkID(hashing: bytes), bytes) }
        var streamed: [ChunkID] = []
        for _ in 0..<256 { // 16 MiB, twice the main part
            let bytes = gen.bytes(64 << 10)
            streamed.append(ChunkID(hashing: bytes))
            cache.put(streamed.last!, bytes, streaming: true)
        }
        #expect(kept.allSatisfy { cache.contains(ChunkID(hashing: $0)) })
        #expect(streamed.filter { cache.contains($0) }.count <= 16, "more than the streaming part's 1 MiB held")
        #expect(cache.contains(streamed.last!))
    }

    @Test func concurrentReadersOfAChunkReadItOnce() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let store = try ChunkStore(directory: dir.path + "/chunks")
        var gen = SplitMix64(seed: 6)
        let bytes = gen.bytes(4 << 20) // long enough to hash that the readers overlap
        let id = ChunkID(hashing: bytes)
        try store.put(id, bytes)
        for round in 0..<3 {
            store.dropCache()
            let before = store.readsFromDisk.load(ordering: .relaxed)
            let wrong = Atomic<Int>(0)
            let go = DispatchGroup()
            go.enter()
            let readers = (0..<6).map { _ in
                JoinableThread {
                    go.wait()
                    if (try? store.read(id)) != bytes { wrong.add(1, ordering: .relaxed) }
                }
            }
            go.leave()
            for reader in readers { reader.join() }
            #expect(wrong.load(ordering: .relaxed) == 0, "round \(round)")
            #expect(store.readsFromDisk.load(ordering: .relaxed) - before == 1, "round \(round): reads from disk")
        }
    }

    /// Regression (CI of 9b24c92): a reader that missed the cache just before the first
    /// flight landed found no flight, took off and read the chunk again. Readers come in
    /// staggered so that some arrive as the first one lands.
    @Test func aReaderArrivingAsAFlightLandsReadsTheCache() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let store = try ChunkStore(directory: dir.path + "/chunks")
        var gen = SplitMix64(seed: 7)
        let bytes = gen.bytes(256 << 10)
        let id = ChunkID(hashing: bytes)
        try store.put(id, bytes)
        var extra = 0
        for round in 0..<200 {
            store.dropCache()
            let before = store.readsFromDisk.load(ordering: .relaxed)
            let go = DispatchGroup()
            go.enter()
            let readers = (0..<4).map { k in
                JoinableThread {
                    go.wait()
                    usleep(UInt32(k * 150 + round % 7 * 40))
                    _ = try? store.read(id)
                }
            }
            go.leave()
            for reader in readers { reader.join() }
            extra += store.readsFromDisk.load(ordering: .relaxed) - before - 1
        }
        #expect(extra == 0, "reads from disk beyond one a round, over 200 rounds")
    }

    /// Regression (t-backing-gc): gc deleted a chunk written since the last durability
    /// barrier (a pruned version's); the barrier then failed on it, and every barrier
    /// after it, so no version became durable until the next mount.
    @Test func aBarrierAfterGcDeletedAnUnsyncedChunkSucceeds() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let store = try ChunkStore(directory: dir.path + "/chunks")
        var gen = SplitMix64(seed: 2)
        let gone = gen.bytes(10_000), kept = gen.bytes(10_000)
        try store.put(ChunkID(hashing: gone), gone)
        try store.put(ChunkID(hashing: kept), kept)
        let freed = store.sweep([ChunkID(hashing: gone)], unusedSince: Int64.max)
        #expect(freed.count == 1)
        try store.sync()
        try store.sync()
    }

    @Test func listsChunks() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let store = try ChunkStore(directory: dir.path + "/chunks")
        let ids = (0..<10).map { i -> ChunkID in
            let b = [UInt8](repeating: UInt8(i), count: 10 + i)
            let id = ChunkID(hashing: b)
            try? store.put(id, b)
            return id
        }
        #expect(Set(store.allChunkIDs()) == Set(ids))
    }

    /// Small chunks are rows of chunks/small.sqlite (format 5), not records: read back,
    /// verified, listed, swept by their `used` time, durable after `sync()`.
    @Test func smallChunksAreRowsWithTheContractOfFiles() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let store = try ChunkStore(directory: dir.path + "/chunks")
        let bytes = Array("twenty bytes of text".utf8)
        let id = ChunkID(hashing: bytes)
        try store.put(id, bytes)
        #expect(access(store.path(of: id), F_OK) != 0, "a small chunk is not a file")
        #expect(store.size(of: id) == bytes.count)
        #expect(try store.read(id) == bytes)
        #expect(store.allChunkIDs() == [id])
        try store.sync()

        // The biggest small chunk is a row, one byte more is a pack record.
        let edge = [UInt8](repeating: 7, count: SmallChunks.limit)
        let over = [UInt8](repeating: 7, count: SmallChunks.limit + 1)
        try store.put(ChunkID(hashing: edge), edge)
        try store.put(ChunkID(hashing: over), over)
        #expect(!store.packs.contains(ChunkID(hashing: edge)))
        #expect(store.packs.contains(ChunkID(hashing: over)))

        // Damage in the row is caught by the hash, as in a file.
        store.dropCache()
        try withDatabase(dir.path + "/chunks/small.sqlite") { (db) throws(StoreError) in
            try db.query("UPDATE chunks SET bytes = ? WHERE id = ?", [.blob(Array("twenty bytes of tex!".utf8)), .blob(id.raw)])
        }
        #expect(throws: StoreError.corruptChunk(id)) { try store.read(id) }

        // gc: a chunk used after the cutoff stays; one used before goes.
        let before = nowNanos()
        #expect(store.sweep(id, unusedSince: before - 60_000_000_000) == nil, "used within the grace: kept")
        #expect(store.contains(id))
        #expect(store.sweep(id, unusedSince: nowNanos() + 1) != nil)
        #expect(!store.contains(id))
        #expect(throws: StoreError.missingChunk(id)) { try store.read(id) }
        try store.compact()
    }

    /// With group commit (a mount), a small chunk's put is memory only: read back, sized,
    /// listed, claimed and kept by gc from there, and written and committed by the group
    /// commit. A crash before that loses the row (the intent log carries it with its save,
    /// `RecoveryTests`); gc frees one not written whose last use is before its cutoff.
    @Test func smallChunksPutInABatchAreWrittenByTheGroupCommit() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let store = try ChunkStore(directory: dir.path + "/chunks")
        store.startBatching(opened: nil, committed: nil)
        let rows = (0..<3).map { Array("small chunk \($0) of a batch".utf8) }
        let ids = rows.map { ChunkID(hashing: $0) }
        let before = store.smallStatements
        for (id, bytes) in zip(ids, rows) { try store.put(id, bytes) }
        #expect(store.smallStatements == before, "puts run no statement")
        #expect(store.uncommittedSmallChunks(ids).count == 3)
        #expect(try store.read(ids[0]) == rows[0])
        #expect(store.size(of: ids[1]) == rows[1].count)
        #expect(Set(store.allChunkIDs()) == Set(ids))
        #expect(store.contains(ids[2]))
        #expect(store.sweep(ids[2], unusedSince: nowNanos() - 60_000_000_000) == nil, "used within the grace: kept")
        #expect(store.sweep(ids[2], unusedSince: nowNanos() + 1) != nil, "unused since the cutoff: freed")
        #expect(!store.contains(ids[2]))
        let rowsIn = { () throws -> Int in
            try withDatabase(dir.path + "/chunks/small.sqlite") { (db) throws(StoreError) in
                try db.rows("SELECT count(*) FROM chunks", []) { Int($0.int(0)) }.first ?? -1
            }
        }
        #expect(try rowsIn() == 0, "nothing committed before the group commit")
        try store.commitSmallChunks()
        #expect(try rowsIn() == 2)
        #expect(store.uncommittedSmallChunks(ids).isEmpty)
        store.dropCache()
        #expect(try store.read(ids[1]) == rows[1])
        #expect(throws: StoreError.missingChunk(ids[2])) { try store.read(ids[2]) }
    }

    /// A store from before format 5 keeps small chunks as files: they stay readable, a
    /// put of the same bytes claims the file instead of adding a row, gc collects it.
    @Test func smallChunkFilesOfAnOlderStoreStayReadable() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        ChunkDamage.makeOldLayout(chunks: dir.path + "/chunks")
        let store = try ChunkStore(directory: dir.path + "/chunks")
        let bytes = Array("kept as a file by format 4".utf8)
        let id = ChunkID(hashing: bytes)
        let path = store.path(of: id)
        let fd = open(path, O_WRONLY | O_CREAT, 0o444)
        _ = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        close(fd)
        #expect(try store.read(id) == bytes)
        try store.put(id, bytes)
        #expect(try withDatabase(dir.path + "/chunks/small.sqlite") { (db) throws(StoreError) in
            try db.rows("SELECT count(*) FROM chunks", []) { $0.int(0) }.first
        } == 0, "no second copy as a row")
        #expect(store.allChunkIDs() == [id])
        #expect(store.sweep(id, unusedSince: nowNanos() + 1_000_000_000) != nil)
        #expect(access(path, F_OK) != 0)
    }
}

extension ChunkStoreTests {
    /// Format 6 makes the small-chunk table keyed by id (no row number, no index of ids)
    /// in 16 KiB pages, so a 2 KiB chunk stays in its page; a format-5 table is kept and
    /// works as before.
    @Test func aFormatFiveSmallChunkTableKeepsWorking() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        mkdir(dir.path + "/chunks", 0o755)
        let chunks = (0..<5000).map { i in Array("small chunk \(i)".utf8) }
        try withDatabase(dir.path + "/chunks/small.sqlite") { (db) throws(StoreError) in
            try db.execute("CREATE TABLE chunks(row INTEGER PRIMARY KEY, id BLOB NOT NULL UNIQUE, bytes BLOB NOT NULL, used INTEGER NOT NULL)")
            for bytes in chunks {
                try db.query("INSERT INTO chunks(id, bytes, used) VALUES(?, ?, 1)", [.blob(ChunkID(hashing: bytes).raw), .blob(bytes)])
            }
        }
        let store = try ChunkStore(directory: dir.path + "/chunks")
        #expect(Set(store.allChunkIDs()) == Set(chunks.map { ChunkID(hashing: $0) }))
        for bytes in chunks.prefix(50) { #expect(try store.read(ChunkID(hashing: bytes)) == bytes) }
        let new = Array(repeating: UInt8(7), count: 2048)
        try store.put(ChunkID(hashing: new), new)
        #expect(try store.read(ChunkID(hashing: new)) == new)
        #expect(store.sweep(ChunkID(hashing: chunks[0]), unusedSince: 2) != nil)
        #expect(!store.contains(ChunkID(hashing: chunks[0])))

        let fresh = TempDirectory()
        defer { fresh.cleanup() }
        let made = try ChunkStore(directory: fresh.path + "/chunks")
        try made.put(ChunkID(hashing: new), new)
        let (pageSize, columns) = try withDatabase(fresh.path + "/chunks/small.sqlite") { (db) throws(StoreError) in
            (try db.rows("PRAGMA page_size", []) { $0.int(0) }.first, try db.rows("PRAGMA table_info(chunks)", []) { $0.text(1) })
        }
        #expect(pageSize == 16384)
        #expect(columns == ["id", "bytes", "used"])
    }
}

/// Opens a SQLite database of a store directly (to damage or inspect it).
/// What a power loss does besides dropping writes: the machine boots again, so the boot
/// the store's last open noted is not this one (`Store+Recovery`).
func reboot(_ store: String) throws {
    _ = try withDatabase(store + "/meta.sqlite") { (db) throws(StoreError) in
        try db.query("DELETE FROM settings WHERE key = ?", [.text(Store.bootKey)])
    }
}

func withDatabase<T>(_ path: String, _ body: (SQLiteDatabase) throws(StoreError) -> T) throws -> T {
    let db = try SQLiteDatabase(path: path)
    return try body(db)
}
