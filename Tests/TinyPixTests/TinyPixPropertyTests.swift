import Testing
import TestSupport
import TinyPix

@Suite("Round-trip properties")
struct TinyPixPropertyTests {
    @Test("render then encode round-trips random pictures", arguments: testSeeds)
    func randomRoundTrip(seed: UInt64) throws {
        var rng = SplitMix64(seed: seed)
        for iteration in 0..<5_000 {
            let stored = randomBytes(count: 8, using: &rng)
            guard let grid = TinyPix.render(stored) else { Issue.record("seed \(seed), iteration \(iteration): render failed"); return }
            guard grid.count == TinyPix.gridSize,
                  encoded(grid) == stored,
                  encoded(stored) == stored
            else {
                Issue.record("round trip failed for \(stored) (seed \(seed), iteration \(iteration); replay with TINYPIX_SEED=\(seed))")
                return
            }
        }
    }

    @Test("all 256 values of each row round-trip", arguments: 0..<8)
    func everyValueOfOneRow(row: Int) throws {
        var stored = TinyPix.newPicture
        for value in 0...255 {
            stored[row] = UInt8(value)
            let grid = try #require(TinyPix.render(stored))
            #expect(encoded(grid) == stored, "row \(row), value \(value)")
            // The row reads as the byte in binary, high bit on the left.
            let line = grid[(row * 9)..<(row * 9 + 8)]
            let binary = String(value, radix: 2)
            let padded = String(repeating: "0", count: 8 - binary.count) + binary
            let expected = padded.map { $0 == "1" ? UInt8(ascii: "#") : UInt8(ascii: ".") }
            #expect(Array(line) == expected, "row \(row), value \(value)")
        }
    }

    @Test("8 raw bytes are stored as they are", arguments: testSeeds)
    func rawBytesPassThrough(seed: UInt64) {
        var rng = SplitMix64(seed: seed)
        for _ in 0..<2_000 {
            let raw = randomBytes(count: 8, using: &rng)
            guard encoded(raw) == raw else {
                Issue.record("raw \(raw) not passed through (replay with TINYPIX_SEED=\(seed))")
                return
            }
        }
    }
}
