import Glibc
import Testing
import TestSupport
import UbiquitySystem
@testable import UbiquityStore

/// The key-value store's rules (types, their text, limits) and its last-writer-wins merge.
@Suite struct KeyValueTests {
    static func canonical(_ text: String, _ type: KVType) throws -> String {
        String(decoding: try KeyValues.canonical(Array(text.utf8), as: type), as: UTF8.self)
    }

    @Test func valuesTakeOneSpellingPerType() throws {
        #expect(try Self.canonical(" 42 \n", .integer) == "42\n")
        #expect(try Self.canonical("-9223372036854775808", .integer) == "-9223372036854775808\n")
        #expect(try Self.canonical("2", .double) == "2.0\n")
        #expect(try Self.canonical("0.1", .double) == "0.1\n")
        #expect(try Self.canonical("YES", .bool) == "true\n")
        #expect(try Self.canonical("0", .bool) == "false\n")
        #expect(try Self.canonical("2026-11-24T09:30:00.5+01:00", .date) == "2026-11-24T08:30:00.500Z\n")
        #expect(try Self.canonical("hello\n", .string) == "hello\n") // strings as written
        #expect(try KeyValues.canonical([0, 255, 10], as: .data) == [0, 255, 10])
        #expect(try Self.canonical(#" [1, 2.0, "x", true, {"$data": "AAE="}] "#, .array) == #"[1,2.0,"x",true,{"$data":"AAE="}]"# + "\n")
        #expect(try Self.canonical(#"{"b": 1, "a": {"$date": "2026-01-01T00:00:00Z"}}"#, .dictionary)
                == #"{"a":{"$date":"2026-01-01T00:00:00.000Z"},"b":1}"# + "\n")
        #expect(try Self.canonical(#"["\u00e9\ud83d\ude00\n"]"#, .array) == "[\"é😀\\n\"]\n")
        // A canonical value is its own canonical form (what a reader checks of a peer's).
        for (text, type) in [("42\n", KVType.integer), ("2.5\n", .double), ("[1,{\"a\":[]}]\n", .array)] {
            #expect(try Self.canonical(text, type) == text)
        }
    }

    @Test func valuesThatAreNotTheirTypeAreRefused() {
        let bad: [(String, KVType)] = [
            ("abc", .integer), ("9223372036854775808", .integer), ("1.5", .integer), ("", .integer),
            ("nan", .double), ("inf", .double), ("maybe", .bool), ("2026-13-01T00:00:00Z", .date),
            ("2026-02-30T00:00:00Z", .date), ("yesterday", .date), ("{}", .array), ("[]", .dictionary),
            ("[null]", .array), ("[1,]", .array), (#"{"a":1,"a":2}"#, .dictionary), (#"{"$data":"!!"}"#, .dictionary),
            ("[" + String(repeating: "[", count: 70) + String(repeating: "]", count: 71), .array), ("[1] x", .array),
        ]
        for (text, type) in bad {
            #expect(throws: KVError.self, "\(text) as \(type.name)") { try KeyValues.canonical(Array(text.utf8), as: type) }
        }
        #expect(throws: KVError.self) { try KeyValues.canonical([0xFF, 0xFE], as: .string) }
    }

    @Test func datesRoundTrip() throws {
        let seed = UInt64(environment("UBQ_SEED") ?? "") ?? UInt64(time(nil))
        print("KeyValueTests.datesRoundTrip seed \(seed) (replay: UBQ_SEED=\(seed))")
        var rng = SplitMix64(seed: seed)
        for _ in 0..<2000 {
            let span = UInt64(ISODate.range.upperBound - ISODate.range.lowerBound)
            let millis = ISODate.range.lowerBound + Int64(rng.next() % span)
            let text = ISODate.format(millis: millis)
            #expect(ISODate.parse(text) == millis, "\(millis) -> \(text), seed \(seed)")
        }
        #expect(ISODate.format(millis: 0) == "1970-01-01T00:00:00.000Z")
        #expect(ISODate.parse("2000-02-29T23:59:59.999Z") == 951_868_799_999)
        #expect(ISODate.parse("1999-02-29T00:00:00Z") == nil)
    }

    @Test func base64RoundTrips() {
        var rng = SplitMix64(seed: 7)
        for n in 0..<40 {
            let bytes = rng.bytes(n)
            #expect(Base64.decode(Base64.encode(bytes)) == bytes)
        }
        #expect(Base64.encode(Array("foobar".utf8)) == "Zm9vYmFy")
        #expect(Base64.decode("Zm9vYg==") == Array("foob".utf8))
        #expect(Base64.decode("Zm9vYh==") == nil) // non-canonical padding bits
        #expect(Base64.decode("Zm9") == nil)
    }

    @Test func limitsRefuseAndKeepTheOldValue() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let store = try Store(directory: dir.path, deviceName: "one")
        var limits = KVLimits()
        limits.maxKeys = 3
        limits.maxTotalBytes = 100
        limits.maxValueBytes = 40
        try store.keyValues.set("n", type: .integer, content: Array("7".utf8), limits: limits)
        #expect(throws: StoreError.keyValue(.badValue(.integer, "expected a whole number from -2^63 to 2^63-1"))) {
            try store.keyValues.set("n", type: .integer, content: Array("x".utf8), limits: limits)
        }
        #expect(try store.keyValues.entry("n")?.value == Array("7\n".utf8))
        #expect(throws: StoreError.keyValue(.valueTooLarge(limit: 40, size: 41))) {
            try store.keyValues.set("big", type: .data, content: [UInt8](repeating: 1, count: 41), limits: limits)
        }
        #expect(throws: StoreError.keyValue(.keyTooLong(limit: 64, bytes: 65))) {
            try store.keyValues.set(String(repeating: "é", count: 32) + "x", type: .string, content: [], limits: limits)
        }
        #expect(throws: StoreError.self) { try store.keyValues.set("a/b", type: .string, content: [], limits: limits) }
        try store.keyValues.set("a", type: .data, content: [UInt8](repeating: 1, count: 40), limits: limits)
        try store.keyValues.set("b", type: .data, content: [UInt8](repeating: 1, count: 40), limits: limits) // 3 + 41 + 41 = 85
        #expect(throws: StoreError.keyValue(.tooManyKeys(limit: 3))) {
            try store.keyValues.set("c", type: .string, content: [], limits: limits)
        }
        // Replacing counts the old value out: b at 40 bytes fits, "n" grown over the total does not.
        try store.keyValues.set("b", type: .data, content: [UInt8](repeating: 2, count: 40), limits: limits)
        #expect(throws: StoreError.keyValue(.totalTooLarge(limit: 100, used: 85, needed: 101))) {
            try store.keyValues.set("n", type: .string, content: [UInt8](repeating: 0x41, count: 18), limits: limits)
        }
        #expect(try store.keyValues.usage().keys == 3)
        #expect(try store.keyValues.remove("a"))
        #expect(try !store.keyValues.remove("a"))
        try store.keyValues.set("c", type: .string, content: [], limits: limits)
        #expect(try store.keyValues.entries().map(\.key) == ["b", "c", "n"])
    }

    /// Every order of taking in the same writes gives the same winners (a seeded
    /// shuffle of three devices' writes, tombstones among them), and a write made after
    /// seeing another wins over it whatever the clocks say.
    @Test func mergeIsOrderIndependentAndCausal() throws {
        let seed = UInt64(environment("UBQ_SEED") ?? "") ?? UInt64(time(nil))
        print("KeyValueTests.mergeIsOrderIndependentAndCausal seed \(seed) (replay: UBQ_SEED=\(seed))")
        var rng = SplitMix64(seed: seed)
        let devices = ["1111111111111111", "2222222222222222", "3333333333333333"].map { DeviceID(hex: $0)! }
        var writes: [KVEntry] = []
        var used: Set<KVStamp> = [] // a device never gives two writes one stamp
        for i in 0..<60 {
            let key = "k\(rng.int(0..<6))"
            let stamp = KVStamp(time: Int64(1_000 + rng.int(0..<30)), device: devices[rng.int(0..<3)])
            guard used.insert(stamp).inserted else { continue }
            writes.append(rng.int(0..<4) == 0
                ? KVEntry(key: key, type: .string, value: [], stamp: stamp, isTombstone: true)
                : KVEntry(key: key, type: .integer, value: Array("\(i)\n".utf8), stamp: stamp, isTombstone: false))
        }
        var results: [[KVEntry]] = []
        for round in 0..<4 {
            let dir = TempDirectory()
            defer { dir.cleanup() }
            let store = try Store(directory: dir.path, deviceName: "r\(round)")
            var order = writes
            for i in stride(from: order.count - 1, to: 0, by: -1) { order.swapAt(i, rng.int(0..<(i + 1))) }
            // In batches, as files are read.
            var rest = order[...]
            while !rest.isEmpty {
                let n = rng.int(1..<8)
                _ = try store.keyValues.merge(Array(rest.prefix(n)))
                rest = rest.dropFirst(n)
            }
            results.append(try store.keyValues.entries())
        }
        for r in results.dropFirst() { #expect(r == results[0], "seed \(seed)") }

        // Causality: a store that saw a stamp from a clock far ahead writes after it.
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let store = try Store(directory: dir.path, deviceName: "late")
        let future = nowNanos() + 3_600_000_000_000
        _ = try store.keyValues.merge([KVEntry(key: "x", type: .string, value: Array("ahead".utf8),
                                       stamp: KVStamp(time: future, device: DeviceID(hex: "ffffffffffffffff")!), isTombstone: false)])
        let mine = try store.keyValues.set("x", type: .string, content: Array("after".utf8), limits: KVLimits())
        #expect(mine.stamp.time > future)
        #expect(try store.keyValues.entry("x")?.value == Array("after".utf8))
        // A peer's value that is not in canonical form is refused, not stored.
        let merged = try store.keyValues.merge([KVEntry(key: "y", type: .integer, value: Array(" 3".utf8),
                                                stamp: KVStamp(time: future, device: DeviceID(hex: "ffffffffffffffff")!), isTombstone: false)])
        #expect(merged.rejected.count == 1 && merged.changes.isEmpty)
        #expect(try store.keyValues.entry("y") == nil)
    }

    @Test func stateSurvivesReopenAndPublishingIsTracked() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        do {
            let store = try Store(directory: dir.path, deviceName: "one")
            #expect(try !(store.keyValues.unpublished() != nil))
            try store.keyValues.set("color", type: .integer, content: Array("2".utf8), limits: KVLimits())
            #expect(try (store.keyValues.unpublished() != nil))
            try store.commitBatch()
        }
        let store = try Store(directory: dir.path)
        #expect(try store.keyValues.entry("color")?.value == Array("2\n".utf8))
        #expect(try (store.keyValues.unpublished() != nil))
        #expect(try store.keyValues.ownEntries().map(\.key) == ["color"])
        // A publication covers the writes read for it, not one made meanwhile.
        let mark = try #require(try store.keyValues.unpublished())
        try store.keyValues.set("other", type: .string, content: [], limits: KVLimits())
        try store.keyValues.published(mark)
        #expect(try (store.keyValues.unpublished() != nil))
        try store.keyValues.published(try #require(try store.keyValues.unpublished()))
        #expect(try !(store.keyValues.unpublished() != nil))
        // Another device's win takes the key out of this device's own entries.
        _ = try store.keyValues.merge([KVEntry(key: "color", type: .integer, value: Array("1\n".utf8),
                                       stamp: KVStamp(time: nowNanos() + 1_000_000_000_000, device: DeviceID(hex: "ffffffffffffffff")!),
                                       isTombstone: false)])
        #expect(try store.keyValues.ownEntries().map(\.key) == ["other"])
        // A stamp more than 30 days ahead (a broken clock) is refused: it would win forever.
        let far = try store.keyValues.merge([KVEntry(key: "color", type: .integer, value: Array("9\n".utf8),
                                             stamp: KVStamp(time: nowNanos() + 31 * 86_400 * 1_000_000_000, device: DeviceID(hex: "eeeeeeeeeeeeeeee")!),
                                             isTombstone: false)])
        #expect(far.changes.isEmpty && far.rejected.count == 1)
        #expect(try store.keyValues.entry("color")?.value == Array("1\n".utf8))
    }
}
