import Glibc
import UbiquityBacking
import UbiquityStore
import UbiquitySystem

/// The log of backing format 5 (docs/FORMAT.md, "Backing format 5"): every device's
/// journal segments under one prefix, named `log/<t>-<device>-<seq>`, so one LIST after a
/// cursor finds what every peer wrote since (a quiet container: one request per poll),
/// however many devices there are.
///
/// `<t>` is a hybrid clock (ms): the author's clock, but never less than the newest `<t>`
/// the author has listed (`time(now:cursor:)`), so a device whose clock lags still names
/// its segments after what its peers last saw. The reader lists from its cursor less a
/// skew window, and keeps per device the highest `<seq>` it took, so a segment is taken
/// once, in its device's order; a segment that still lands behind the window (a device
/// that wrote without polling first, with a clock far behind) shows as a gap in its
/// device's `<seq>` once a later one comes, and that device is then looked up in a full
/// listing of the log (rare; the collector keeps the log short).
public enum SegmentLog {
    static let prefix = "log/"

    public struct SegmentName: Hashable, Comparable, Sendable {
        /// Author's clock, ms since the epoch (13 digits: until the year 2286).
        public let time: Int64
        public let device: DeviceID
        /// 1, 2, ... per device.
        public let seq: UInt64

        public init(time: Int64, device: DeviceID, seq: UInt64) {
            self.time = time
            self.device = device
            self.seq = seq
        }

        public var key: BackingKey {
            BackingKey(checked: SegmentLog.prefix + Self.timeText(time) + "-" + device.hex + "-" + Self.seqText(seq))
        }

        static func timeText(_ t: Int64) -> String {
            let digits = String(max(0, min(t, 9_999_999_999_999)))
            return String(repeating: "0", count: 13 - digits.count) + digits
        }

        static func seqText(_ s: UInt64) -> String {
            let hex = String(s, radix: 16)
            return String(repeating: "0", count: 16 - hex.count) + hex
        }

        /// Parses a key of the log; nil for anything else (a stray object is skipped).
        /// Its one spelling, `log/<13 digits>-<16 hex>-<16 hex>` (lowercase, seq at least
        /// 1), is read as bytes at fixed places: every minute a poll parses each key of the
        /// skew window, thousands after a big upload.
        public init?(key: BackingKey) {
            let bytes = Array(key.path.utf8), start = Self.prefixBytes.count
            guard bytes.count == start + 47, bytes.starts(with: Self.prefixBytes),
                  bytes[start + 13] == UInt8(ascii: "-"), bytes[start + 30] == UInt8(ascii: "-") else { return nil }
            var time: Int64 = 0
            for c in bytes[start..<(start + 13)] {
                guard c >= UInt8(ascii: "0") && c <= UInt8(ascii: "9") else { return nil }
                time = time * 10 + Int64(c - UInt8(ascii: "0"))
            }
            guard let device = DeviceID(digits: bytes[(start + 14)..<(start + 30)]) else { return nil }
            var seq: UInt64 = 0
            for c in bytes[(start + 31)...] {
                switch c {
                case UInt8(ascii: "0")...UInt8(ascii: "9"): seq = seq << 4 | UInt64(c - UInt8(ascii: "0"))
                case UInt8(ascii: "a")...UInt8(ascii: "f"): seq = seq << 4 | UInt64(c - UInt8(ascii: "a") + 10)
                default: return nil
                }
            }
            guard seq >= 1 else { return nil }
            self.init(time: time, device: device, seq: seq)
        }

        private static let prefixBytes = Array(SegmentLog.prefix.utf8)

        public static func < (a: SegmentName, b: SegmentName) -> Bool { a.key < b.key }
    }

    /// What a reader has taken: the last key its listing reached, and per device the
    /// highest segment applied. Stored as text in the store (opaque to everything else).
    public struct Cursor: Equatable, Sendable {
        public var listedUpTo: Int64 = 0
        public var applied: [DeviceID: UInt64] = [:]

        public init() {}

        /// `t=<ms>;<device>=<seq hex>,...` (devices sorted).
        public var text: String {
            "t=\(listedUpTo);" + applied.keys.sorted().map { "\($0.hex)=\(String(applied[$0]!, radix: 16))" }.joined(separator: ",")
        }

        /// Parses `text`; nil when it does not parse (the caller starts over from the
        /// checkpoints, never guesses).
        public init?(text: String) {
            guard text.hasPrefix("t="), let semi = text.firstIndex(of: ";"),
                  let t = Int64(text[text.index(text.startIndex, offsetBy: 2)..<semi]), t >= 0 else { return nil }
            listedUpTo = t
            let rest = text[text.index(after: semi)...]
            if rest.isEmpty { return }
            for item in rest.split(separator: ",", omittingEmptySubsequences: false) {
                let pair = item.split(separator: "=", omittingEmptySubsequences: false)
                guard pair.count == 2, let device = DeviceID(hex: pair[0]), applied[device] == nil,
                      let seq = UInt64(pair[1], radix: 16) else { return nil }
                applied[device] = seq
            }
        }
    }

    /// The `<t>` of a segment written now: the author's clock, or the newest `<t>` it has
    /// listed when that is later (its clock lags a peer's).
    public static func time(now: Int64, cursor: Cursor) -> Int64 { max(now, cursor.listedUpTo) }

    /// How far back of its cursor a reader lists again: authors' clocks may lag this much
    /// behind the newest key seen without a segment being missed by the one listing.
    public static let skewWindowMs: Int64 = 10 * 60 * 1000

    /// New segments since `cursor`, in the order to apply them (each device's by `seq`,
    /// devices one after another), and the cursor once they are applied. Costs one LIST (a page per
    /// 1,000 keys in the window), plus one LIST of a device's own segments where its
    /// sequence shows a gap. `exclude`: this device (it does not read its own log).
    public static func poll(_ store: any BackingStore, after cursor: Cursor, exclude: DeviceID? = nil) throws(BackingError) -> (segments: [SegmentName], cursor: Cursor) {
        let result = try look(store, after: cursor, exclude: exclude)
        return (result.segments, result.cursor)
    }

    /// What one look at the log found: `poll`'s answer, and the devices whose next
    /// segment is missing although later ones are there (collected after a checkpoint,
    /// which the reader then reads instead).
    public struct Look: Sendable {
        public var segments: [SegmentName]
        public var cursor: Cursor
        public var blocked: Set<DeviceID>
        /// The listed size of each segment returned (a reader skips one no writer could
        /// have made without reading it).
        public var sizes: [SegmentName: Int64] = [:]
        /// The last segment this look listed (nil: none; never one named far ahead of the
        /// reader's clock): where the next look may start (`start(after:quietSeconds:)`)
        /// once everything returned is applied.
        public var lastKey: BackingKey?
        /// Whether it listed the whole skew window (false: only after `since`).
        public var listedWindow = true
    }

    /// How often a reader that looks `since` its last key lists the whole skew window all
    /// the same, for a segment that landed behind a key it had already listed (a writer
    /// whose clock lags, or whose upload took long) and that no later segment of its
    /// device has shown yet as a gap.
    public static let windowSeconds: Double = 60

    /// While the log moves, a segment named just before the last one listed may still be
    /// landing (two writers in the same second; an upload of a few seconds): a look starts
    /// this far before the last key's time until that key has stood this long.
    public static let settleMs: Int64 = 10_000

    /// Where a look that is not of the whole window starts (its `since`): at the time of
    /// `lastKey`, the last segment listed, once it has stood `settleMs` (`quietSeconds`:
    /// since the reader first listed it); before that, `settleMs` before it. At its time,
    /// not after it: a writer names its segments after the newest `<t>` it listed while
    /// its own clock is behind, so a peer whose clock runs ahead has others' segments
    /// named with its `<t>`, and those of a device whose id sorts lower land behind its key.
    public static func start(after lastKey: BackingKey, quietSeconds: Double) -> BackingKey {
        guard let name = SegmentName(key: lastKey) else { return lastKey }
        let settled = quietSeconds * 1000 >= Double(settleMs)
        return BackingKey(checked: prefix + SegmentName.timeText(max(0, name.time - (settled ? 0 : settleMs))))
    }

    /// `now`: the reader's clock (ms). A `<t>` further ahead of it than the skew window
    /// (a broken clock, a hostile name) does not move the cursor there: every later
    /// segment would be named after it and the listing window would skip the log.
    ///
    /// `since`: where the listing starts instead of the window (`start(after:quietSeconds:)`
    /// of the last segment a previous look listed, all of whose segments were applied), so
    /// a poll of a quiet log lists only the keys of one `<t>` however many segments the
    /// window holds (after a big upload, thousands, which every poll would otherwise list
    /// and parse). A segment that landed behind it shows as a gap in its device's `<seq>` once a
    /// later one comes: the whole window is then listed before any full listing of the
    /// log; one with no later segment waits for the next look of the whole window
    /// (`windowSeconds`).
    public static func look(_ store: any BackingStore, after cursor: Cursor, exclude: DeviceID? = nil, since: BackingKey? = nil,
                            now: Int64 = Int64(Glibc.time(nil)) &* 1000) throws(BackingError) -> Look {
        let ceiling = now.addingClamped(skewWindowMs)
        let from = max(0, min(cursor.listedUpTo, ceiling) - skewWindowMs)
        let start = BackingKey(checked: prefix + SegmentName.timeText(from))
        // After `since` when that listing shows no gap (the next look's start), else the
        // whole window.
        var listed: Listing?
        if let since, start < since {
            let recent = try list(store, from: since, cursor: cursor, ceiling: ceiling, exclude: exclude)
            if grouped(recent.found).allSatisfy({ contiguous($0.names, after: cursor.applied[$0.device, default: 0]) }) {
                listed = recent
            }
        }
        let listedWindow = listed == nil
        let listing: Listing
        if let listed { listing = listed } else { listing = try list(store, from: start, cursor: cursor, ceiling: ceiling, exclude: exclude) }
        var look = Look(segments: [], cursor: cursor, blocked: [], sizes: listing.sizes, lastKey: listing.lastKey,
                        listedWindow: listedWindow)
        look.cursor.listedUpTo = listing.highest
        // Per device in seq order; a gap means a segment outside the window (its author's
        // clock lags): fetch that device's names whole and take what is missing.
        for (device, listedNames) in grouped(listing.found) {
            var names = listedNames
            let have = cursor.applied[device, default: 0]
            if !contiguous(names, after: have) {
                let all = try store.listAll(prefix: prefix).compactMap { info in SegmentName(key: info.key).map { ($0, info.size) } }
                for (name, size) in all where name.device == device { look.sizes[name] = size }
                names = all.map(\.0).filter { $0.device == device && $0.seq > have }.sorted { $0.seq < $1.seq }
                // Take only the contiguous run; a later segment waits for the missing one.
                var run: [SegmentName] = []
                for n in names where n.seq == have + UInt64(run.count) + 1 { run.append(n) }
                if run.isEmpty && !names.isEmpty { look.blocked.insert(device) }
                names = run
            }
            names = once(names)
            look.segments += names
            if let last = names.last { look.cursor.applied[device] = last.seq }
        }
        return look
    }

    /// One listing of the log from `from` to its end.
    private struct Listing {
        var found: [SegmentName] = []
        var sizes: [SegmentName: Int64] = [:]
        var highest: Int64
        var lastKey: BackingKey?
    }

    private static func list(_ store: any BackingStore, from: BackingKey, cursor: Cursor, ceiling: Int64,
                             exclude: DeviceID?) throws(BackingError) -> Listing {
        var listing = Listing(highest: min(cursor.listedUpTo, ceiling))
        var after: BackingKey? = from
        while true {
            let page = try store.list(prefix: prefix, after: after, limit: 1000)
            for info in page.objects {
                guard let name = SegmentName(key: info.key) else { continue } // strays are not ours
                // Not past a name from the future (a broken clock, a hostile name): the
                // next look would start after it and miss what comes before it.
                if name.time <= ceiling { listing.lastKey = info.key }
                listing.sizes[name] = info.size
                listing.highest = max(listing.highest, min(name.time, ceiling))
                if name.device == exclude { continue }
                if name.seq > cursor.applied[name.device, default: 0] { listing.found.append(name) }
            }
            guard page.more, let last = page.objects.last else { break }
            after = last.key
        }
        return listing
    }

    /// Segments by device (devices in order), each device's by `<seq>`.
    private static func grouped(_ names: [SegmentName]) -> [(device: DeviceID, names: [SegmentName])] {
        var byDevice: [DeviceID: [SegmentName]] = [:]
        for name in names { byDevice[name.device, default: []].append(name) }
        return byDevice.keys.sorted().map { ($0, byDevice[$0]!.sorted { $0.seq < $1.seq }) }
    }

    /// Whether `names` (in seq order) follow on from `have`, one by one.
    private static func contiguous(_ names: [SegmentName], after have: UInt64) -> Bool {
        names.enumerated().allSatisfy { $0.element.seq == have + UInt64($0.offset) + 1 }
    }

    /// Segments of one seq seen twice (never written so, but not trusted) count once.
    private static func once(_ names: [SegmentName]) -> [SegmentName] {
        var seen = Set<UInt64>()
        return names.filter { seen.insert($0.seq).inserted }
    }

    /// Every segment of one device (a full listing of the log, filtered: only on a gap).
    static func segments(of device: DeviceID, in store: any BackingStore) throws(BackingError) -> [SegmentName] {
        try store.listAll(prefix: prefix).compactMap { SegmentName(key: $0.key) }.filter { $0.device == device }
    }
}
