import Glibc
import Testing
import TestSupport
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
