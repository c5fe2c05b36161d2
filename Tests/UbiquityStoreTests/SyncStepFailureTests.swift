import Testing
import TestSupport
@testable import UbiquityStore

/// A sync step is one transaction: when it fails, the rollback puts back in the `pending`
/// table what the step took of the change set, and the sets in memory are read again.
@Suite struct SyncStepFailureTests {
    /// Regression: when reading the sets again failed too (a second failure right after
    /// the first, as on a full disk), the error was dropped. The set in memory then lacked
    /// the directory the step had taken, and the directory never got a record: it was
    /// never synced. Now no step runs until the sets are read.
    @Test func aChangeIsRecordedAfterAStepAndItsReloadFail() throws {
        var failedSteps = 0
        for k in 1...40 {
            let dir = TempDirectory()
            defer { dir.cleanup() }
            let store = try Store(directory: dir.path, deviceName: "a")
            _ = try store.create(parent: Store.rootInode, name: "docs", kind: .directory, mode: 0o755, uid: 1, gid: 1)
            let start = store.db.statements
            store.db.failingStatements = [start + k, start + k + 1]
            do { try store.recordLocalChanges(busy: []) } catch { failedSteps += 1 }
            store.db.failingStatements = []
            try store.recordLocalChanges(busy: [])
            let records = try store.db.rows("SELECT count(*) FROM versions WHERE path = 'docs'", []) { $0.int(0) }
            #expect(records == [1], "the step failed at its statement \(k) and \(k + 1)")
        }
        #expect(failedSteps > 10, "the failures must land inside the step")
    }
}
