import Testing
import TestSupport
import UbiquityBacking
import UbiquityCrypto

/// The encrypting wrapper: the whole backing contract over memory and a directory, no
/// plaintext below it, ranged reads that fetch only the blocks they need, and every kind
/// of tampering (a changed byte, a cut, a moved object, another key) refused.
@Suite struct EncryptedStoreTests {
    static func key(_ s: String) -> BackingKey { BackingKey(checked: s) }

    @Test(arguments: [43, UInt64.random(in: 100...UInt64.max)])
    func conformsOverMemoryAndADirectory(seed: UInt64) throws {
        print("EncryptedStoreTests.conformsOverMemoryAndADirectory seed \(seed)")
        try BackingConformance.run(EncryptedStore(MemoryStore(), key: .random()), "encrypted memory", seed: seed)
        let dir = TempDirectory()
        defer { dir.cleanup() }
        try BackingConformance.run(EncryptedStore(DirectoryStore(root: dir.path), key: .random()), "encrypted directory", seed: seed)
    }

    @Test func theStoreBelowHoldsNoPlaintextButFORMATAndKeys() throws {
        let base = MemoryStore()
        let store = EncryptedStore(base, key: .random())
        let secret = Array("the quarterly numbers.xlsx: 1,234,567".utf8)
        try store.put(Self.key("log/1-0123456789abcdef-0000000000000001"), secret + secret)
        try store.put(Self.key("FORMAT"), Array("ubiquity-backing 6\n".utf8))
        try store.put(Self.key("keys/0123456789abcdef"), Array("ubiquity-key 1\n".utf8))
        let raw = try base.get(Self.key("log/1-0123456789abcdef-0000000000000001"))
        #expect(raw.count == 2 * secret.count + Sealer.overhead)
        #expect(!contains(raw, Array(secret.prefix(12))), "no plaintext below")
        #expect(try base.get(Self.key("FORMAT")) == Array("ubiquity-backing 6\n".utf8), "FORMAT is read before there is a key")
        #expect(try base.get(Self.key("keys/0123456789abcdef")) == Array("ubiquity-key 1\n".utf8))
        #expect(try store.stat(Self.key("log/1-0123456789abcdef-0000000000000001"))?.size == Int64(2 * secret.count))
    }

    /// Ranged reads at random places of a 3 MiB object return the plaintext and fetch at
    /// most the blocks that hold the range.
    @Test(arguments: [44, UInt64.random(in: 100...UInt64.max)])
    func rangedReadsFetchOnlyTheirBlocks(seed: UInt64) throws {
        print("EncryptedStoreTests.rangedReadsFetchOnlyTheirBlocks seed \(seed)")
        var gen = SplitMix64(seed: seed)
        let metered = MeteredStore(MemoryStore())
        let store = EncryptedStore(metered, key: .random())
        let plain = gen.bytes(3 << 20 + 12_345)
        let pack = Self.key("packs/ab/ab000000000000000000000000000000")
        try store.put(pack, plain)
        for _ in 0..<200 {
            let a = Int64(gen.next() % UInt64(plain.count + 10)), length = Int64(gen.next() % 300_000)
            let before = metered.meter.bytesDown
            let got = try store.get(pack, range: a..<a + length)
            let end = min(Int(a + length), plain.count)
            #expect(got == (Int(a) < plain.count ? Array(plain[Int(a)..<end]) : []), "\(a)+\(length)")
            let blocks = (length + 2 * Int64(Sealer.blockSize) - 1) / Int64(Sealer.blockSize)
            #expect(metered.meter.bytesDown - before <= blocks * Int64(Sealer.blockSize + Sealer.overhead), "\(a)+\(length)")
        }
        // Ranges of any size: the block arithmetic never overflows.
        #expect(try store.get(pack, range: 5..<Int64.max) == Array(plain[5...]))
        #expect(throws: BackingError.self) { try store.get(pack, range: (Int64.max - 1)..<Int64.max) }
    }

    @Test func tamperingIsRefusedNeverServed() throws {
        let base = MemoryStore()
        let store = EncryptedStore(base, key: .random())
        let plain = (0..<(3 * Sealer.blockSize + 100)).map { UInt8($0 % 253) }
        let a = Self.key("packs/aa/aa000000000000000000000000000000"), b = Self.key("packs/bb/bb000000000000000000000000000000")
        try store.put(a, plain)
        try store.put(b, Array(plain.reversed()))
        let sealed = try base.get(a)
        let block = Sealer.blockSize + Sealer.overhead

        // A byte changed in the second block: the whole object and a range over that
        // block fail; a range of another block is still served.
        var changed = sealed
        changed[block + 100] ^= 1
        try base.put(a, changed)
        #expect(throws: BackingError.self) { try store.get(a) }
        #expect(throws: BackingError.self) { try store.get(a, range: Int64(Sealer.blockSize) + 5..<Int64(Sealer.blockSize) + 6) }
        #expect(try store.get(a, range: 0..<10) == Array(plain[0..<10]))

        // Cut after a whole block: whole reads and reads that run into the cut fail.
        try base.put(a, Array(sealed[..<(2 * block)]))
        #expect(throws: BackingError.self) { try store.get(a) }
        #expect(throws: BackingError.self) { try store.get(a, range: 0..<Int64(plain.count)) }

        // Another object's bytes under this name (a replayed or swapped object):
        try base.put(a, try base.get(b))
        #expect(throws: BackingError.self) { try store.get(a) }
        #expect(throws: BackingError.self) { try store.get(a, range: 0..<1) }

        // Another container's key, and a size no sealed object has:
        try base.put(a, sealed)
        #expect(throws: BackingError.self) { try EncryptedStore(base, key: .random()).get(a) }
        #expect(try store.get(a) == plain)
        try base.put(a, Array(sealed[..<(block + Sealer.overhead)]))
        #expect(throws: BackingError.self) { try store.stat(a) }
        #expect(try store.list(prefix: "packs/aa/", after: nil, limit: 10).objects.count == 1, "listed, never refused")
    }

    /// Regression: a listed size near Int64.max (a hostile store) overflowed the block count.
    @Test func anyListedSizeIsMappedWithoutTrapping() throws {
        struct Huge: BackingStore {
            var location: String { "huge" }
            func put(_ key: BackingKey, _ bytes: [UInt8], ifAbsent: Bool) throws(BackingError) {}
            func get(_ key: BackingKey, range: Range<Int64>?) throws(BackingError) -> [UInt8] { [] }
            func stat(_ key: BackingKey) throws(BackingError) -> ObjectInfo? { nil }
            func list(prefix: String, after: BackingKey?, limit: Int) throws(BackingError) -> ObjectListing {
                ObjectListing(objects: [Int64.max, Int64.max - 1, -5].map { ObjectInfo(key: BackingKey(checked: "packs/x\($0)"), size: $0) }, more: false)
            }
            func delete(_ key: BackingKey) throws(BackingError) {}
        }
        let sizes = try EncryptedStore(Huge(), key: .random()).list(prefix: "", after: nil, limit: 10).objects.map(\.size)
        #expect(sizes.count == 3 && sizes.allSatisfy { $0 >= 0 })
    }

    private func contains(_ haystack: [UInt8], _ needle: [UInt8]) -> Bool {
        guard needle.count <= haystack.count else { return false }
        return (0...(haystack.count - needle.count)).contains { Array(haystack[$0..<$0 + needle.count]) == needle }
    }
}
