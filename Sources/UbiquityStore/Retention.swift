/// Which versions of a history to keep, in the spirit of Time Machine and Syncthing's
/// staggered versioning: every version for a while, then one per hour, one per day, one
/// per week. Current versions and unresolved conflict versions are never pruned (the
/// caller passes them as `protected`), nor are versions not yet uploaded.
public struct RetentionPolicy: Sendable, Equatable {
    public static let hour: Nanos = 3_600 * 1_000_000_000
    public static let day: Nanos = 24 * hour
    public static let week: Nanos = 7 * day

    /// Every version younger than this is kept.
    public var keepAll: Nanos = day
    /// Then one per hour up to this age,
    public var hourlyUntil: Nanos = week
    /// then one per day up to this age,
    public var dailyUntil: Nanos = 90 * day
    /// then one per week (nil: none older than `dailyUntil`).
    public var weekly = true
    /// A deleted file's history is kept (as above) at least this long after the deletion;
    /// after it, all of it goes.
    public var keepDeleted: Nanos = 30 * day
    /// Keep every version forever (prune does nothing).
    public var keepEverything = false
    /// Space pressure (FileSystem+Space): when the store grows past this many bytes, or
    /// its filesystem's free space falls under `minFree`, history goes oldest-first
    /// (even versions the staggering keeps, never current or conflict versions).
    public var sizeLimit: Int64?
    public var minFree: SpaceAmount = .percent(2)

    /// An amount of disk space: bytes, or a percentage of the filesystem.
    public enum SpaceAmount: Sendable, Equatable {
        case bytes(Int64)
        case percent(Int)

        public func bytes(ofFilesystem total: Int64) -> Int64 {
            switch self {
            case .bytes(let b): return b
            case .percent(let p): return total / 100 * Int64(p)
            }
        }
    }

    /// "10G", "500M", "64K", "1T" (powers of 1024) or plain bytes; nil when it is none of these.
    public static func size(_ text: String) -> Int64? {
        let units: [Character: Int64] = ["K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40]
        if let amount = Int64(text), amount >= 0 { return amount }
        guard let unit = text.last.flatMap({ units[Character($0.uppercased())] }), let amount = Int64(text.dropLast()), amount >= 0 else { return nil }
        let (value, overflow) = amount.multipliedReportingOverflow(by: unit)
        return overflow ? nil : value
    }

    public init() {}

    /// `--keep-within` and `--keep-deleted-within` of `ubiquity prune`, for one run: keep
    /// every version younger than `keepWithin` and none older; keep a deleted file's
    /// history `keepDeletedWithin`.
    public mutating func apply(keepWithin: Nanos?, keepDeletedWithin: Nanos?) {
        if let d = keepWithin {
            keepAll = d; hourlyUntil = d; dailyUntil = d; weekly = false; keepEverything = false
        }
        if let d = keepDeletedWithin { keepDeleted = d }
    }

    /// The default policy, or "keep everything".
    public static let standard = RetentionPolicy()
    public static var everything: RetentionPolicy {
        var p = RetentionPolicy()
        p.keepEverything = true
        return p
    }

    /// A version of a history, as the policy sees it.
    public struct Candidate: Sendable, Equatable {
        public var row: Int64
        public var committed: Nanos
        public init(row: Int64, committed: Nanos) { self.row = row; self.committed = committed }
    }

    /// The rows of `versions` (one history's) to prune at time `now`. `deletedAt`: when
    /// the file was deleted (nil: it is live). `protected` rows are always kept.
    public func prunable(_ versions: [Candidate], now: Nanos, deletedAt: Nanos?, protected: Set<Int64>) -> [Int64] {
        if keepEverything { return [] }
        if let deletedAt, Self.age(deletedAt, now: now) > keepDeleted {
            return versions.map(\.row).filter { !protected.contains($0) }
        }
        // A protected version is kept anyway: it is its bucket's one. Of the others, newest
        // first, the first in a bucket is kept.
        func bucket(_ v: Candidate) -> Int64? {
            let age = Self.age(v.committed, now: now)
            if age < keepAll { return nil } // keep
            if age < hourlyUntil { return Self.bucket(v.committed, Self.hour) * 4 + 1 }
            if age < dailyUntil { return Self.bucket(v.committed, Self.day) * 4 + 2 }
            return weekly ? Self.bucket(v.committed, Self.week) * 4 + 3 : -1 // -1: too old to keep any
        }
        var kept: Set<Int64> = []
        for v in versions where protected.contains(v.row) { if let b = bucket(v) { kept.insert(b) } }
        var prune: [Int64] = []
        for v in versions.sorted(by: { ($0.committed, $0.row) > ($1.committed, $1.row) }) where !protected.contains(v.row) {
            guard let b = bucket(v) else { continue }
            if b != -1 && kept.insert(b).inserted { continue }
            prune.append(v.row)
        }
        return prune
    }

    /// How long before `now` `time` was (0 for the future; no overflow for any values).
    public static func age(_ time: Nanos, now: Nanos) -> Nanos {
        let (age, overflow) = now.subtractingReportingOverflow(time)
        if overflow { return time > now ? 0 : .max }
        return max(0, age)
    }

    /// The index of the period of length `size` that `time` falls in (floor division).
    private static func bucket(_ time: Nanos, _ size: Nanos) -> Int64 {
        time >= 0 ? time / size : (time + 1) / size - 1
    }
}

extension RetentionPolicy {
    /// Parses a duration: a whole number and a unit, `s` `m` `h` `d` `w` (`90d`, `1s`,
    /// `24h`); nil for anything else or an amount too large to hold.
    public static func duration(_ text: String) -> Nanos? {
        let units: [Character: Nanos] = ["s": 1_000_000_000, "m": 60_000_000_000, "h": hour, "d": day, "w": week]
        guard let unit = text.last, let size = units[unit], let amount = Int64(text.dropLast()), amount >= 0 else { return nil }
        let (value, overflow) = amount.multipliedReportingOverflow(by: size)
        return overflow ? nil : value
    }

    /// A duration as `duration` reads it, in the largest unit that divides it ("1h",
    /// "90s", "2w"); nanoseconds that are not whole seconds round down.
    public static func durationText(_ nanos: Nanos) -> String {
        let units: [(String, Nanos)] = [("w", week), ("d", day), ("h", hour), ("m", 60_000_000_000), ("s", 1_000_000_000)]
        let seconds = max(nanos, 0) / 1_000_000_000 * 1_000_000_000
        for (name, size) in units where seconds >= size && seconds % size == 0 { return "\(seconds / size)\(name)" }
        return "\(seconds / 1_000_000_000)s"
    }

    /// Reads a policy from the text of a retention file (README, "Versions and retention"):
    /// `key = value` lines, `#` comments. Unknown keys and bad values are errors naming the
    /// line, so a typo never silently keeps (or drops) history.
    public init(configuration text: String) throws(StoreError) {
        self.init()
        for setting in try configurationSettings(text) { try set(setting.key, setting.value, line: setting.line) }
    }

    /// Applies one setting (a configuration line or a mount option).
    public mutating func set(_ key: String, _ value: String, line: Int? = nil) throws(StoreError) {
        let place = line.map { "line \($0): " } ?? ""
        func time() throws(StoreError) -> Nanos {
            guard let d = Self.duration(value) else {
                throw .invalidConfiguration("\(place)\(key): `\(value)` is not a duration (like 30s, 24h, 7d, 2w)")
            }
            return d
        }
        func pick(_ choices: [String: Bool]) throws(StoreError) -> Bool {
            guard let choice = choices[value] else {
                let names = choices.keys.sorted().map { "`\($0)`" }.joined(separator: " or ")
                throw .invalidConfiguration("\(place)\(key): `\(value)` is not \(names)")
            }
            return choice
        }
        switch key {
        case "keep": keepEverything = try pick(["everything": true, "staggered": false])
        case "keep-all-within": keepAll = try time()
        case "hourly-within": hourlyUntil = try time()
        case "daily-within": dailyUntil = try time()
        case "weekly": weekly = try pick(["yes": true, "no": false])
        case "keep-deleted-within": keepDeleted = try time()
        case "size-limit":
            if value == "none" { sizeLimit = nil; break }
            guard let size = Self.size(value) else { throw .invalidConfiguration("\(place)\(key): `\(value)` is not a size (like 500M, 10G) or `none`") }
            sizeLimit = size
        case "min-free":
            if value.hasSuffix("%"), let p = Int(value.dropLast()), (0...50).contains(p) {
                minFree = .percent(p)
            } else if let size = Self.size(value) {
                minFree = .bytes(size)
            } else {
                throw .invalidConfiguration("\(place)\(key): `\(value)` is not a size (like 1G) or a percentage from 0% to 50%")
            }
        default:
            throw .invalidConfiguration("\(place)unknown setting `\(key)` (known: keep, keep-all-within, hourly-within, daily-within, weekly, keep-deleted-within, size-limit, min-free)")
        }
    }
}

