import Glibc
import Testing
import TestSupport
import UbiquityBacking
import UbiquityStore
import UbiquitySystem
@testable import UbiquitySync

/// The format-5 log: one LIST per poll, every segment taken once and in its device's
/// order, whatever the authors' clocks say.
@Suite struct SegmentLogTests {
    struct Device {
        let id: DeviceID
        var clockSkew: Int64
        var seq: UInt64 = 0
        var cursor = SegmentLog.Cursor()
    }

    @Test(arguments: [71, 72, UInt64.random(in: 100...UInt64.max)])
    func everySegmentOnceInOrder(seed: UInt64) throws {
        print("SegmentLogTests seed \(seed)")
        var gen = SplitMix64(seed: seed)
        let store = MemoryStore()
        // Three writers (one lagging 3 hours), one reader.
        var writers = [Device(id: DeviceID(hex: "00000000000000a1")!, clockSkew: 0),
                       Device(id: DeviceID(hex: "00000000000000b2")!, clockSkew: 120_000),
                       Device(id: DeviceID(hex: "00000000000000c3")!, clockSkew: -3 * 3_600_000)]
        var reader = SegmentLog.Cursor()
        var lastKey: BackingKey?
        var looks = 0
        var taken: [DeviceID: [UInt64]] = [:]
        var now: Int64 = 1_795_000_000_000
        for _ in 0..<400 {
            now += Int64(gen.int(0..<5000))
            let w = gen.int(0..<writers.count)
            if gen.int(0..<3) > 0 {
                // A sync step: poll, then write a segment.
                writers[w].cursor = try SegmentLog.poll(store, after: writers[w].cursor, exclude: writers[w].id).cursor
                writers[w].seq += 1
                let t = SegmentLog.time(now: now + writers[w].clockSkew, cursor: writers[w].cursor)
                try store.put(SegmentLog.SegmentName(time: t, device: writers[w].id, seq: writers[w].seq).key, [1])
            } else {
                // As the sync engine reads: after the last key listed, the whole window
                // every few looks (or when a gap shows).
                looks += 1
                let look = try SegmentLog.look(store, after: reader, since: looks % 4 == 0 ? nil : lastKey, now: now)
                for s in look.segments { taken[s.device, default: []].append(s.seq) }
                reader = look.cursor
                lastKey = look.lastKey ?? lastKey
            }
        }
        let (rest, _) = try SegmentLog.poll(store, after: reader)
        for s in rest { taken[s.device, default: []].append(s.seq) }
        for w in writers {
            #expect(taken[w.id, default: []] == Array(1...max(1, w.seq)).filter { $0 <= w.seq }, "seed \(seed): \(w.id) segments taken")
        }
    }

    @Test func anIdlePollIsOneList() throws {
        let store = MemoryStore()
        for seq in 1...50 as ClosedRange<UInt64> {
            try store.put(SegmentLog.SegmentName(time: 1_000_000 + Int64(seq), device: DeviceID(hex: "00000000000000a1")!, seq: seq).key, [])
        }
        var (segments, cursor) = try SegmentLog.poll(store, after: SegmentLog.Cursor())
        #expect(segments.count == 50)
        store.resetCounts()
        (segments, cursor) = try SegmentLog.poll(store, after: cursor)
        #expect(segments.isEmpty && store.counts.total == 1, "\(store.counts)")
        #expect(SegmentLog.Cursor(text: cursor.text) == cursor)
    }

    /// After a burst (a big upload: thousands of segments in the skew window), a look
    /// after the last key lists nothing however many the window holds; a segment that
    /// lands behind that key is found by the next look of the whole window, or at once
    /// when a later segment of its device shows the gap.
    @Test func aQuietLogAfterABurstCostsOneEmptyList() throws {
        let store = MemoryStore()
        let a = DeviceID(hex: "00000000000000a1")!, b = DeviceID(hex: "00000000000000b2")!
        let now: Int64 = 1_795_000_000_000
        for seq in 1...2_500 as ClosedRange<UInt64> {
            try store.put(SegmentLog.SegmentName(time: now - 60_000 + Int64(seq), device: a, seq: seq).key, [])
        }
        let first = try SegmentLog.look(store, after: SegmentLog.Cursor(), now: now)
        #expect(first.segments.count == 2_500 && first.listedWindow)
        store.resetCounts()
        // As the engine starts it once the last key has stood: at that key's time.
        let settled = SegmentLog.start(after: try #require(first.lastKey), quietSeconds: 60)
        let quiet = try SegmentLog.look(store, after: first.cursor, since: settled, now: now)
        #expect(quiet.segments.isEmpty && !quiet.listedWindow && quiet.lastKey == first.lastKey)
        #expect(store.counts.total == 1 && store.counts.keysListed == 1, "only the last key again: \(store.counts)")
        store.resetCounts()
        let window = try SegmentLog.look(store, after: first.cursor, now: now)
        #expect(window.segments.isEmpty && store.counts.keysListed == 2_500, "the whole window: \(store.counts)")

        // b's first segment lands behind the last key listed: not seen after it...
        try store.put(SegmentLog.SegmentName(time: now - 59_000, device: b, seq: 1).key, [])
        var look = try SegmentLog.look(store, after: quiet.cursor, since: first.lastKey, now: now)
        #expect(look.segments.isEmpty)
        // ...until its next one comes after it: the gap sends the look over the window.
        try store.put(SegmentLog.SegmentName(time: now + 1_000, device: b, seq: 2).key, [])
        store.resetCounts()
        look = try SegmentLog.look(store, after: quiet.cursor, since: first.lastKey, now: now)
        #expect(look.segments.map(\.seq) == [1, 2] && look.listedWindow && look.blocked.isEmpty)
        #expect(store.counts.of(.list) == 4, "one after the key, three pages of the window: \(store.counts)")
        // A name from far in the future is listed but is not where the next look starts.
        try store.put(SegmentLog.SegmentName(time: now + 86_400_000, device: b, seq: 3).key, [])
        let future = try SegmentLog.look(store, after: look.cursor, since: look.lastKey, now: now)
        #expect(future.segments.map(\.seq) == [3] && future.lastKey == nil)
    }

    /// A look starts at the last segment's time once it has stood `settleMs`; before
    /// that, `settleMs` before its time (a segment of another writer named in the same
    /// second may still land behind it). At its time, not after its key: a writer whose
    /// clock is behind names its segments with the newest time it listed, a peer's whose
    /// clock runs ahead, and a lower device id sorts them behind that peer's key.
    @Test func aLookStartsBeforeAKeyThatHasNotSettled() throws {
        let store = MemoryStore()
        let a = DeviceID(hex: "00000000000000a1")!, b = DeviceID(hex: "00000000000000b2")!
        let now: Int64 = 1_795_000_000_000
        try store.put(SegmentLog.SegmentName(time: now, device: b, seq: 1).key, [])
        let first = try SegmentLog.look(store, after: SegmentLog.Cursor(), now: now)
        let key = try #require(first.lastKey)
        #expect(SegmentLog.start(after: key, quietSeconds: 30).path == "log/" + SegmentLog.SegmentName.timeText(now))
        let early = SegmentLog.start(after: key, quietSeconds: 1)
        #expect(early.path == "log/" + SegmentLog.SegmentName.timeText(now - SegmentLog.settleMs))
        // a's segment of the same millisecond lands after b's was listed: found from
        // the unsettled start, not from the key.
        try store.put(SegmentLog.SegmentName(time: now, device: a, seq: 1).key, [])
        #expect(try SegmentLog.look(store, after: first.cursor, since: key, now: now).segments.isEmpty)
        #expect(try SegmentLog.look(store, after: first.cursor, since: early, now: now).segments.map(\.device) == [a])

        // b's clock runs two minutes ahead; a names its next segments with b's time (the
        // newest it listed) long after b's key has settled: found from the settled start.
        let ahead = now + 120_000
        try store.put(SegmentLog.SegmentName(time: ahead, device: b, seq: 2).key, [])
        var cursor = try SegmentLog.look(store, after: first.cursor, now: now).cursor
        let aheadKey = SegmentLog.SegmentName(time: ahead, device: b, seq: 2).key
        try store.put(SegmentLog.SegmentName(time: ahead, device: a, seq: 2).key, [])
        let late = try SegmentLog.look(store, after: cursor, since: SegmentLog.start(after: aheadKey, quietSeconds: 60), now: now)
        #expect(late.segments.map(\.device) == [a] && !late.listedWindow)
        cursor = late.cursor
        #expect(cursor.applied[a] == 2)
    }

    @Test func aLaggingWriterThatDidNotPollIsFoundByItsGap() throws {
        let store = MemoryStore()
        let a = DeviceID(hex: "00000000000000a1")!, b = DeviceID(hex: "00000000000000b2")!
        try store.put(SegmentLog.SegmentName(time: 10_000_000, device: a, seq: 1).key, [])
        var (_, cursor) = try SegmentLog.poll(store, after: SegmentLog.Cursor())
        // b writes seq 1 far behind the window, then seq 2 within it.
        try store.put(SegmentLog.SegmentName(time: 100, device: b, seq: 1).key, [])
        try store.put(SegmentLog.SegmentName(time: 10_000_100, device: b, seq: 2).key, [])
        let (segments, next) = try SegmentLog.poll(store, after: cursor)
        #expect(segments.map(\.seq) == [1, 2] && segments.allSatisfy { $0.device == b })
        cursor = next
        #expect(cursor.applied[b] == 2)
    }

    /// The byte parser of segment names against the rule as `String` operations state it,
    /// on names made, then cut, lengthened, and changed at random bytes (digits, dashes,
    /// case, multi-byte characters). Prints its seed.
    @Test func segmentNamesParseAsTheRuleSays() {
        let seed = getenv("UBQ_SEED").flatMap { UInt64(String(cString: $0)) } ?? UInt64(time(nil))
        print("segmentNamesParseAsTheRuleSays seed \(seed) (replay: UBQ_SEED=\(seed))")
        var rng = SplitMix64(seed: seed)
        func byRule(_ path: String) -> SegmentLog.SegmentName? {
            guard path.hasPrefix("log/") else { return nil }
            let parts = path.dropFirst(4).split(separator: "-", omittingEmptySubsequences: false)
            guard parts.count == 3, parts[0].count == 13, parts[0].allSatisfy({ $0.isASCII && $0.isNumber }),
                  let time = Int64(parts[0]), let device = DeviceID(hex: parts[1]),
                  Hex.isLowercase(String(parts[2]), count: 16), let seq = UInt64(parts[2], radix: 16), seq >= 1 else { return nil }
            return SegmentLog.SegmentName(time: time, device: device, seq: seq)
        }
        let alphabet = Array("0123456789abcdefABCDEF-/xlog\u{e9}\u{301}".unicodeScalars)
        var parsed = 0
        for _ in 0..<20_000 {
            let made = SegmentLog.SegmentName(time: Int64(rng.next() % 10_000_000_000_000), device: DeviceID(hex: Self.hex16(rng.next()))!,
                                              seq: rng.next() % 4 == 0 ? rng.next() % 3 : rng.next())
            var scalars = Array(made.key.path.unicodeScalars)
            for _ in 0..<Int(rng.next() % 3) {
                let at = Int(rng.next() % UInt64(scalars.count + 1))
                switch rng.next() % 3 {
                case 0: if at < scalars.count { scalars[at] = alphabet[Int(rng.next() % UInt64(alphabet.count))] }
                case 1: scalars.insert(alphabet[Int(rng.next() % UInt64(alphabet.count))], at: at)
                default: if at < scalars.count { scalars.remove(at: at) }
                }
            }
            var path = String(String.UnicodeScalarView(scalars))
            if path.isEmpty { path = "x" }
            guard let key = BackingKey(path) else { continue }
            let expected = byRule(path)
            #expect(SegmentLog.SegmentName(key: key) == expected, "seed \(seed): \(path)")
            if expected != nil { parsed += 1 }
        }
        #expect(parsed > 5_000, "seed \(seed): too few valid names to compare (\(parsed))")
    }

    static func hex16(_ value: UInt64) -> String {
        let digits = String(value, radix: 16)
        return String(repeating: "0", count: 16 - digits.count) + digits
    }

    @Test func namesAndCursorsParseStrictly() {
        let name = SegmentLog.SegmentName(time: 1_795_000_000_123, device: DeviceID(hex: "0123456789abcdef")!, seq: 42)
        #expect(name.key.path == "log/1795000000123-0123456789abcdef-000000000000002a")
        #expect(SegmentLog.SegmentName(key: name.key) == name)
        for bad in ["log/x", "log/1795000000123-0123456789ABCDEF-000000000000002a", "log/179500000012-0123456789abcdef-000000000000002a",
                    "log/1795000000123-0123456789abcdef-0000000000000000", "logs/1795000000123-0123456789abcdef-000000000000002a"] {
            #expect(SegmentLog.SegmentName(key: BackingKey(checked: bad)) == nil, "\(bad)")
        }
        for bad in ["", "t=;", "t=-1;", "t=5", "t=5;zz=1", "t=5;0123456789abcdef=1,0123456789abcdef=2", "t=5;0123456789abcdef=x"] {
            #expect(SegmentLog.Cursor(text: bad) == nil, "\(bad)")
        }
        #expect(SegmentLog.Cursor(text: "t=5;")?.listedUpTo == 5)
    }
}
