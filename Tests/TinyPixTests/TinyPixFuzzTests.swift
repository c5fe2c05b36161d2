import Testing
import TestSupport
import TinyPix

@Suite("Fuzz: encode is total")
struct TinyPixFuzzTests {
    /// Checks what encode said about `input`; returns a complaint or nil.
    func check(_ input: [UInt8]) -> String? {
        switch TinyPix.encode(input) {
        case .success(let stored):
            guard stored.count == 8 else { return "accepted but gave \(stored.count) bytes" }
            if input.count == 8 && stored != input { return "raw bytes changed" }
            guard let grid = TinyPix.render(stored) else { return "cannot render the result" }
            guard encoded(grid) == stored else { return "re-render does not encode to the same bytes" }
            return nil
        case .failure(let error):
            if input.count == 8 { return "8 raw bytes refused" }
            if error.description.isEmpty { return "empty error message" }
            if let line = error.line, !(1...8).contains(line) { return "line \(line) out of range" }
            if let column = error.column, column < 1 { return "column \(column) out of range" }
            return nil
        }
    }

    @Test("random byte strings never crash", arguments: testSeeds)
    func randomByteStrings(seed: UInt64) {
        var rng = SplitMix64(seed: seed)
        for iteration in 0..<5_000 {
            let input = randomBytes(count: Int.random(in: 0...200, using: &rng), using: &rng)
            if let complaint = check(input) {
                Issue.record("\(complaint) for \(input) (seed \(seed), iteration \(iteration); replay with TINYPIX_SEED=\(seed))")
                return
            }
        }
    }

    @Test("random text-like strings never crash", arguments: testSeeds)
    func randomTextLike(seed: UInt64) {
        var rng = SplitMix64(seed: seed)
        let alphabet = utf8("#.Xx1*0-_ \t\r\n\n\nQ") + [0x00, 0xC3, 0xA9, 0xFF]
        for iteration in 0..<5_000 {
            let count = Int.random(in: 0...200, using: &rng)
            let input = (0..<count).map { _ in alphabet.randomElement(using: &rng)! }
            if let complaint = check(input) {
                Issue.record("\(complaint) for \(input) (seed \(seed), iteration \(iteration); replay with TINYPIX_SEED=\(seed))")
                return
            }
        }
    }

    @Test("mutated grids never crash; accepted ones round-trip", arguments: testSeeds)
    func mutatedGrids(seed: UInt64) throws {
        var rng = SplitMix64(seed: seed)
        let interesting = utf8("#.Xx1*0-_ \t\r\n") + [0x00, 0x7F, 0x80, 0xC3, 0xE2, 0xFF]
        var accepted = 0
        for iteration in 0..<5_000 {
            let stored = randomBytes(count: 8, using: &rng)
            guard var input = TinyPix.render(stored) else { Issue.record("render failed for \(stored)"); return }
            for _ in 0..<Int.random(in: 1...4, using: &rng) {
                let byte = Bool.random(using: &rng)
                    ? interesting.randomElement(using: &rng)!
                    : UInt8.random(in: .min ... .max, using: &rng)
                let index = Int.random(in: 0...input.count, using: &rng)
                switch Int.random(in: 0..<4, using: &rng) {
                case 0 where index < input.count: input[index] = byte
                case 1: input.insert(byte, at: index)
                case 2 where index < input.count: input.remove(at: index)
                default: input.append(byte)
                }
            }
            if let complaint = check(input) {
                Issue.record("\(complaint) for \(input) (seed \(seed), iteration \(iteration); replay with TINYPIX_SEED=\(seed))")
                return
            }
            if encoded(input) != nil { accepted += 1 }
        }
        #expect(accepted > 0, "some mutations should still be valid grids (seed \(seed))")
    }

    @Test func hugeInputs() {
        let megabyte = 1 << 20
        #expect(encodeError([UInt8](repeating: UInt8(ascii: "#"), count: megabyte))?.description
            == "line 1 has \(megabyte) cells, expected 8")
        #expect(encodeError([UInt8](repeating: UInt8(ascii: "\n"), count: megabyte))?.description
            == "expected 8 lines, found 0")
        let manyRows = [UInt8](String(repeating: "#.#.#.#.\n", count: 100_000).utf8)
        #expect(encodeError(manyRows)?.description == "expected 8 lines, found 100000")
        let trailingSpaces = utf8(smileyGrid) + [UInt8](repeating: UInt8(ascii: " "), count: megabyte)
        #expect(encoded(trailingSpaces) == smileyBytes)
        let binary = (0..<megabyte).map { UInt8(truncatingIfNeeded: $0 &* 2_654_435_761 >> 7) }
        #expect(encodeError(binary) != nil)
    }

    @Test func everyShortLength() {
        for length in 0...80 {
            let input = [UInt8](utf8(smileyGrid + smileyGrid).prefix(length))
            #expect(check(input) == nil, "length \(length)")
        }
    }
}
