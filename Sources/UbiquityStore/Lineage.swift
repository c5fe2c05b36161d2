import UbiquitySystem

/// Which records a record supersedes, so that it still supersedes them when the records
/// between them have been pruned (backing format 4, docs/FORMAT.md "Lineage").
///
/// Parents alone cannot do that: a device that holds an old version of a file and
/// missed the later ones meets the newest record naming a parent it never gets (pruned
/// by its author), and would show the old version as a conflict. So each record made by
/// format 4 carries a *dot*, (its device, a counter that device increases for each record
/// of the node it makes), and its *context*: the set of dots of every record it descends
/// from. A record supersedes another of its node whose dot is in its context. The
/// context is kept small as, per device, the highest counter plus the ranges below it
/// that it does not contain (a device's records of one node on other branches: the
/// "dotted version vectors" of Preguiça et al. with exceptions as ranges).
public struct Lineage: Sendable, Equatable {
    /// The record's own counter (its device is the record's); 0: none.
    public var dot: Int64 = 0
    /// Per device: the highest counter in the context, and the ranges of counters below it
    /// not in it, sorted and disjoint.
    public var context: [DeviceID: Entry] = [:]

    public struct Entry: Sendable, Equatable {
        public var max: Int64
        public var missing: [ClosedRange<Int64>] = []
        public init(max: Int64, missing: [ClosedRange<Int64>] = []) {
            self.max = max
            self.missing = missing
        }
    }

    public init() {}

    /// Records from before format 4 carry none.
    public var isEmpty: Bool { dot == 0 }

    /// Whether the context holds the dot.
    public func contains(device: DeviceID, counter: Int64) -> Bool {
        guard counter > 0, let entry = context[device], counter <= entry.max else { return false }
        return !entry.missing.contains { $0.contains(counter) }
    }

    /// Adds a dot to the context.
    public mutating func insert(device: DeviceID, counter: Int64) {
        guard counter > 0 else { return }
        var entry = context[device] ?? Entry(max: 0)
        if counter > entry.max {
            if counter > entry.max + 1 { entry.missing.append(entry.max + 1...counter - 1) }
            entry.max = counter
        } else {
            entry.missing = entry.missing.flatMap { range -> [ClosedRange<Int64>] in
                guard range.contains(counter) else { return [range] }
                var parts: [ClosedRange<Int64>] = []
                if range.lowerBound < counter { parts.append(range.lowerBound...counter - 1) }
                if counter < range.upperBound { parts.append(counter + 1...range.upperBound) }
                return parts
            }
        }
        context[device] = entry
    }

    /// Adds every dot of another context.
    public mutating func formUnion(_ other: [DeviceID: Entry]) {
        for (device, b) in other {
            guard let a = context[device] else { context[device] = b; continue }
            // Missing from the union: missing from the higher side, and from the lower
            // side too where it reaches.
            let (high, low) = a.max >= b.max ? (a, b) : (b, a)
            let lowMissing = low.missing + (low.max < high.max ? [low.max + 1...high.max] : [])
            context[device] = Entry(max: high.max, missing: Self.intersect(high.missing, lowMissing))
        }
    }

    private static func intersect(_ a: [ClosedRange<Int64>], _ b: [ClosedRange<Int64>]) -> [ClosedRange<Int64>] {
        var result: [ClosedRange<Int64>] = []
        var i = 0, j = 0
        while i < a.count && j < b.count {
            let lo = Swift.max(a[i].lowerBound, b[j].lowerBound), hi = Swift.min(a[i].upperBound, b[j].upperBound)
            if lo <= hi { result.append(lo...hi) }
            if a[i].upperBound < b[j].upperBound { i += 1 } else { j += 1 }
        }
        return result
    }

    // MARK: text

    /// The context as a record and the versions table carry it:
    /// `<device>:<max>[:<lo>-<hi>...]` items separated by `,`, devices in byte order.
    public var contextText: String {
        context.keys.sorted().map { device in
            let entry = context[device]!
            return ([device.hex, String(entry.max)] + entry.missing.map { "\($0.lowerBound)-\($0.upperBound)" }).joined(separator: ":")
        }.joined(separator: ",")
    }

    /// Counters and ranges in the context (what `maxItems` limits).
    public var itemCount: Int { context.values.reduce(0) { $0 + 1 + $1.missing.count } }

    /// The largest counter a dot may have; the most items a context may hold.
    public static let maxCounter: Int64 = 1 << 62
    public static let maxItems = 4096

    /// Parses `contextText`; nil if malformed (devices not 16 lowercase hex digits, not in
    /// order, counters out of range, ranges not sorted, disjoint and below the max).
    public static func parseContext(_ text: Substring) -> [DeviceID: Entry]? {
        var result: [DeviceID: Entry] = [:]
        if text.isEmpty { return result }
        var previous: DeviceID?
        var items = 0
        for item in text.split(separator: ",", omittingEmptySubsequences: false) {
            let parts = item.split(separator: ":", omittingEmptySubsequences: false)
            guard parts.count >= 2, let device = DeviceID(hex: parts[0]), previous.map({ $0 < device }) ?? true,
                  let max = counter(parts[1]) else { return nil }
            items += parts.count - 1
            guard items <= maxItems else { return nil }
            var missing: [ClosedRange<Int64>] = []
            var floor: Int64 = 0
            for range in parts.dropFirst(2) {
                let ends = range.split(separator: "-", omittingEmptySubsequences: false)
                guard ends.count == 2, let lo = counter(ends[0]), let hi = counter(ends[1]),
                      lo > floor, lo <= hi, hi < max else { return nil }
                missing.append(lo...hi)
                floor = hi + 1
            }
            result[device] = Entry(max: max, missing: missing)
            previous = device
        }
        return result
    }

    /// A decimal counter from 1 to `maxCounter`, no leading zeros.
    public static func counter(_ text: Substring) -> Int64? {
        guard !text.isEmpty, text.count <= 19, text.first != "0", text.utf8.allSatisfy({ $0 >= 48 && $0 <= 57 }),
              let value = Int64(text), value <= maxCounter else { return nil }
        return value
    }

    /// The lineage of a record of `device` that continues that device's own previous
    /// record of the node and nothing else: the common case, which journal lines and the
    /// versions table write as the dot alone.
    public static func linear(device: DeviceID, dot: Int64) -> [DeviceID: Entry] {
        dot > 1 ? [device: Entry(max: dot - 1)] : [:]
    }

    public func isLinear(device: DeviceID) -> Bool { context == Self.linear(device: device, dot: dot) }

    /// The versions table's `lineage` column for a record of `device`: `<dot>` when linear,
    /// else `<dot>;<context>` (NULL when empty).
    func stored(device: DeviceID) -> String? {
        isEmpty ? nil : isLinear(device: device) ? String(dot) : "\(dot);\(contextText)"
    }

    /// The `lineage` column as read from a row (NULL: none). One that does not parse
    /// (only a damaged database holds one: this program stores only what it can read
    /// back) is logged and read as none, so the record supersedes by its parents only.
    static func column(_ text: String?, device: DeviceID) -> Lineage {
        guard let text else { return Lineage() }
        if let lineage = Lineage(stored: text, device: device) { return lineage }
        log("ubiquity: a version's lineage \(text.prefix(80)) does not parse (damaged database?); read as none")
        return Lineage()
    }

    init?(stored: String, device: DeviceID) {
        guard let semicolon = stored.firstIndex(of: ";") else {
            guard let dot = Self.counter(Substring(stored)) else { return nil }
            self.dot = dot
            self.context = Self.linear(device: device, dot: dot)
            return
        }
        guard let dot = Self.counter(stored[..<semicolon]),
              let context = Self.parseContext(stored[stored.index(after: semicolon)...]) else { return nil }
        self.dot = dot
        self.context = context
    }
}
