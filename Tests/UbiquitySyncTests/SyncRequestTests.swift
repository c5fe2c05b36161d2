import Glibc
import Testing
import TestSupport
import UbiquitySystem
@testable import UbiquityFS
@testable import UbiquityStore
@testable import UbiquitySync

/// `ubiquity sync` through the control attribute: the write returns at once (the kernel
/// holds the mount root's inode lock while it is answered), and the status's
/// `requests-done` reaches `requests` once a cycle that covers the request has ended.
@Suite struct SyncRequestTests {
    static func status(_ engine: SyncEngine) -> [String: Int] {
        var result: [String: Int] = [:]
        for line in engine.statusText().split(separator: "\n") {
            let parts = line.split(separator: "=", maxSplits: 1)
            if parts.count == 2, let n = Int(parts[1]) { result[String(parts[0])] = n }
        }
        return result
    }

    @Test func aRequestReturnsAtOnceAndItsCycleIsReported() throws {
        let temp = TempDirectory(prefix: "ubiquity-sync-request")
        defer { temp.cleanup() }
        mkdir(temp.path + "/backing", 0o755)
        let d = try SimDevice(name: "one", root: temp.path, backing: temp.path + "/backing", clock: nowNanos)
        try d.save("a.txt", "to upload")
        var options = SyncEngine.Options()
        options.pollSeconds = 3600 // only requests make it cycle
        let engine = SyncEngine(store: d.fs.store, backingDirectory: d.link, options: options)
        d.fs.attach(sync: engine)
        engine.start()
        defer { engine.stop() }
        // Hold the filesystem's lock: a request answered when its cycle ends could not return.
        let held = Locked(true)
        let holder = JoinableThread { [fs = d.fs] in fs.meta.withLock { _, _ in while held.withLock({ $0 }) { usleep(1_000) } } }
        usleep(50_000)
        let before = Self.status(engine)["requests"] ?? -1
        #expect(try d.fs.control(Store.rootInode, name: FileSystem.controlAttribute, value: Array("sync".utf8)))
        let asked = Self.status(engine)["requests"] ?? -1
        #expect(asked == before + 1)
        #expect((Self.status(engine)["requests-done"] ?? 0) < asked, "the cycle cannot have run while the lock is held")
        held.withLock { $0 = false }
        holder.join()
        for _ in 0..<200 where (Self.status(engine)["requests-done"] ?? 0) < asked { usleep(10_000) }
        #expect((Self.status(engine)["requests-done"] ?? 0) >= asked)
    }
}
