import Testing
import TestSupport
import UbiquitySystem
@testable import UbiquityStore

/// The lock order (`LockRank`) is checked in debug builds, which the tests run: a lock
/// taken out of order traps, at once and not only when a deadlock happens to form.
@Suite struct LockRankTests {
    @Test func locksInOrderAreTaken() {
        let filesystem = Locked(0, rank: .filesystem), store = Locked(0, rank: .store), leaf = Locked(0, rank: .leaf)
        let sum = filesystem.withLock { a in store.withLock { b in leaf.withLock { c in a + b + c } } }
        #expect(sum == 0)
        // Released in turn: the same order can be taken again, and a lower rank alone.
        store.withLock { _ in leaf.withLock { _ in } }
        filesystem.withLock { _ in }
    }

    /// A file is opened under the filesystem's and the store's locks: its content (and its
    /// reserved ranges, t-fallocate.sh) is made without taking its own lock, which comes
    /// first in the order.
    @Test func aFileWithAReserveOpensUnderTheStoresLock() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let chunks = try ChunkStore(directory: dir.path + "/chunks")
        let filesystem = Locked(0, rank: .filesystem), store = Locked(0, rank: .store)
        let content = filesystem.withLock { _ in
            store.withLock { _ in
                FileContent(base: ChunkList(), chunks: chunks, stagingDirectory: dir.path, reserved: [0..<8192])
            }
        }
        #expect(content.reservation.ranges == [0..<8192])
        #expect(content.reservedHoleBytes == 8192)
    }

    @Test func theStoresLockUnderALeafTraps() async {
        await #expect(processExitsWith: .failure) {
            let leaf = Locked(0, rank: .leaf), store = Locked(0, rank: .store)
            leaf.withLock { _ in store.withLock { _ in } }
        }
    }

    /// The index's lock, lent under the store's lock and held after it goes, is still
    /// noted: the store's lock taken before the index is let go traps (a holder of the
    /// store's lock that claims the connection would wait for this thread forever).
    @Test func theStoresLockWhileTheIndexIsLentTraps() async {
        await #expect(processExitsWith: .failure) {
            let store = Locked(0, rank: .store), index = IndexLock()
            store.withLock { _ in index.lend() }
            store.withLock { _ in }
        }
    }

    @Test func theIndexLentAndLetGoLeavesTheOrderAsItWas() {
        let store = Locked(0, rank: .store), index = IndexLock()
        store.withLock { _ in index.lend() }
        index.giveBack()
        store.withLock { _ in }
    }

    @Test func theFilesystemsLockUnderTheStoresTraps() async {
        await #expect(processExitsWith: .failure) {
            let filesystem = Locked(0, rank: .filesystem), store = Locked(0, rank: .store)
            store.withLock { _ in filesystem.withLock { _ in } }
        }
    }
}
