import Glibc
import Testing
import TestSupport
import UbiquityStore
import UbiquitySystem
@testable import UbiquitySync

/// `fsck --repair`: only a backing object with the right hash and size replaces a
/// damaged chunk; anything else is reported, never used.
@Suite struct RepairTests {
    @Test func repairsFromVerifiedObjectsOnly() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let chunks = try ChunkStore(directory: dir.path + "/chunks")
        let backing = Backing(directory: dir.path + "/backing", deviceID: "0123456789abcdef")
        mkdir(dir.path + "/backing", 0o755)
        try backing.open()
        func chunk(_ text: String, size: Int) -> (ChunkID, [UInt8]) {
            let bytes = Array(String(repeating: text, count: size / text.utf8.count).utf8)
            return (ChunkID(hashing: bytes), bytes)
        }
        let (good, goodBytes) = chunk("good ", size: 5000)     // a file in the store
        let (small, smallBytes) = chunk("small ", size: 60)    // a row
        let (absent, _) = chunk("absent ", size: 700)
        let (rotten, rottenBytes) = chunk("rotten ", size: 700)
        let (short, shortBytes) = chunk("short ", size: 600)
        for (id, bytes) in [(good, goodBytes), (small, smallBytes), (short, shortBytes)] { try backing.putObject(id, bytes) }
        try backing.putObject(rotten, Array(rottenBytes.reversed())) // damaged in the backing directory too
        // In the store: good's file is damaged, small's row holds other bytes.
        try chunks.put(good, Array(goodBytes.reversed()))
        try chunks.put(small, Array("not the bytes".utf8))
        #expect(throws: StoreError.corruptChunk(good)) { try chunks.read(good) }

        let report = try Repair.run(damaged: [good: 5000, small: 60, absent: 700, rotten: 700, short: 999],
                                    chunks: chunks, backingDirectory: dir.path + "/backing")
        #expect(Set(report.repaired) == [good, small])
        let why = Dictionary(uniqueKeysWithValues: report.unrepaired.map { ($0.0, $0.1) })
        #expect(why[absent] == "not in the backing directory")
        #expect(why[rotten] == "the backing directory's copy is damaged too")
        #expect(why[short]?.contains("not 999") == true)
        chunks.dropCache()
        #expect(try chunks.read(good) == goodBytes)
        #expect(try chunks.read(small) == smallBytes)
    }
}
