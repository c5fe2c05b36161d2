import Testing
import TestSupport
@testable import UbiquityFS
@testable import UbiquityStore
@testable import UbiquitySync

/// A pull slice (`Store.takeIn`) that fails on the way, after the group-commit batch it
/// commits first folded this device's own saves.
@Suite struct TakeInFailureTests {
    /// Regression: the batch's fold ran while the slice's memo was open, so what the
    /// saves added to the `.versions/` directories above them went to the slice's sums.
    /// The fold committed; the slice failed and its sums went with it, so `history_dirs`
    /// lacked those directories' counts for good. The slice fails here at each of its
    /// first statements in turn.
    @Test func aFailedSliceKeepsTheVersionsDirectoriesOfSavesItFolded() throws {
        var overlaysFolded = 0
        for k in 1...60 {
            let temp = TempDirectory(prefix: "ubiquity-takein")
            defer { temp.cleanup() }
            let backing = temp.path + "/backing"
            let a = try SimDevice(name: "a", root: temp.path, backing: backing, clock: nowNanos)
            try a.save("p/q/one", "from a")
            a.cycle()
            let records = try a.fs.withMetaLock { (_, store) throws(StoreError) in try store.ownRecords("1 = 1", after: 0, limit: 100).map(\.record) }
            let b = try SimDevice(name: "b", root: temp.path, backing: backing, clock: nowNanos)
            try b.save("x/y/z", "from b")
            let waiting = try b.fs.withMetaLock { (_, store) throws(StoreError) in !store.overlay.isEmpty }
            #expect(waiting, "b's save must wait in the overlay for the slice to fold it")
            let failing = b.store.db.statements + k
            b.store.db.failingStatements = [failing]
            _ = try? b.fs.withMetaLock { (_, store) throws(StoreError) in try store.takeIn(records, busy: []) }
            b.store.db.failingStatements = []
            if try b.fs.withMetaLock({ (_, store) throws(StoreError) in store.overlay.isEmpty }) { overlaysFolded += 1 }
            b.cycle()
            b.cycle()
            let (kept, rebuilt) = try b.fs.withMetaLock { (_, store) throws(StoreError) -> ([String], [String]) in
                let db = store.db
                let read = { () throws(StoreError) -> [String] in
                    try db.rows("SELECT parent, name, leaves, total FROM history_dirs ORDER BY parent, name", []) {
                        "\($0.text(0))/\($0.text(1)) \($0.int(2)) \($0.int(3))"
                    }
                }
                let kept = try read()
                try db.query("DELETE FROM history_dirs")
                try Store.buildHistoryDirectories(db)
                return (kept, try read())
            }
            #expect(kept == rebuilt, "the slice failed at its statement \(k)")
        }
        #expect(overlaysFolded > 10, "the failures must land after the batch's fold")
    }
}
