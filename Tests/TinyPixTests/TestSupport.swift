#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

import TestSupport
import TinyPix

/// The seeds randomized tests run with: two fixed ones plus one fresh per run.
/// Set TINYPIX_SEED=<n> to replay the seed a failure message printed.
let testSeeds: [UInt64] = {
    if let seed = environment("TINYPIX_SEED").flatMap({ UInt64($0) }) {
        return [seed]
    }
    return [1, 0x5EED_7157_7E57_0001, UInt64.random(in: .min ... .max)]
}()

func utf8(_ text: String) -> [UInt8] { Array(text.utf8) }

func randomBytes(count: Int, using rng: inout SplitMix64) -> [UInt8] {
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
