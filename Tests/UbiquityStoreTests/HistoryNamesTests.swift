import Testing
import TestSupport
@testable import UbiquityStore

/// `HistoryNames` may answer "may have" when unsure, never "has none" where SQLite shows a
/// history: against a model of the paths with histories, under a small budget, with
/// directories too big to keep and directories known only from their parents' rows.
@Suite struct HistoryNamesTests {
    @Test func neverDeniesAHistoryThatIsThere() {
        let seed = replayableSeed(3, variable: "UBQ_HISTORY_NAMES_SEED", test: "neverDeniesAHistoryThatIsThere",
                                  filter: "HistoryNamesTests")
        var rng = SplitMix64(seed: seed)
        let directories = ["", "a", "a/b", "a/b/c", "a/d", "e", "e/f"]
        var shown: Set<String> = [] // the paths SQLite shows a history at
        var names = HistoryNames(budget: 120)
        var loaded: Set<String> = [] // directories read since the sets were last dropped
        var skipped = 0, tooBig = 0, derived = 0
        func path(_ directory: String, _ name: String) -> String { directory.isEmpty ? name : directory + "/" + name }
        // What `history_dirs` holds for a directory: each name at or above a history.
        func rows(_ directory: String) -> [(name: String, leaf: Bool, below: Bool)] {
            let prefix = directory.isEmpty ? "" : directory + "/"
            var found: [String: (leaf: Bool, below: Bool)] = [:]
            for p in shown where p.hasPrefix(prefix) {
                let rest = p.dropFirst(prefix.count)
                let name = String(rest.prefix { $0 != "/" })
                let deeper = name.count < rest.count
                found[name, default: (false, false)].leaf = found[name, default: (false, false)].leaf || !deeper
                found[name, default: (false, false)].below = found[name, default: (false, false)].below || deeper
            }
            return found.keys.sorted().map { (name: $0, leaf: found[$0]!.leaf, below: found[$0]!.below) }
        }
        for round in 0..<20_000 {
            let directory = directories[rng.int(0..<directories.count)]
            // Mostly file names; "b", "c", "d" and "f" are also directories above.
            let name = rng.int(0..<4) == 0 ? ["b", "c", "d", "f"][rng.int(0..<4)] : "n\(rng.int(0..<24))"
            switch rng.int(0..<10) {
            case 0: // a history placed (a fold, a sync step)
                shown.insert(path(directory, name))
                names.noteTaken(path(directory, name))
            case 1 where rng.int(0..<40) == 0: // a directory's histories all dropped (prune)
                shown = shown.filter { !$0.hasPrefix(path(directory, "")) }
            case 1: // one dropped: SQLite may forget it, the sets need not
                shown.remove(path(directory, name))
            case 2 where rng.int(0..<20) == 0:
                names.removeAll()
                loaded = []
            default: // a create asks
                let truth = shown.contains(path(directory, name))
                if let answer = names.mayHave(directory, name) {
                    #expect(answer || !truth, "seed \(seed), round \(round): \(path(directory, name)) denied")
                    if !answer {
                        skipped += 1
                        if !loaded.contains(directory) { derived += 1 }
                    }
                } else {
                    // As the store reads: from the nearest known directory down.
                    for way in names.unknownWayDown(to: directory) {
                        let all = rows(way)
                        names.load(way, all)
                        loaded.insert(way)
                        if all.count > names.perDirectory { tooBig += 1 }
                        if let answer = names.mayHave(directory, name) {
                            #expect(answer || !truth, "seed \(seed), round \(round): \(path(directory, name)) denied after a read")
                            break
                        }
                    }
                }
            }
        }
        print("HistoryNamesTests seed \(seed): \(skipped) queries skipped (\(derived) in directories known from their parents), \(tooBig) directories too big to keep")
        #expect(skipped > 500 && derived > 0 && tooBig > 0,
                "seed \(seed): the run must skip queries, know directories from their parents and meet big directories")
    }

    /// A new tree's directories are known from the names read above them: no read each.
    @Test func aNewTreeIsKnownFromItsParentsNames() {
        var names = HistoryNames()
        #expect(names.mayHave("", "x") == nil)
        #expect(names.unknownWayDown(to: "new/deeper") == ["", "new", "new/deeper"])
        names.load("", [(name: "old", leaf: false, below: true), (name: "f", leaf: true, below: false)])
        #expect(names.mayHave("new", "x") == false)
        #expect(names.mayHave("new/deeper/still", "x") == false, "from the nearest known directory")
        #expect(names.mayHave("old", "x") == nil, "histories below it: read")
        #expect(names.unknownWayDown(to: "old/a/b") == ["old", "old/a", "old/a/b"])
        #expect(names.mayHave("f", "x") == false, "a history at the name, none below it")
        names.noteTaken("new/deeper/placed/g")
        #expect(names.mayHave("new/deeper", "placed") == false, "a directory, not a history")
        #expect(names.mayHave("new/deeper/placed", "g") == true, "placed below since")
        #expect(names.mayHave("new/other", "x") == false)
    }
}
