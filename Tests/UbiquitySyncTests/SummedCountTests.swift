import Testing
import TestSupport
import UbiquityBacking
@testable import UbiquityFS
@testable import UbiquityStore
@testable import UbiquitySync

/// A batch of records (`Replica.deferringConflicts`: a pull slice, a fold) sums the
/// directories' `below` counts in memory and writes each once at its end. What it sums
/// must be what the table would say: the view as kept equals the view built again from
/// the records.
@Suite struct SummedCountTests {
    /// A device's own records not uploaded yet, as another device takes them in.
    static func records(of device: SimDevice) throws -> [SyncRecord] {
        try device.fs.withMetaLock { (_, store) throws(StoreError) -> [SyncRecord] in
            try store.commitBatch()
            try store.recordLocalChanges(busy: [])
            return try store.pendingUploads(limit: 1000)
        }
    }

    static func devices(_ temp: TempDirectory, _ backing: MemoryStore) throws -> (SimDevice, SimDevice) {
        (try SimDevice(name: "a", root: temp.path, backing: backing, clock: nowNanos, options: SimDevice.alwaysPolling),
         try SimDevice(name: "b", root: temp.path, backing: backing, clock: nowNanos, options: SimDevice.alwaysPolling))
    }

    /// A savepoint that rolls back inside the batch (its error caught) undoes rows whose
    /// counts the batch had summed: the batch's end counts those directories again from
    /// the table (without that, `new` kept a `below` of 3 for its 2 files).
    @Test func aRolledBackSavepointInsideTheBatchLeavesTheCountsRight() throws {
        let temp = TempDirectory(prefix: "ubiquity-summed")
        defer { temp.cleanup() }
        let backing = MemoryStore()
        let (a, b) = try Self.devices(temp, backing)
        try a.save("old/kept.txt", "kept")
        for _ in 0..<3 { a.cycle(); b.cycle() }
        try a.save("new/deep/one.txt", "1")
        try a.save("new/deep/two.txt", "2")
        try a.save("new/three.txt", "3")
        let files = try Self.records(of: a).filter { $0.kind == .file }.sorted { $0.path < $1.path }
        #expect(files.map(\.path) == ["new/deep/one.txt", "new/deep/two.txt", "new/three.txt"])
        try b.fs.withMetaLock { (_, store) throws(StoreError) in
            try store.commitBatch()
            try store.db.transaction { () throws(StoreError) in
                try store.replica.deferringConflicts { () throws(StoreError) in
                    _ = try store.insert(files[0], from: .otherDevice)
                    do {
                        try store.db.transaction { () throws(StoreError) in
                            _ = try store.insert(files[1], from: .otherDevice)
                            throw StoreError.database("rolled back on purpose")
                        }
                    } catch {}
                    _ = try store.insert(files[2], from: .otherDevice)
                }
            }
            let (kept, rebuilt) = try store.viewAsKeptAndRebuilt()
            #expect(kept == rebuilt, "\(Set(kept).symmetricDifference(rebuilt).sorted())")
            #expect(kept.contains("path new in : 0 nodes, 2 below"))
        }
    }

    /// Without a rollback, the sums are written as they are: a batch of removals and
    /// additions across directories leaves the view as a rebuild makes it.
    @Test func aBatchOfAddsAndRemovalsLeavesTheCountsRight() throws {
        let temp = TempDirectory(prefix: "ubiquity-summed")
        defer { temp.cleanup() }
        let backing = MemoryStore()
        let (a, b) = try Self.devices(temp, backing)
        for i in 0..<6 { try a.save("x/y/f\(i).txt", "\(i)") }
        for _ in 0..<4 { a.cycle(); b.cycle() }
        let dir = try #require(try a.directory("x/y", create: false))
        for i in 0..<6 { try a.fs.unlink(parent: dir, name: "f\(i).txt") }
        try a.save("x/z/g.txt", "g")
        // b takes all of it in one slice: six tombstones and a new file, then reconciles.
        for _ in 0..<4 { a.cycle() }
        var options = SimDevice.alwaysPolling
        options.pullSlice = 100
        options.pullSliceMost = 100
        let c = try SimDevice(name: "c", root: temp.path, backing: backing, clock: nowNanos, options: options)
        c.cycle()
        c.cycle()
        for device in [b, c] {
            device.cycle()
            device.cycle()
            let (kept, rebuilt) = try device.fs.withMetaLock { (_, store) throws(StoreError) in try store.viewAsKeptAndRebuilt() }
            #expect(kept == rebuilt, "\(device.name): \(Set(kept).symmetricDifference(rebuilt).sorted())")
            #expect(try device.tree().keys.sorted() == ["x", "x/y", "x/z", "x/z/g.txt"])
        }
    }
}
