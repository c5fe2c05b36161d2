import Testing
import TestSupport
import UbiquityBacking
import UbiquityStore
@testable import UbiquitySync

/// Packs (backing format 5's chunk container): round trips, request counts, damage.
@Suite struct PackTests {
    @Test(arguments: [61, UInt64.random(in: 100...UInt64.max)])
    func tenThousandSmallChunksAreAFewPuts(seed: UInt64) throws {
        print("PackTests seed \(seed)")
        var gen = SplitMix64(seed: seed)
        let store = MemoryStore()
        var writer = Pack.Writer()
        var locations: [Pack.ChunkLocation] = []
        var chunks: [ChunkID: [UInt8]] = [:]
        for _ in 0..<10_000 {
            let bytes = gen.bytes(gen.int(1..<2048))
            let id = ChunkID(hashing: bytes)
            chunks[id] = bytes
            writer.add(id, bytes)
            if writer.isFull {
                locations += try writer.upload(to: store)
                writer = Pack.Writer()
            }
        }
        if !writer.isEmpty { locations += try writer.upload(to: store) }
        #expect(store.counts.of(.put) <= 3, "\(store.counts.of(.put)) PUTs for 10,000 chunks of 1 KiB on average")
        // Every chunk has a place (a chunk made twice by chance, e.g. two 1-byte chunks, may
        // have one in two packs: a writer drops repeats only within its own pack).
        #expect(Set(locations.map(\.id)) == Set(chunks.keys))
        // Any chunk: one ranged GET of exactly its bytes.
        store.resetCounts()
        for location in locations.prefix(50) { #expect(try Pack.fetch(location, from: store) == chunks[location.id]) }
        #expect(store.counts.of(.get) == 50 && store.counts.bytesDown == Int64(locations.prefix(50).reduce(0) { $0 + $1.length }))
        // The index, from the tail, agrees with what the writer said.
        let packs = Set(locations.map(\.pack))
        for pack in packs {
            #expect(try Pack.index(pack, in: store) == locations.filter { $0.pack == pack }, "index of \(pack)")
        }
    }

    @Test func damageIsNeverServed() throws {
        let store = MemoryStore()
        var writer = Pack.Writer()
        let a = Array("the first chunk".utf8), b = Array("the second one".utf8)
        writer.add(ChunkID(hashing: a), a)
        writer.add(ChunkID(hashing: b), b)
        let locations = try writer.upload(to: store)
        let key = Pack.key(locations[0].pack)
        var bytes = try store.get(key)
        bytes[Int(locations[1].offset)] ^= 1
        try store.put(key, bytes)
        #expect(try Pack.fetch(locations[0], from: store) == a)
        #expect(throws: BackingError.self) { try Pack.fetch(locations[1], from: store) }
        // A location pointing outside any sane range is refused before a request.
        let wild = Pack.ChunkLocation(id: locations[0].id, pack: locations[0].pack, offset: -5, length: 10)
        store.resetCounts()
        #expect(throws: BackingError.self) { try Pack.fetch(wild, from: store) }
        #expect(store.counts.total == 0)
    }

    @Test(arguments: [62, UInt64.random(in: 100...UInt64.max)])
    func hostileTailsAreGarbageNotTraps(seed: UInt64) throws {
        print("PackTests.hostileTails seed \(seed)")
        var gen = SplitMix64(seed: seed)
        let store = MemoryStore()
        var writer = Pack.Writer()
        for _ in 0..<20 { let c = gen.bytes(gen.int(1..<300)); writer.add(ChunkID(hashing: c), c) }
        let name = Pack.newName()
        let (good, _) = writer.sealed(name: name)
        for round in 0..<2000 {
            var bytes = good
            for _ in 0..<gen.int(1..<6) {
                let at = gen.int(max(0, bytes.count - 900)..<bytes.count) // mostly the index and trailer
                switch gen.int(0..<3) {
                case 0: bytes[at] = UInt8(truncatingIfNeeded: gen.next())
                case 1: bytes.remove(at: at)
                default: bytes.insert(UInt8(truncatingIfNeeded: gen.next()), at: at)
                }
            }
            try store.put(Pack.key(name), bytes)
            if let index = try? Pack.index(name, in: store) {
                // Whatever parses lies within the pack.
                #expect(index.allSatisfy { $0.offset >= 8 && $0.offset + Int64($0.length) <= Int64(bytes.count) }, "seed \(seed) round \(round)")
            }
        }
    }
}
