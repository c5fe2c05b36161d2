import Testing
import TestSupport
@testable import UbiquityStore

/// `HistoryNames` may answer "may have" when unsure, never "has none" where SQLite shows a
/// history: against a model of the names with histories, under a small budget, with
/// directories too big to keep.
@Suite struct HistoryNamesTests {
    @Test func neverDeniesAHistoryThatIsThere() {
        let seed = replayableSeed(3, variable: "UBQ_HISTORY_NAMES_SEED", test: "neverDeniesAHistoryThatIsThere",
                                  filter: "HistoryNamesTests")
        var rng = SplitMix64(seed: seed)
        let directories = ["", "a", "a/b", "c"]
        var shown: [String: Set<String>] = [:] // directory -> names with a history in "SQLite"
        var names = HistoryNames(budget: 160)
        var skipped = 0, tooBig = 0
        for round in 0..<20_000 {
            let directory = directories[rng.int(0..<directories.count)]
            let name = "n\(rng.int(0..<24))"
            switch rng.int(0..<10) {
            case 0, 1: // a history placed (a fold, a sync step)
                shown[directory, default: []].insert(name)
                names.noteTaken(directory.isEmpty ? name : directory + "/" + name)
            case 2: // one dropped: SQLite may forget it, the sets need not
                shown[directory]?.remove(name)
            case 3 where rng.int(0..<20) == 0:
                names.removeAll()
            default: // a create asks
                let truth = shown[directory]?.contains(name) == true
                if let answer = names.mayHave(directory, name) {
                    #expect(answer || !truth, "seed \(seed), round \(round): \(directory)/\(name) denied")
                    if !answer { skipped += 1 }
                } else {
                    let all = (shown[directory] ?? []).sorted()
                    names.load(directory, all)
                    if all.count > names.perDirectory {
                        tooBig += 1
                        #expect(names.mayHave(directory, name) == true, "seed \(seed): a directory too big to keep")
                    }
                }
            }
        }
        print("HistoryNamesTests seed \(seed): \(skipped) queries skipped, \(tooBig) directories too big to keep")
        #expect(skipped > 500 && tooBig > 0, "seed \(seed): the run must skip queries and meet big directories")
    }
}
