import Glibc
import Testing
import TestSupport
import UbiquityBacking
import UbiquitySystem
@testable import UbiquityFS
@testable import UbiquityStore
@testable import UbiquitySync

/// `ubiquity fsck --backing`: a store two devices synced through checks clean; each kind
/// of damage is reported (a chunk's bytes in a pack, a pack's index, a record line, a
/// place naming nothing, a missing segment), and the check changes nothing.
@Suite struct BackingCheckTests {
    @Test func aSyncedStoreIsCleanAndEachDamageIsFound() throws {
        let temp = TempDirectory()
        defer { temp.cleanup() }
        let memory = MemoryStore()
        let a = try SimDevice(name: "a", root: temp.path, backing: memory, clock: nowNanos)
        let b = try SimDevice(name: "b", root: temp.path, backing: memory, clock: nowNanos)
        try a.save("big.txt", String(repeating: "large content ", count: 20_000))
        try a.save("small.txt", "small")
        try a.engine.syncNow()
        try b.save("other.txt", String(repeating: "more content ", count: 9_000))
        try b.engine.syncNow()
        try b.save("second.txt", "b's second segment")
        try b.engine.syncNow()
        try a.engine.syncNow()
        _ = try a.engine.checkpointJournal(force: true)
        try a.save("after.txt", "after the checkpoint")
        try a.engine.syncNow()

        let clean = try BackingCheck.run(store: memory, full: true)
        #expect(clean.problems.isEmpty, "\(clean.problems)")
        #expect(clean.packs >= 2 && clean.segments >= 3 && clean.checkpoints >= 1 && clean.places >= 2, "\(clean.summary)")
        let before = memory.snapshot

        // A flipped byte inside a chunk of a pack: only the full check reads chunks.
        let pack = before.keys.first { $0.path.hasPrefix("packs/") }!
        var damaged = before[pack]!
        damaged[20] ^= 0xff
        try memory.put(pack, damaged)
        #expect(try BackingCheck.run(store: memory).problems.isEmpty)
        #expect(try BackingCheck.run(store: memory, full: true).problems.contains { $0.contains("does not match") })
        try memory.put(pack, before[pack]!)

        // A pack whose index trailer is gone.
        try memory.put(pack, Array(before[pack]!.dropLast(4)))
        let noIndex = try BackingCheck.run(store: memory)
        #expect(noIndex.problems.contains { $0.contains("pack") && $0.contains("trailer") }, "\(noIndex.problems)")
        #expect(noIndex.problems.contains { $0.contains("no such chunk in the packs") }, "\(noIndex.problems)")
        try memory.put(pack, before[pack]!)

        // A record line that does not check, and a missing segment.
        let segments = before.keys.filter { $0.path.hasPrefix("log/") }.sorted()
        let last = segments.last!
        try memory.put(last, before[last]! + Array("U2 0000 not a record\n".utf8))
        #expect(try BackingCheck.run(store: memory).problems.contains { $0.contains(last.path) && $0.contains("line") })
        try memory.put(last, before[last]!)
        // b wrote no checkpoint: its first segment gone is a gap.
        let first = segments.first { SegmentLog.SegmentName(key: $0).map { $0.device == b.store.deviceID && $0.seq == 1 } ?? false }!
        try memory.delete(first)
        let gap = try BackingCheck.run(store: memory)
        #expect(gap.problems.contains { $0.contains("device \(b.store.deviceID)") && $0.contains("missing") }, "\(gap.problems)")
        try memory.put(first, before[first]!)
        #expect(memory.snapshot == before, "the check changed the store")
        #expect(try BackingCheck.run(store: memory, full: true).problems.isEmpty)
    }
}

/// A key-value file the writer could not delete (its DELETE failed) goes at the next gc;
/// the newest stays.
@Suite struct KeyValueFileCollectionTests {
    @Test func olderKeyValueFilesGoAtGc() throws {
        let temp = TempDirectory()
        defer { temp.cleanup() }
        let memory = MemoryStore()
        let a = try SimDevice(name: "a", root: temp.path, backing: memory, clock: nowNanos)
        try a.kvSet("k", 1)
        try a.engine.syncNow()
        // The next publish's DELETE of generation 1 fails: both files are left.
        memory.setFault { op, key in op == .delete && key?.path.contains("keyvalue-") == true ? .transient("injected") : nil }
        try a.kvSet("k", 2)
        try a.engine.syncNow()
        memory.setFault(nil)
        let files = { memory.snapshot.keys.filter { $0.path.contains("/keyvalue-") }.map(\.path).sorted() }
        #expect(files().count == 2, "\(files())")
        _ = try BackingCollector(backing: a.engine.backing).run(now: Int64(time(nil)))
        #expect(files() == [Backing.keyValueKey(a.store.deviceID, generation: 2).path], "\(files())")
    }
}
