import Testing
import TestSupport
import UbiquityStore

/// Device ids: exactly 16 lowercase hex digits in and out, and ordered as those digits
/// are (the conflict winner rule and the key-value stamps compare device ids as bytes).
@Suite struct DeviceIDTests {
    @Test func onlySixteenLowercaseHexDigitsParse() {
        for good in ["0123456789abcdef", "0000000000000000", "ffffffffffffffff", "00000000000000a1"] {
            #expect(DeviceID(hex: good)?.hex == good)
            #expect(DeviceID(hex: good)?.description == good)
        }
        for bad in ["", "0123456789ABCDEF", "0123456789abcde", "0123456789abcdef0", "+123456789abcdef", "0123456789abcdeg",
                    " 123456789abcdef", "d1", "0x23456789abcdef"] {
            #expect(DeviceID(hex: bad) == nil, "accepted \(bad)")
        }
    }

    @Test(arguments: [1, 2, 3] as [UInt64]) func orderIsTheOrderOfTheDigits(seed: UInt64) {
        var rng = SplitMix64(seed: seed)
        let digits = Array("0123456789abcdef")
        // Mostly 0s and 1s, so that long common prefixes and leading zeros come up.
        let texts = (0..<200).map { _ in
            String((0..<16).map { _ in digits[Int(rng.next() % 3 == 0 ? rng.next() % 16 : rng.next() % 2)] })
        }
        let ids = texts.map { DeviceID(hex: $0)! }
        #expect(ids.sorted().map(\.hex) == texts.sorted { $0.utf8.lexicographicallyPrecedes($1.utf8) }, "seed \(seed)")
    }

    @Test func newIdsAreSixteenDigitsAndDiffer() {
        let ids = (0..<1_000).map { _ in DeviceID.new() }
        #expect(Set(ids).count == ids.count)
        for id in ids { #expect(DeviceID(hex: id.hex) == id) }
    }
}
