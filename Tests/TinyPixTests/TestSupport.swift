#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

import TinyPix

/// SplitMix64: a small, fast, seedable generator so failures can be replayed.
struct SeededGenerator: RandomNumberGenerator {
    private var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// The seeds randomized tests run with: two fixed ones plus one fresh per run.
/// Set TINYPIX_SEED=<n> to replay the seed a failure message printed.
let testSeeds: [UInt64] = {
    if let text = getenv("TINYPIX_SEED").map({ String(cString: $0) }), let seed = UInt64(text) {
        return [seed]
    }
    return [1, 0x5EED_7157_7E57_0001, UInt64.random(in: .min ... .max)]
}()

func utf8(_ text: String) -> [UInt8] { Array(text.utf8) }

func randomBytes(count: Int, using rng: inout SeededGenerator) -> [UInt8] {
    (0..<count).map { _ in UInt8.random(in: .min ... .max, using: &rng) }
}

/// The error of an encode, or nil if it succeeded.
func encodeError(_ written: [UInt8]) -> TinyPixError? {
    if case .failure(let error) = TinyPix.encode(written) { return error }
    return nil
}

func encodeError(_ text: String) -> TinyPixError? { encodeError(utf8(text)) }

/// The encoded bytes, or nil if encode failed.
func encoded(_ written: [UInt8]) -> [UInt8]? { try? TinyPix.encode(written).get() }

func encoded(_ text: String) -> [UInt8]? { encoded(utf8(text)) }

let diagonalGrid = """
    .......#
    ......#.
    .....#..
    ....#...
    ...#....
    ..#.....
    .#......
    #.......

    """

let smileyGrid = """
    ..####..
    .#....#.
    #.#..#.#
    #......#
    #.#..#.#
    #..##..#
    .#....#.
    ..####..

    """

let smileyBytes: [UInt8] = [0x3C, 0x42, 0xA5, 0x81, 0xA5, 0x99, 0x42, 0x3C]
