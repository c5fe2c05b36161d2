import Glibc
import Testing
import TestSupport
import UbiquityBacking
import UbiquityStore
import UbiquitySystem
@testable import UbiquityFS
@testable import UbiquitySync

/// `fsck --repair`: a damaged chunk is fetched from the pack the store's chunk places name
/// (or, for a chunk that went out in format 4, from `objects/`); only bytes with the
/// right hash and size replace it; anything else is reported, never used.
@Suite struct RepairTests {
    static func chunk(_ text: String, size: Int) -> (ChunkID, [UInt8]) {
        let bytes = Array(String(repeating: text, count: size / text.utf8.count).utf8)
        return (ChunkID(hashing: bytes), bytes)
    }

    @Test func repairsFromVerifiedPackBytesOnly() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let chunks = try ChunkStore(directory: dir.path + "/chunks")
        let backing = RecordingStore(MemoryStore())
        let (good, goodBytes) = Self.chunk("good ", size: 5000)      // a file in the store
        let (small, smallBytes) = Self.chunk("small ", size: 60)     // a row
        let (short, shortBytes) = Self.chunk("short ", size: 600)
        let (absent, _) = Self.chunk("absent ", size: 700)
        let (rotten, _) = Self.chunk("rotten ", size: 700)
        let (gone, _) = Self.chunk("gone ", size: 800)
        let (hostile, _) = Self.chunk("hostile ", size: 800)
        let (legacy, legacyBytes) = Self.chunk("legacy ", size: 3000)
        let (legacyRotten, legacyRottenBytes) = Self.chunk("old rotten ", size: 3000)
        var writer = Pack.Writer()
        for (id, bytes) in [(good, goodBytes), (small, smallBytes), (short, shortBytes)] { writer.add(id, bytes) }
        let locations = try writer.upload(to: backing)
        var places: [ChunkID: ChunkPlace] = [:]
        for l in locations { places[l.id] = ChunkPlace(pack: l.pack, offset: l.offset) }
        let pack = locations[0].pack
        places[rotten] = ChunkPlace(pack: pack, offset: 8)  // good's bytes are there
        places[gone] = ChunkPlace(pack: String(repeating: "ab", count: 16), offset: 8)
        places[hostile] = ChunkPlace(pack: "../../etc", offset: 8)
        // Chunks that went out in format 4: one intact, one damaged in the backing store too.
        try backing.put(BackingKey(checked: "objects/\(legacy.hex.prefix(2))/\(legacy.hex)"), legacyBytes)
        try backing.put(BackingKey(checked: "objects/\(legacyRotten.hex.prefix(2))/\(legacyRotten.hex)"), Array(legacyRottenBytes.reversed()))
        // In the store: good's file is damaged, small's row holds other bytes.
        try chunks.put(good, Array(goodBytes.reversed()))
        try chunks.put(small, Array("not the bytes".utf8))
        #expect(throws: StoreError.corruptChunk(good)) { try chunks.read(good) }
        backing.reset()

        let report = try Repair.run(damaged: [good: 5000, small: 60, absent: 700, rotten: 700, short: 999, gone: 800,
                                              hostile: 800, legacy: Int64(legacyBytes.count), legacyRotten: Int64(legacyRottenBytes.count)],
                                    chunks: chunks, backing: backing, places: places)
        let why = Dictionary(uniqueKeysWithValues: report.unrepaired.map { ($0.0, $0.1) })
        #expect(Set(report.repaired) == [good, small, legacy], "\(why.values)")
        #expect(Set(why.keys) == [absent, rotten, short, gone, hostile, legacyRotten])
        #expect(why[absent] == "no pack is known to hold it and it is not in objects/ (format 4)")
        #expect(why[rotten]?.contains("are not chunk") == true, "\(why[rotten] ?? "")")
        #expect(why[short]?.contains("pack \(pack)") == true, "\(why[short] ?? "")") // 999 bytes there are not the chunk
        #expect(why[gone]?.contains("not found") == true, "\(why[gone] ?? "")")
        #expect(why[hostile] == "a bad pack name in its place")
        #expect(why[legacyRotten] == "the backing store's copy is damaged too")
        // Each chunk with a place: one ranged GET of its bytes, never the whole pack.
        let packGets = backing.calls.filter { $0.op == .get && $0.key.hasPrefix("packs/") }
        #expect(packGets.count == 5, "\(packGets)") // good, small, rotten, short, gone
        #expect(packGets.allSatisfy { $0.range.map { $0.count <= 5000 } == true }, "\(packGets)")
        #expect(!backing.calls.contains { $0.key.contains("etc") })
        chunks.dropCache()
        #expect(try chunks.read(good) == goodBytes)
        #expect(try chunks.read(small) == smallBytes)
        #expect(try chunks.read(legacy) == legacyBytes)
    }

    /// As `ubiquity fsck --repair` runs it: fsck's damaged chunks, the places the store
    /// learned from the records it took in, a pack fetched from the backing store.
    @Test func aDeviceRepairsAChunkFromThePackItsRecordNamed() throws {
        let temp = TempDirectory()
        defer { temp.cleanup() }
        let memory = MemoryStore()
        let a = try SimDevice(name: "a", root: temp.path, backing: memory, clock: nowNanos)
        let b = try SimDevice(name: "b", root: temp.path, backing: memory, clock: nowNanos)
        var rng = SplitMix64(seed: 7)
        let big = randomText(200_000, &rng)
        try a.save("big.txt", big)
        try a.engine.cycle(pushPull: true)
        try b.engine.cycle(pushPull: true)
        #expect(try b.tree() == ["big.txt": "file " + big])

        // Damage every chunk of the file on b (one file made of several chunks).
        let ids = b.fs.chunks.allChunkIDs().filter { (b.fs.chunks.size(of: $0) ?? 0) > RecordCodec.maxInline }
        #expect(ids.count >= 2)
        for id in ids {
            b.fs.chunks.discard(id)
            try b.fs.chunks.put(id, Array(repeating: 0x78, count: 100))
        }
        b.fs.chunks.dropCache()
        let report = try b.fs.withMetaLock { (_, store) throws(StoreError) in try Fsck.run(store: store) }
        #expect(Set(report.damaged.keys) == Set(ids))
        let places = try b.fs.withMetaLock { (_, store) throws(StoreError) in try store.chunkPlaces(report.damaged.keys) }
        #expect(places.count == ids.count)
        memory.resetCounts()
        let repaired = try Repair.run(damaged: report.damaged, chunks: b.fs.chunks, backing: memory, places: places)
        #expect(Set(repaired.repaired) == Set(ids) && repaired.unrepaired.isEmpty)
        #expect(memory.counts.of(.get) == ids.count && memory.counts.of(.put) == 0)
        #expect(memory.counts.bytesDown <= 200_000)
        b.fs.chunks.dropCache()
        #expect(try b.fs.withMetaLock { (_, store) throws(StoreError) in try Fsck.run(store: store) }.problems.isEmpty)
        #expect(try b.tree() == ["big.txt": "file " + big])
    }
}
