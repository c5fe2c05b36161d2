import Testing
import TestSupport
@testable import UbiquityStore

@Suite struct ChunkerTests {
    @Test func goldenCutPoints() {
        var gen = SplitMix64(seed: 42)
        let data = gen.bytes(1 << 20)
        // Recorded from this implementation; a change here means every store's chunks
        // change and dedup against existing data breaks. Do not update casually.
        #expect(cuts(data) == ChunkerTests.golden)
    }

    static let golden: [Int] = [18270, 19069, 67471, 72744, 19449, 72759, 66032, 67668, 34310, 72699, 67853, 96831, 65901, 82786, 88249, 66212, 58439, 11834]

    @Test func sizesStayWithinBounds() {
        var gen = SplitMix64(seed: 7)
        let data = gen.bytes(8 << 20)
        let lengths = cuts(data)
        let c = Chunker.standard
        #expect(lengths.reduce(0, +) == data.count)
        for length in lengths.dropLast() { #expect(length >= c.minSize && length <= c.maxSize) }
        let average = data.count / lengths.count
        #expect(average > 40 << 10 && average < 100 << 10, "average chunk \(average)")
    }

    @Test func smallInputIsOneChunk() {
        #expect(cuts([1, 2, 3]) == [3])
        #expect(cuts([]) == [])
        #expect(cuts([UInt8](repeating: 9, count: 16 << 10)) == [16 << 10])
    }

    @Test func anInsertionMovesOnlyNearbyCuts() {
        var gen = SplitMix64(seed: 99)
        var data = gen.bytes(4 << 20)
        let before = Set(boundaries(cuts(data)))
        data.insert(contentsOf: [1, 2, 3, 4, 5], at: 2 << 20)
        let after = Set(boundaries(cuts(data)).map { $0 > 2 << 20 ? $0 - 5 : $0 })
        // Almost every boundary survives the edit.
        #expect(before.intersection(after).count >= before.count - 3)
    }

    /// An encrypted container's chunker (issue 25): the standard sizes, cuts of its own
    /// that depend only on its table, so a known file's chunk sizes do not give it away.
    @Test func aKeyedTableCutsElsewhereAndAlwaysTheSame() throws {
        var gen = SplitMix64(seed: 42)
        let data = gen.bytes(1 << 20)
        var tableGen = SplitMix64(seed: 2_525)
        let table = (0..<256).map { _ in tableGen.next() }
        let keyed = try #require(Chunker.keyed(table: table))
        let lengths = cuts(data, keyed)
        #expect(lengths != ChunkerTests.golden)
        #expect(Set(boundaries(lengths)).intersection(boundaries(ChunkerTests.golden)).count <= 2, "almost no cut shared")
        #expect(lengths == cuts(data, Chunker.keyed(table: table)!), "the same table, the same cuts")
        #expect(lengths.reduce(0, +) == data.count)
        for length in lengths.dropLast() { #expect(length >= keyed.minSize && length <= keyed.maxSize) }
        #expect(Chunker.keyed(table: Array(table.dropLast())) == nil)
    }

    @Test func chunkIDHexRoundTrips() {
        let id = ChunkID(hashing: Array("hello".utf8))
        #expect(id.hex == "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824")
        #expect(ChunkID(hex: id.hex) == id)
        #expect(ChunkID(raw: id.raw) == id)
        #expect(ChunkID(hex: "zz") == nil)
    }

    private func boundaries(_ lengths: [Int]) -> [Int] {
        var pos = 0
        return lengths.map { pos += $0; return pos }
    }
}
