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
        public init?(key: BackingKey) {
            guard key.path.hasPrefix(SegmentLog.prefix) else { return nil }
            let parts = key.path.dropFirst(SegmentLog.prefix.count).split(separator: "-", omittingEmptySubsequences: false)
            guard parts.count == 3, parts[0].count == 13, parts[0].allSatisfy({ $0.isASCII && $0.isNumber }),
                  let time = Int64(parts[0]), let device = DeviceID(hex: parts[1]),
                  Hex.isLowercase(String(parts[2]), count: 16), let seq = UInt64(parts[2], radix: 16), seq >= 1 else { return nil }
            self.init(time: time, device: device, seq: seq)
        }

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
    }

    /// `now`: the reader's clock (ms). A `<t>` further ahead of it than the skew window
    /// (a broken clock, a hostile name) does not move the cursor there: every later
    /// segment would be named after it and the listing window would skip the log.
    public static func look(_ store: any BackingStore, after cursor: Cursor, exclude: DeviceID? = nil,
                            now: Int64 = Int64(Glibc.time(nil)) &* 1000) throws(BackingError) -> Look {
        let ceiling = now.addingClamped(skewWindowMs)
        let from = max(0, min(cursor.listedUpTo, ceiling) - skewWindowMs)
        let start = BackingKey(checked: prefix + SegmentName.timeText(from))
        var found: [SegmentName] = []
        var sizes: [SegmentName: Int64] = [:]
        var highest = min(cursor.listedUpTo, ceiling)
        var after: BackingKey? = start
        while true {
            let page = try store.list(prefix: prefix, after: after, limit: 1000)
            for info in page.objects {
                guard let name = SegmentName(key: info.key) else { continue } // strays are not ours
                sizes[name] = info.size
                highest = max(highest, min(name.time, ceiling))
                if name.device == exclude { continue }
                if name.seq > cursor.applied[name.device, default: 0] { found.append(name) }
            }
            guard page.more, let last = page.objects.last else { break }
            after = last.key
        }
        // Per device in seq order; a gap means a segment outside the window (its author's
        // clock lags): fetch that device's names whole and take what is missing.
        var byDevice: [DeviceID: [SegmentName]] = [:]
        for name in found { byDevice[name.device, default: []].append(name) }
        var result: [SegmentName] = []
        var blocked: Set<DeviceID> = []
        var next = cursor
        for device in byDevice.keys.sorted() {
            var names = byDevice[device]!.sorted { $0.seq < $1.seq }
            let have = cursor.applied[device, default: 0]
            let contiguous = names.enumerated().allSatisfy { $0.element.seq == have + UInt64($0.offset) + 1 }
            if !contiguous {
                let all = try store.listAll(prefix: prefix).compactMap { info in SegmentName(key: info.key).map { ($0, info.size) } }
                for (name, size) in all where name.device == device { sizes[name] = size }
                names = all.map(\.0).filter { $0.device == device && $0.seq > have }.sorted { $0.seq < $1.seq }
                // Take only the contiguous run; a later segment waits for the missing one.
                var run: [SegmentName] = []
                for n in names where n.seq == have + UInt64(run.count) + 1 { run.append(n) }
                if run.isEmpty && !names.isEmpty { blocked.insert(device) }
                names = run
            }
            // Segments of one seq seen twice (never written so, but not trusted) count once.
            var seen = Set<UInt64>()
            names = names.filter { seen.insert($0.seq).inserted }
            result += names
            if let last = names.last { next.applied[device] = last.seq }
        }
        next.listedUpTo = highest
        return Look(segments: result, cursor: next, blocked: blocked, sizes: sizes)
    }

    /// Every segment of one device (a full listing of the log, filtered: only on a gap).
    static func segments(of device: DeviceID, in store: any BackingStore) throws(BackingError) -> [SegmentName] {
        try store.listAll(prefix: prefix).compactMap { SegmentName(key: $0.key) }.filter { $0.device == device }
    }
}
