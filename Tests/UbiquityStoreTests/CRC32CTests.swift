import Testing
import TestSupport
import UbiquitySystem

/// CRC-32C against its standard check value, published vectors (RFC 3720, B.4), and a
/// bit-at-a-time reference over random buffers split at random points (the word loop
/// and the byte loop must agree wherever a buffer starts and ends).
@Suite struct CRC32CTests {
    @Test func knownValues() {
        #expect(CRC32C.checksum("123456789".utf8) == CRC32C.checkValue)
        #expect(CRC32C.checksum([UInt8](repeating: 0, count: 32)) == 0x8A91_36AA)
        #expect(CRC32C.checksum([UInt8](repeating: 0xff, count: 32)) == 0x62A8_AB43)
        #expect(CRC32C.checksum((0..<32).map { UInt8($0) }) == 0x46DD_794E)
        #expect(CRC32C.checksum([UInt8]()) == 0)
    }

    @Test(arguments: [1, UInt64.random(in: 2...UInt64.max)])
    func agreesWithABitAtATimeReference(seed: UInt64) {
        print("CRC32CTests seed \(seed)")
        var rng = SplitMix64(seed: seed)
        for _ in 0..<300 {
            let bytes = (0..<rng.int(0..<200)).map { _ in UInt8(rng.int(0..<256)) }
            var reference: UInt32 = 0xFFFF_FFFF
            for byte in bytes {
                reference ^= UInt32(byte)
                for _ in 0..<8 { reference = reference & 1 != 0 ? (reference >> 1) ^ 0x82F6_3B78 : reference >> 1 }
            }
            let cut = rng.int(0..<bytes.count + 1)
            let split = bytes[..<cut].withUnsafeBytes { a in bytes[cut...].withUnsafeBytes { b in CRC32C.checksum(a, b) } }
            #expect(split == ~reference, "seed \(seed): \(bytes.count) bytes cut at \(cut)")
        }
    }
}
