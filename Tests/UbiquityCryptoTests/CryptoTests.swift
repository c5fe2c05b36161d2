import Crypto
import Testing
import UbiquitySystem
@testable import UbiquityCrypto

/// Golden vectors (computed independently with Python's `hashlib` and `cryptography`:
/// HKDF-SHA256, AES-256-GCM, HMAC-SHA256, scrypt) for every format this target writes, so
/// a change of label, layout or associated data cannot pass unnoticed; RFC 7914's scrypt
/// vector; and tampering, wrong keys and hostile key files refused.
@Suite struct CryptoTests {
    static let master = ContainerKey(bytes: Array(0..<32))!

    static func hex(_ bytes: some Sequence<UInt8>) -> String { Hex.encode(bytes) }

    @Test func derivedKeysAreHKDFOfTheirLabels() {
        let expected: [ContainerKey.Use: String] = [
            .content: "22fed3848e94acca400f3cc8ea0db6c80d8afdf9df4bc86d460e0ac8265a11b2",
            .chunker: "b2c3c26e78a50b4fa02444c8a0fdeb492de4f9951cf6fdd30ede2062affc86ab",
        ]
        for use in ContainerKey.Use.allCases {
            #expect(Self.hex(Self.master.derived(for: use).withUnsafeBytes { Array($0) }) == expected[use], "\(use)")
        }
        #expect("\(Self.master)" == "ContainerKey(…)", "a key never prints its bytes")
        let table = Self.master.chunkerTable()
        #expect(table.count == 256 && table[0] == 0x4f0b_a578_6ec2_c3b2 && table[1] == 0x49eb_fda0_c844_24a0 && table[255] == 0xc76e_668e_eaf4_5b85)
        #expect(ContainerKey(bytes: Array(0..<31)) == nil)
    }

    static func nonces(_ index: Int) throws -> AES.GCM.Nonce { try AES.GCM.Nonce(data: [UInt8](repeating: UInt8(0xa0 + index), count: 12)) }

    @Test func aSealedObjectIsItsGoldenBytesAndOpensOnlyUnderItsName() throws {
        let sealer = Sealer(Self.master)
        let name = "log/1700000000000-0123456789abcdef-0000000000000001"
        let plaintext = Array("ubiquity segment line\n".utf8)
        let sealed = try sealer.seal(plaintext, name: name, nonce: Self.nonces)
        #expect(Self.hex(sealed) == "01a0a0a0a0a0a0a0a0a0a0a0a0da5cf03845df268f1131977e9582b3d2cdfd8e851c5b7441a191d7efe4606d9f32eaacdca806")
        #expect(sealed.count == plaintext.count + Sealer.overhead)
        #expect(Int64(sealed.count) == Sealer.sealedSize(Int64(plaintext.count)))
        #expect(try sealer.open(sealed, name: name) == plaintext)
        #expect(Self.hex(try sealer.seal([], name: name, nonce: Self.nonces)) == "01a0a0a0a0a0a0a0a0a0a0a0a0b6757cbb25eebcad1cac0d8c802fa9d7")
        // Another name (a segment replayed in place of another, one from another device):
        #expect(throws: CryptoFailure.notAuthentic("log/1700000000000-0123456789abcdef-0000000000000002")) {
            try sealer.open(sealed, name: "log/1700000000000-0123456789abcdef-0000000000000002")
        }
        // Another container's key:
        #expect(throws: CryptoFailure.notAuthentic(name)) { try Sealer(ContainerKey.random()).open(sealed, name: name) }
        // Truncated, and every bit of every byte flipped in turn:
        #expect(throws: CryptoFailure.notAuthentic(name)) { try sealer.open(Array(sealed.prefix(Sealer.overhead - 1)), name: name) }
        #expect(throws: CryptoFailure.notAuthentic(name)) { try sealer.open(Array(sealed.dropLast()), name: name) }
        #expect(throws: CryptoFailure.notAuthentic(name)) { try sealer.open([], name: name) }
        for i in sealed.indices {
            for bit in 0..<8 {
                var changed = sealed
                changed[i] ^= 1 << bit
                #expect(throws: (any Error).self, "byte \(i) bit \(bit)") { try sealer.open(changed, name: name) }
            }
        }
        // Two seals of the same bytes differ (fresh nonces) and both open.
        let a = try sealer.seal(plaintext, name: name), b = try sealer.seal(plaintext, name: name)
        #expect(a != b)
        #expect(try sealer.open(a, name: name) == plaintext && sealer.open(b, name: name) == plaintext)
        #expect(try sealer.open(sealer.seal([], name: name), name: name) == [])
    }

    /// A pack of two full blocks and a short one: golden bytes (their SHA-256), blocks
    /// opened alone as a ranged read does, and blocks dropped, moved or cut refused.
    @Test func anObjectOfSeveralBlocksOpensBlockByBlockAndOnlyInOrder() throws {
        let sealer = Sealer(Self.master)
        let name = "packs/ab/ab0123456789abcdef0123456789abcd"
        let plaintext = (0..<(2 * Sealer.blockSize + 10)).map { UInt8(($0 * 7 + 3) % 251) }
        let sealed = try sealer.seal(plaintext, name: name, nonce: Self.nonces)
        #expect(sealed.count == 131_169 && Int64(sealed.count) == Sealer.sealedSize(Int64(plaintext.count)))
        #expect(Self.hex(SHA256.hash(data: sealed)) == "67c0af24947713900d305acc6cee17ded19d80abfce96e577e176aa88083603d")
        #expect(try sealer.open(sealed, name: name) == plaintext)
        #expect(Sealer.plainSize(Int64(sealed.count)) == Int64(plaintext.count))

        let block = Sealer.blockSize + Sealer.overhead
        let second = Array(sealed[block..<(2 * block)]), third = Array(sealed[(2 * block)...])
        let opened = try sealer.open(second, name: name, firstBlock: 1)
        #expect(opened.plaintext == Array(plaintext[Sealer.blockSize..<(2 * Sealer.blockSize)]) && !opened.reachedEnd)
        let last = try sealer.open(second + third, name: name, firstBlock: 1)
        #expect(last.plaintext == Array(plaintext[Sealer.blockSize...]) && last.reachedEnd)
        // A block at another index, blocks swapped, the last dropped (whole), a full block
        // that claims to be the last, a block after the last:
        #expect(throws: CryptoFailure.notAuthentic(name)) { try sealer.open(second, name: name, firstBlock: 2) }
        #expect(throws: CryptoFailure.notAuthentic(name)) { try sealer.open(second + Array(sealed[..<block]) + third, name: name) }
        #expect(throws: CryptoFailure.notAuthentic(name)) { try sealer.open(Array(sealed[..<(2 * block)]), name: name) }
        var claimsLast = second
        claimsLast[0] = 1
        #expect(throws: CryptoFailure.notAuthentic(name)) { try sealer.open(claimsLast, name: name, firstBlock: 1) }
        #expect(throws: CryptoFailure.notAuthentic(name)) { try sealer.open(third + second, name: name, firstBlock: 2) }
        var unknown = third
        unknown[0] = 7
        #expect(throws: CryptoFailure.unknownVersion(name, 7)) { try sealer.open(unknown, name: name, firstBlock: 2) }
        #expect(try sealer.open([], name: name, firstBlock: 3) == ([], false), "a range past the end")
    }

    @Test func sizesAndRangesMapBetweenPlainAndSealed() {
        let b = Int64(Sealer.blockSize), o = Int64(Sealer.overhead)
        for plain: Int64 in [0, 1, b - 1, b, b + 1, 2 * b, 3 * b + 17] {
            #expect(Sealer.plainSize(Sealer.sealedSize(plain)) == plain, "\(plain)")
        }
        // No object is these sizes: shorter than a block's overhead, or an empty last block after a full one.
        for sealed: Int64 in [-1, 0, o - 1, b + o + o, b + o + 1] {
            #expect(Sealer.plainSize(sealed) == nil, "\(sealed)")
        }
        #expect(Sealer.sealedRange(of: 0..<1) == (0..<(b + o), 0))
        #expect(Sealer.sealedRange(of: (b - 1)..<(b + 1)) == (0..<(2 * (b + o)), 0))
        #expect(Sealer.sealedRange(of: b..<(2 * b)) == ((b + o)..<(2 * (b + o)), 1))
        #expect(Sealer.sealedRange(of: (2 * b + 5)..<(2 * b + 5)) == ((2 * (b + o))..<(2 * (b + o)), 2))
    }

    @Test func scryptMatchesRFC7914() throws {
        let cost = try #require(ScryptCost(n: 1024, r: 8, p: 16))
        let key = try cost.deriveKey(passphrase: Array("password".utf8), salt: Array("NaCl".utf8))
        #expect(Self.hex(key.withUnsafeBytes { Array($0) }) == "fdbabe1c9d3472007856e7190d01e9fe7c6ad7cbc8237830e77376634b373162")
    }

    @Test func aKeyFileIsItsGoldenTextAndOpensOnlyWithItsPassphrase() throws {
        let cost = try #require(ScryptCost(n: 1024, r: 8, p: 1))
        let passphrase = Array("correct horse battery staple".utf8)
        let file = try KeyFile.wrap(Self.master, passphrase: passphrase, cost: cost, salt: Array(0x10...0x1f),
                                    nonce: try AES.GCM.Nonce(data: Array(0xb0...0xbb)))
        let text = "ubiquity-key 1\nscrypt n=1024 r=8 p=1 salt=101112131415161718191a1b1c1d1e1f\n"
            + "key=01b0b1b2b3b4b5b6b7b8b9babb8ae7894f152b1de674fe635f3e5f9b252f512d8e5fc0e68a3573d2abb2baba9054fa7115957b0b8d34333e6d874f73c8\n"
        #expect(String(decoding: file.encoded, as: UTF8.self) == text)
        let parsed = try KeyFile(decoding: Array(text.utf8))
        #expect(parsed == file)
        #expect(try parsed.unwrap(passphrase: passphrase).bytes == Self.master.bytes)
        #expect(throws: CryptoFailure.wrongPassphrase) { try parsed.unwrap(passphrase: Array("Correct horse battery staple".utf8)) }
        // The cost and salt are authenticated: a file with a cheaper cost does not open.
        let cheaper = text.replacing("r=8", with: "r=4")
        #expect(throws: CryptoFailure.wrongPassphrase) { try KeyFile(decoding: Array(cheaper.utf8)).unwrap(passphrase: passphrase) }
        // A random salt and nonce each time: two files of one key and passphrase differ.
        let again = try KeyFile.wrap(Self.master, passphrase: passphrase, cost: cost)
        #expect(again.encoded != file.encoded)
        #expect(try again.unwrap(passphrase: passphrase).bytes == Self.master.bytes)
    }

    /// A key file comes from the backing store: every number and length is checked before
    /// scrypt allocates N·r·128 bytes or a slice is taken.
    @Test func hostileKeyFilesAreRefusedBeforeUse() {
        let good = "ubiquity-key 1\nscrypt n=1024 r=8 p=1 salt=101112131415161718191a1b1c1d1e1f\n"
            + "key=01b0b1b2b3b4b5b6b7b8b9babb8ae7894f152b1de674fe635f3e5f9b252f512d8e5fc0e68a3573d2abb2baba9054fa7115957b0b8d34333e6d874f73c8\n"
        let hostile = [
            "", "ubiquity-key 2\n", good.replacing("n=1024", with: "n=1000"),
            good.replacing("n=1024", with: "n=2097152"), good.replacing("n=1024", with: "n=-1024"),
            good.replacing("n=1024", with: "n=99999999999999999999999"),
            good.replacing("r=8", with: "r=0"), good.replacing("p=1", with: "p=17"),
            good.replacing("n=1024 r=8", with: "n=1048576 r=16"), // 2 GiB
            good.replacing("salt=1011", with: "salt=101"), good.replacing("salt=1011", with: "salt=zz11"),
            good.replacing("salt=101112131415161718191a1b1c1d1e1f", with: "salt=1011"),
            good.replacing(" p=1", with: " p=1 p=1"), good.replacing("key=01", with: "key="),
            good.replacing("key=01b0", with: "key=01b0b0"), good + "more\n", String(repeating: "x", count: 5000),
        ]
        for text in hostile {
            #expect(throws: (any Error).self, "\(text.prefix(80))") { try KeyFile(decoding: Array(text.utf8)) }
        }
    }

    @Test func tuningPicksTheLargestCostWithinTheTime() throws {
        // A clock that says the first derivation (N = 2^14) took 0.01 s: doubling fits
        // five times in 0.5 s (0.32 s at 2^19; 2^20 would take 0.64 s).
        var ticks = [0.0, 0.01]
        let cost = try ScryptCost.tuned(seconds: 0.5) { ticks.removeFirst() }
        #expect(cost == ScryptCost(n: 1 << 19, r: 8, p: 1))
        // A slow machine still gets at least 2^15.
        ticks = [0.0, 2.0]
        #expect(try ScryptCost.tuned(seconds: 0.5) { ticks.removeFirst() } == ScryptCost(n: 1 << 15, r: 8, p: 1))
    }
}
