import Glibc
import Testing
@testable import UbiquityStore

@Suite struct ChunkStoreTests {
    @Test func storesVerifiesAndRefusesCorruptChunks() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let store = try ChunkStore(directory: dir.path + "/chunks")
        var gen = SeededBytes(seed: 1)
        let bytes = gen.bytes(100_000)
        let id = ChunkID(hashing: bytes)
        try store.put(id, bytes)
        try store.put(id, bytes) // idempotent
        #expect(try store.read(id) == bytes)

        // Flip one byte on disk: the read must fail, never return the changed bytes.
        store.dropCache()
        let path = store.path(of: id)
        chmod(path, 0o644)
        let fd = open(path, O_WRONLY)
        var flipped: UInt8 = bytes[500] ^ 0xFF
        pwrite(fd, &flipped, 1, 500)
        close(fd)
        #expect(throws: StoreError.corruptChunk(id)) { try store.read(id) }

        // A missing chunk is reported as missing.
        unlink(path)
        #expect(throws: StoreError.missingChunk(id)) { try store.read(id) }
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
}

@Suite struct IntervalSetTests {
    /// Model test: the set agrees with a plain boolean array under random inserts and clips.
    @Test func agreesWithModel() {
        var gen = SeededBytes(seed: 5)
        for _ in 0..<200 {
            var set = IntervalSet()
            var model = [Bool](repeating: false, count: 200)
            for _ in 0..<30 {
                if gen.int(0..<5) == 0 {
                    let size = gen.int(0..<200)
                    set.clip(to: Int64(size))
                    for i in size..<200 { model[i] = false }
                } else {
                    let a = gen.int(0..<200), b = gen.int(0..<200)
                    let r = min(a, b)..<max(a, b)
                    set.insert(Int64(r.lowerBound)..<Int64(r.upperBound))
                    for i in r { model[i] = true }
                }
                var rebuilt = [Bool](repeating: false, count: 200)
                for r in set.ranges { for i in r { rebuilt[Int(i)] = true } }
                #expect(rebuilt == model)
                // Disjoint, sorted, non-touching.
                for (x, y) in zip(set.ranges, set.ranges.dropFirst()) { #expect(x.upperBound < y.lowerBound) }
                let (qa, qb) = (gen.int(0..<200), gen.int(0..<200))
                let q = min(qa, qb)..<max(qa, qb)
                if !q.isEmpty {
                    #expect(set.overlaps(Int64(q.lowerBound)..<Int64(q.upperBound)) == model[q].contains(true))
                }
            }
        }
    }
}
