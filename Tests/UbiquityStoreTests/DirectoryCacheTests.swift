import Testing
import TestSupport
@testable import UbiquityStore

/// `DirectoryCache` against a model: seeded random loads, puts, removes, drops and
/// lookups under small budgets. A directory it answers for must answer as the model
/// does, and the names it holds stay within its budget.
@Suite struct DirectoryCacheTests {
    @Test(arguments: [1, 2, 3] as [UInt64])
    func answersAsTheModelWithinItsBudget(seed given: UInt64) {
        let seed = replayableSeed(given, variable: "UBQ_DIRECTORY_CACHE_SEED", test: "answersAsTheModelWithinItsBudget",
                                  filter: "DirectoryCacheTests")
        var rng = SplitMix64(seed: seed)
        let budget = 16 + rng.int(0..<200)
        var cache = DirectoryCache(budget: budget)
        var model: [InodeNumber: DirectoryCache.Names] = [:]
        let directories = (1...12).map { InodeNumber(rawValue: UInt64($0)) }
        var answered = 0
        for step in 0..<20_000 {
            let dir = directories[rng.int(0..<directories.count)]
            let name = NameKey("n\(rng.int(0..<40))")
            switch rng.int(0..<10) {
            case 0:
                cache.load(dir, model[dir] ?? [:])
            case 1, 2:
                let id = InodeNumber(rawValue: UInt64(100 + rng.int(0..<1000)))
                model[dir, default: [:]][name] = id
                cache.put(dir, name, id)
            case 3:
                model[dir]?[name] = nil
                cache.remove(dir, name)
            case 4 where rng.int(0..<10) == 0:
                model[dir] = nil
                cache.drop(dir)
            default:
                if let known = cache.lookUp(dir, name) {
                    answered += 1
                    #expect(known == model[dir]?[name], "seed \(seed), step \(step): \(name.name) in \(dir)")
                    #expect(cache.count(dir) == (model[dir] ?? [:]).count, "seed \(seed), step \(step): count of \(dir)")
                }
            }
            #expect(cache.names <= budget + budget / 4, "seed \(seed), step \(step): \(cache.names) names held, budget \(budget)")
        }
        print("DirectoryCacheTests seed \(seed): budget \(budget), \(answered) lookups answered from memory")
        #expect(answered > 1000, "seed \(seed): the cache answered \(answered) lookups")
    }

    /// A directory of more than an eighth of the budget is not loaded, and says so.
    @Test func aBigDirectoryIsNotLoaded() {
        var cache = DirectoryCache(budget: 80)
        let big = Dictionary(uniqueKeysWithValues: (0..<11).map { (NameKey("n\($0)"), InodeNumber(rawValue: UInt64(100 + $0))) })
        cache.load(InodeNumber(rawValue: 7), big)
        #expect(cache.lookUp(InodeNumber(rawValue: 7), NameKey("n1")) == nil)
        #expect(cache.isTooBig(InodeNumber(rawValue: 7)))
        cache.load(InodeNumber(rawValue: 8), Dictionary(uniqueKeysWithValues: big.prefix(10).map { ($0.key, $0.value) }))
        #expect(cache.count(InodeNumber(rawValue: 8)) == 10)
    }
}
