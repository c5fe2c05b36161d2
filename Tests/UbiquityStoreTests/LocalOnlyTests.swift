import Testing
import TestSupport
@testable import UbiquityStore

/// `LocalOnly.contains` compares UTF-8 bytes; it must decide every path as the rule reads
/// in words: a component ending in `.nosync`, or a last component that is an editor's
/// scratch name.
@Suite struct LocalOnlyTests {
    static func byTheWords(_ path: String) -> Bool {
        let components = path.split(separator: "/")
        if components.contains(where: { $0.hasSuffix(".nosync") }) { return true }
        guard let name = components.last else { return false }
        return name.hasSuffix(".swp") || name.hasSuffix(".swx") || name.hasSuffix("~") || name.hasPrefix(".#")
            || name == "4913" || name.hasPrefix(".goutputstream-")
    }

    @Test func knownPaths() {
        for path in ["a/.b.swp", "x.nosync/y", "a/b.nosync", "4913", "d/4913", "n~", ".#lock", "a/.goutputstream-XYZ", "v.swx"] {
            #expect(LocalOnly.contains(path), "\(path)")
        }
        for path in ["", "/", "a", "a.swp/b", "49130", "a/.swp.txt", "nosync", "x.nosyncs/y", ".goutputstream", "#.", "a~/b"] {
            #expect(!LocalOnly.contains(path), "\(path)")
        }
    }

    @Test func agreesWithTheRuleOnRandomPaths() {
        let seed = replayableSeed(11, variable: "UBQ_LOCAL_SEED", test: "agreesWithTheRuleOnRandomPaths", filter: "LocalOnlyTests")
        var rng = SplitMix64(seed: seed)
        let pieces = ["a", "\u{e9}", "e\u{301}", ".swp", ".swx", "~", ".#", "4913", ".goutputstream-", ".nosync", "/", "/", "sw", "p", "."]
        for _ in 0..<20_000 {
            let path = (0..<rng.int(0..<6)).map { _ in pieces[rng.int(0..<pieces.count)] }.joined()
            #expect(LocalOnly.contains(path) == Self.byTheWords(path), "seed \(seed): \(String(reflecting: path))")
        }
    }
}
