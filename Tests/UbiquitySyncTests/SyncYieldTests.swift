import Glibc
import Synchronization
import Testing
import TestSupport
import UbiquityBacking
import UbiquitySystem
@testable import UbiquityFS
@testable import UbiquityStore
@testable import UbiquitySync

/// Sync is background work: the store's lock is the requests' first. A cycle of the loop
/// that finds a request waiting for the lock after a slice of its local changes ends
/// there, and the rest waits for a later cycle (`SyncEngine.withLocalChangesRecorded`);
/// the loop stops putting cycles off `Store.syncMayWait` after the last whole one.
/// Counted in slices and records, not timed.
@Suite struct SyncYieldTests {
    /// 200 directories made: four slices of local changes.
    static func device(_ temp: TempDirectory, _ backing: MemoryStore) throws -> SimDevice {
        let d = try SimDevice(name: "a", root: temp.path, backing: backing, clock: nowNanos)
        for i in 0..<200 { _ = try d.fs.mkdir(parent: Store.rootInode, name: "d\(i)", mode: 0o755, caller: d.me) }
        return d
    }

    /// Makes a thread wait for the store's lock while the first slice holds it, the way a
    /// request comes in the middle of a slice: the hook that gives a step the busy files
    /// runs under the lock at each slice's start.
    static func requestDuringTheFirstSlice(of d: SimDevice) -> @Sendable () -> Void {
        let shared = d.fs.store
        let waiter = Locked<JoinableThread?>(nil)
        shared.provideBusyFiles {
            waiter.withLock { w in
                guard w == nil else { return }
                w = JoinableThread { shared.withNamespaceLock { _ in } }
                while !shared.hasWaiters { usleep(50) }
            }
            return []
        }
        return { waiter.withLock { $0?.join() } }
    }

    @Test func aRequestWaitingForASliceEndsTheCycle() throws {
        let temp = TempDirectory()
        defer { temp.cleanup() }
        let backing = MemoryStore()
        let d = try Self.device(temp, backing)
        let joinWaiter = Self.requestDuringTheFirstSlice(of: d)

        let changed = d.fs.store.withLock { $0.changed.count } // the directories and the root
        #expect(changed > 3 * Store.changesPerSlice)
        let ran = try d.engine.cycle(pushPull: true, yielding: true)
        joinWaiter()
        #expect(!ran, "a request waited: the cycle ends after the slice")
        let left = d.fs.store.withLock { $0.changed.count }
        #expect(left == changed - Store.changesPerSlice, "one slice recorded, the rest waits in the change set")
        #expect(backing.counts.of(.put) == 0, "nothing went out in the cycle that ended early")

        // Nobody waits now: the next cycle records the rest and pushes it all.
        #expect(try d.engine.cycle(pushPull: true, yielding: true))
        #expect(d.fs.store.withLock { $0.changed.isEmpty })
        #expect(d.fs.store.withLock { $0.pendingUploadCount } == 0)
        let b = try SimDevice(name: "b", root: temp.path, backing: backing, clock: nowNanos)
        b.cycle()
        #expect(try b.tree().count == 200)
    }

    /// A cycle that may not wait (asked for by `ubiquity sync`, or the loop's wait is
    /// over) records everything however many requests wait.
    @Test func aCycleThatMayNotWaitRunsWhole() throws {
        let temp = TempDirectory()
        defer { temp.cleanup() }
        let backing = MemoryStore()
        let d = try Self.device(temp, backing)
        let joinWaiter = Self.requestDuringTheFirstSlice(of: d)

        let ran = try d.engine.cycle(pushPull: true, yielding: false)
        joinWaiter()
        #expect(ran)
        #expect(d.fs.store.withLock { $0.changed.isEmpty && $0.pendingUploadCount == 0 })
    }

    /// `ubiquity sync` while requests keep the lock busy (a thread waits at the end of every
    /// slice): the cycle it asks for runs whole. A cycle that puts its work off must never
    /// take the request with it, or the request would be counted done with nothing sent.
    @Test func aRequestedSyncRunsWholeWhileRequestsWait() throws {
        let temp = TempDirectory()
        defer { temp.cleanup() }
        let backing = MemoryStore()
        let d = try Self.device(temp, backing)
        let shared = d.fs.store
        let waiters = Locked<[JoinableThread]>([])
        shared.provideBusyFiles {
            let waiter = JoinableThread { shared.withNamespaceLock { _ in } }
            while !shared.hasWaiters { usleep(50) }
            waiters.withLock { $0.append(waiter) }
            return []
        }
        d.engine.start()
        try d.engine.requestSync()
        func status(_ key: String) -> Int? {
            d.engine.statusText().split(separator: "\n").first { $0.hasPrefix(key + "=") }.flatMap { Int($0.dropFirst(key.count + 1)) }
        }
        let deadline = monotonicNanos() + 60_000_000_000
        while (status("requests-done") ?? 0) < 1 && monotonicNanos() < deadline { usleep(10_000) }
        let done = status("requests-done") ?? 0
        let recorded = shared.withLock { $0.changed.isEmpty && $0.pendingUploadCount == 0 }
        d.engine.stop()
        shared.provideBusyFiles(nil)
        for waiter in waiters.withLock({ $0 }) { waiter.join() }
        #expect(done >= 1, "the requested sync was not done within 60 s")
        #expect(recorded, "the requested sync was counted done with local changes not recorded or not sent")
    }

    /// The loop's wait ends: requests put cycles off for at most twice the group commit's
    /// longest wait after the last cycle that ran whole.
    @Test func theWaitIsBounded() throws {
        let temp = TempDirectory()
        defer { temp.cleanup() }
        let d = try Self.device(temp, MemoryStore())
        let age = d.store.foldPolicy.age
        let now = monotonicNanos()
        #expect(d.store.syncMayWait(since: now - age, now: now))
        #expect(!d.store.syncMayWait(since: now - 2 * age, now: now))
    }
}
