import Testing
import TestSupport
import UbiquityBacking
import UbiquityStore
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
                let (segments, next) = try SegmentLog.poll(store, after: reader)
                for s in segments { taken[s.device, default: []].append(s.seq) }
                reader = next
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
