import Glibc
import Testing
import TestSupport
import UbiquityBacking
import UbiquitySystem
@testable import UbiquityFS
@testable import UbiquityStore
@testable import UbiquitySync

/// Store format 14 across devices: a tiny file's bytes ride in its record (as they did
/// since backing format 4) and land in the receiving device's version row, never in its
/// small.sqlite; a small file over the inline limit is stored there as before.
@Suite struct InlineSyncTests {
    @Test func aTinyFileTravelsInItsRecordAndStaysInTheVersionRow() throws {
        let temp = TempDirectory()
        defer { temp.cleanup() }
        let memory = MemoryStore()
        let a = try SimDevice(name: "a", root: temp.path, backing: memory, clock: nowNanos)
        let tiny = "twenty bytes of text", small = String(repeating: "s", count: 100)
        try a.save("docs/tiny.txt", tiny)
        try a.save("docs/small.txt", small)
        try a.save("docs/grid.tinypix", "#.......\n.#......\n..#.....\n...#....\n....#...\n.....#..\n......#.\n.......#\n")
        try a.engine.cycle(pushPull: true)
        let smallID = ChunkID(hashing: Array(small.utf8)), tinyID = ChunkID(hashing: Array(tiny.utf8))
        // (The grid a reader of the picture sees is 72 bytes, a chunk of its own.)
        let docs = try #require(try a.directory("docs", create: false))
        let picture = try a.fs.lookup(parent: docs, name: "grid.tinypix").ino
        let pictureHead = try #require(try a.store.node(picture)?.inode.head)
        let pictureID = try #require(try a.store.chunkList(row: pictureHead).ids.first)
        func stored(_ d: SimDevice) -> Set<ChunkID> { Set(d.store.chunks.allChunkIDs()) }
        #expect(stored(a).contains(smallID) && !stored(a).contains(tinyID) && !stored(a).contains(pictureID), "on the writer")
        // The record carries the tiny bytes (`=<hex>`), as every device since format 4 reads.
        let segments = memory.keys("log/").compactMap { try? memory.get(BackingKey($0)!, range: nil) }
        #expect(segments.contains { String(decoding: $0, as: UTF8.self).contains("=" + Hex.encode(Array(tiny.utf8))) })

        let b = try SimDevice(name: "b", root: temp.path, backing: memory, clock: nowNanos)
        try b.engine.cycle(pushPull: true)
        let tree = try b.tree()
        #expect(tree["docs/tiny.txt"] == "file " + tiny)
        #expect(tree["docs/small.txt"] == "file " + small)
        #expect(tree["docs/grid.tinypix"]?.hasPrefix("file #.......\n.#......") == true, "\(tree)")
        #expect(stored(b).contains(smallID) && !stored(b).contains(tinyID) && !stored(b).contains(pictureID), "on the receiver")
        // And back: b's edit of the tiny file reaches a.
        try b.save("docs/tiny.txt", "edited on b")
        try b.engine.cycle(pushPull: true)
        try a.engine.cycle(pushPull: true)
        #expect(try a.tree()["docs/tiny.txt"] == "file edited on b")
        #expect(!stored(a).contains(ChunkID(hashing: Array("edited on b".utf8))))
    }
}
