import Testing
import UbiquitySystem
import TestSupport
@testable import UbiquityStore

/// The retention policy, with an injected clock: exactly what it keeps.
@Suite struct RetentionTests {
    static let h = RetentionPolicy.hour, d = RetentionPolicy.day
    /// A fixed "now" on a week boundary, so the expected buckets are easy to read.
    static let now: Nanos = 3_000 * RetentionPolicy.week

    static func kept(_ ages: [Nanos], policy: RetentionPolicy = .standard, deletedAgo: Nanos? = nil,
                     protected: Set<Int64> = []) -> [Nanos] {
        let candidates = ages.enumerated().map { RetentionPolicy.Candidate(row: Int64($0.offset), committed: now - $0.element) }
        let pruned = Set(policy.prunable(candidates, now: now, deletedAt: deletedAgo.map { now - $0 }, protected: protected))
        return ages.enumerated().filter { !pruned.contains(Int64($0.offset)) }.map(\.element)
    }

    @Test func everythingYoungerThanADayIsKept() {
        let ages = (0..<100).map { Nanos($0) * 10 * 60 * 1_000_000_000 / 5 } // every 2 minutes, 3.3 hours
        #expect(Self.kept(ages) == ages)
    }

    @Test func thenOnePerHourThenPerDayThenPerWeek() {
        // Every 20 minutes for 200 days.
        let ages = (0..<(200 * 72)).map { Nanos($0) * 20 * 60 * 1_000_000_000 }
        let kept = Self.kept(ages)
        let young = kept.filter { $0 < Self.d }
        let hourly = kept.filter { $0 >= Self.d && $0 < 7 * Self.d }
        let daily = kept.filter { $0 >= 7 * Self.d && $0 < 90 * Self.d }
        let weekly = kept.filter { $0 >= 90 * Self.d }
        #expect(young.count == 72)
        // Buckets are clock hours (days, weeks): with "now" on the hour, the versions of
        // ages (k h, (k + 1) h] share one. The one at exactly 24 h is its bucket's only
        // version past the first day, so one more than 6 × 24.
        #expect(hourly.count == 6 * 24 + 1)
        #expect(daily.count == 83 + 1)
        #expect((15...17).contains(weekly.count)) // days 90...199: about 110 / 7
        // The one kept in a bucket is its newest.
        for hour in 24..<(7 * 24 - 1) { // (the last: its version at exactly 7 d is in the daily part)
            let inBucket = ages.filter { $0 > Nanos(hour) * Self.h && $0 <= Nanos(hour + 1) * Self.h }
            #expect(kept.filter { inBucket.contains($0) } == [inBucket.min()!], "hour \(hour)")
        }
    }

    @Test func protectedVersionsAreKeptAndFillTheirBucket() {
        let ages: [Nanos] = [3 * Self.h + 2 * 60_000_000_000, 3 * Self.h + 60_000_000_000, 30 * Self.h + 1, 30 * Self.h + 2]
        // Row 3 (the oldest of the 30 h bucket) is protected: it is kept, and it is the
        // bucket's one.
        #expect(Self.kept(ages, protected: [3]) == [ages[0], ages[1], ages[3]])
    }

    @Test func deletedHistoriesGoAfterTheirWindow() {
        let ages: [Nanos] = [2 * Self.d, 3 * Self.d, 40 * Self.d]
        #expect(Self.kept(ages, deletedAgo: 10 * Self.d) == [2 * Self.d, 3 * Self.d, 40 * Self.d])
        #expect(Self.kept(ages, deletedAgo: 31 * Self.d) == [])
        #expect(Self.kept(ages, deletedAgo: 31 * Self.d, protected: [0]) == [2 * Self.d])
    }

    @Test func keepEverythingKeepsEverything() {
        let ages = (0..<500).map { Nanos($0) * Self.d }
        #expect(Self.kept(ages, policy: .everything) == ages)
    }

    @Test func extremeTimesDoNotOverflow() {
        var policy = RetentionPolicy()
        policy.keepAll = .max
        let candidates = [RetentionPolicy.Candidate(row: 1, committed: .min), RetentionPolicy.Candidate(row: 2, committed: .max)]
        #expect(policy.prunable(candidates, now: .max, deletedAt: .min, protected: []).sorted() == [1, 2])
        #expect(RetentionPolicy.standard.prunable(candidates, now: .min, deletedAt: nil, protected: []).isEmpty)
    }

    @Test func configurationFile() throws {
        let policy = try RetentionPolicy(configuration: """
            # mine
            keep-all-within = 2d   # two days
            hourly-within = 2w
            daily-within=365d
            weekly = no
            keep-deleted-within = 1s
            """)
        #expect(policy.keepAll == 2 * Self.d && policy.hourlyUntil == 14 * Self.d && policy.dailyUntil == 365 * Self.d)
        #expect(!policy.weekly && policy.keepDeleted == 1_000_000_000 && !policy.keepEverything)
        #expect(try RetentionPolicy(configuration: "keep = everything").keepEverything)
        for bad in ["keep-all = 2d", "keep-all-within = 2 days", "keep-all-within", "weekly = maybe",
                    "keep-all-within = 99999999999999999w", "keep = most"] {
            #expect(throws: StoreError.self, "\(bad)") { try RetentionPolicy(configuration: bad) }
        }
        #expect(RetentionPolicy.duration("90d") == 90 * Self.d)
        #expect(RetentionPolicy.duration("-1d") == nil)
    }

    /// The saturating helpers that space pressure and gc use on outside numbers.
    @Test func clampedArithmetic() {
        #expect(Int64.max.addingClamped(1) == .max && Int64.min.addingClamped(-1) == .min && Int64(2).addingClamped(3) == 5)
        #expect(Int64.min.subtractingClamped(1) == .min && Int64.max.subtractingClamped(-1) == .max && Int64(2).subtractingClamped(3) == -1)
        #expect(Int64.max.multipliedClamped(by: 2) == .max && Int64.max.multipliedClamped(by: -2) == .min && Int64(512).multipliedClamped(by: 8) == 4096)
    }

    @Test func sizeSettings() throws {
        let policy = try RetentionPolicy(configuration: "size-limit = 10G\nmin-free = 5%")
        #expect(policy.sizeLimit == 10 << 30 && policy.minFree == .percent(5))
        #expect(policy.minFree.bytes(ofFilesystem: 1_000) == 50)
        #expect(try RetentionPolicy(configuration: "min-free = 512M").minFree == .bytes(512 << 20))
        #expect(try RetentionPolicy(configuration: "size-limit = none").sizeLimit == nil)
        #expect(RetentionPolicy.standard.sizeLimit == nil && RetentionPolicy.standard.minFree == .percent(2))
        for bad in ["size-limit = 10 GB", "size-limit = -1G", "size-limit = 99999999999T", "min-free = 80%", "min-free = lots"] {
            #expect(throws: StoreError.self, "\(bad)") { try RetentionPolicy(configuration: bad) }
        }
    }
}
