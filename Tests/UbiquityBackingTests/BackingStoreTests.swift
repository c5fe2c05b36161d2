import Glibc
import Synchronization
import Testing
import TestSupport
@testable import UbiquityBacking

@Suite struct BackingStoreTests {
    @Test(arguments: [41, UInt64.random(in: 100...UInt64.max)])
    func directoryConforms(seed: UInt64) throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        print("BackingStoreTests.directoryConforms seed \(seed)")
        try BackingConformance.run(DirectoryStore(root: dir.path), "directory", seed: seed)
    }

    @Test(arguments: [42, UInt64.random(in: 100...UInt64.max)])
    func memoryConforms(seed: UInt64) throws {
        print("BackingStoreTests.memoryConforms seed \(seed)")
        try BackingConformance.run(MemoryStore(), "memory", seed: seed)
    }

    @Test func directoryOfflineIsTransientNotMissing() throws {
        let store = DirectoryStore(root: "/nonexistent-ubiquity-backing")
        let key = BackingKey(checked: "x")
        do { _ = try store.get(key); Issue.record("get succeeded") } catch { #expect(error.isRetryable, "\(error)") }
        do { try store.put(key, [1]); Issue.record("put succeeded") } catch { #expect(error.isRetryable, "\(error)") }
        do { _ = try store.list(prefix: "", after: nil, limit: 10); Issue.record("list succeeded") } catch { #expect(error.isRetryable) }
    }

    @Test func directoryNeverListsTempFilesAndRefusesHugeObjects() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let store = DirectoryStore(root: dir.path, maxObjectSize: 100)
        try store.put(BackingKey(checked: "a/b"), [1, 2, 3])
        // A writer that died mid-put leaves a temp file: never listed, never an object.
        let fd = open(dir.path + "/a/.tmp-dead", O_WRONLY | O_CREAT, 0o644)
        close(fd)
        #expect(try store.listAll(prefix: "").map(\.key.path) == ["a/b"])
        try store.put(BackingKey(checked: "big"), [UInt8](repeating: 7, count: 200))
        #expect(throws: BackingError.self) { try store.get(BackingKey(checked: "big")) }
        #expect(try store.get(BackingKey(checked: "big"), range: 190..<300) == [UInt8](repeating: 7, count: 10))
    }

    /// The log's idle poll lists after a cursor near its end: the directory store looks
    /// (lstat, sort) only at names that can come after it, so the poll's work follows the
    /// new segments, not the log's length (it was every entry of `log/`).
    @Test func aListingAfterACursorLooksOnlyAtTheNamesAfterIt() throws {
        for count in [100, 1_000] {
            let names = (0..<count).map { pad(String(1_000 + $0), 13) + "-00000000000000aa-" + pad(String($0 + 1, radix: 16), 16) }.shuffled()
            let last = pad(String(1_000 + count - 5), 13)
            let looked = DirectoryStore.candidates(names, directory: "log/", prefix: "log/", after: "log/" + last)
            #expect(looked.count == 5, "\(count) names: looked at \(looked.count)")
            // Outside the prefix nothing is looked at; a directory on the way is.
            #expect(DirectoryStore.candidates(names, directory: "", prefix: "objects/", after: nil).isEmpty)
            #expect(DirectoryStore.candidates(["log", "objects", "a"], directory: "", prefix: "log/", after: "log/" + last)
                == [.init(name: "log", asFile: false, asDirectory: true)])
        }
        // Through a real directory: the same keys as a listing of everything, filtered.
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let store = DirectoryStore(root: dir.path)
        for i in 0..<50 { try store.put(BackingKey(checked: "log/" + pad(String(i), 4)), [UInt8(i)]) }
        try store.put(BackingKey(checked: "log-x"), [1])
        try store.put(BackingKey(checked: "log/0030-dir/deeper"), [2])
        let all = try store.listAll(prefix: "").map(\.key.path)
        let after = try store.list(prefix: "log/", after: BackingKey(checked: "log/0030"), limit: 100)
        #expect(after.objects.map(\.key.path) == all.filter { $0.hasPrefix("log/") && $0 > "log/0030" })
        #expect(after.objects.first?.key.path == "log/0030-dir/deeper" && after.objects.first?.size == 1)
    }

    private func pad(_ text: String, _ width: Int) -> String { String(repeating: "0", count: max(0, width - text.count)) + text }

    @Test func keysAreChecked() {
        for bad in ["", "/a", "a/", "a//b", ".", "a/./b", "../a", "a/..", "a\u{0}b", String(repeating: "x", count: 1025)] {
            #expect(BackingKey(bad) == nil, "\(bad.prefix(20))")
        }
        for good in ["a", "a/b", "a.b/.c/d..", "objects/ab/cdef"] { #expect(BackingKey(good) != nil, "\(good)") }
        #expect(BackingKey(checked: "a-b") < BackingKey(checked: "a/x"), "byte order")
    }

    /// Faults: a failed put leaves nothing; the retrying wrapper retries transient ones a
    /// bounded number of times with growing delays, and passes permanent ones at once.
    @Test func retriesAreBoundedAndOnlyForTransientErrors() throws {
        let memory = MemoryStore()
        let key = BackingKey(checked: "k")
        let failures = Counter()
        memory.setFault { op, _ in failures.next() < 3 && op == .put ? .transient("injected reset") : nil }
        let delays = Recorder()
        let store = RetryingStore(memory, attempts: 5, firstDelay: 0.1, maxDelay: 1, sleep: { delays.add($0) })
        try store.put(key, [9])
        #expect(try memory.get(key) == [9])
        #expect(memory.counts.of(.put) == 4, "three failures, then success")
        #expect(delays.values.count == 3 && delays.values.allSatisfy { $0 >= 0 && $0 <= 1 })

        memory.setFault { _, _ in .transient("always down") }
        memory.resetCounts()
        #expect(throws: BackingError.transient("always down")) { try store.get(key) }
        #expect(memory.counts.of(.get) == 5, "bounded attempts")

        memory.setFault { _, _ in .permanent("403 AccessDenied") }
        memory.resetCounts()
        #expect(throws: BackingError.permanent("403 AccessDenied")) { try store.get(key) }
        #expect(memory.counts.of(.get) == 1, "a permanent error is not retried")
    }

    @Test func listingThatNeverEndsIsCut() throws {
        struct Endless: BackingStore {
            var location: String { "endless" }
            func put(_ key: BackingKey, _ bytes: [UInt8], ifAbsent: Bool) throws(BackingError) {}
            func get(_ key: BackingKey, range: Range<Int64>?) throws(BackingError) -> [UInt8] { [] }
            func stat(_ key: BackingKey) throws(BackingError) -> ObjectInfo? { nil }
            func delete(_ key: BackingKey) throws(BackingError) {}
            func list(prefix: String, after: BackingKey?, limit: Int) throws(BackingError) -> ObjectListing {
                // Always the same page, claiming more: a broken server.
                ObjectListing(objects: [ObjectInfo(key: BackingKey(checked: "same"), size: 1)], more: true)
            }
        }
        #expect(throws: BackingError.self) { try Endless().listAll(prefix: "") }
    }
}

final class Counter: Sendable {
    private let value = Mutex(0)
    func next() -> Int { value.withLock { v in defer { v += 1 }; return v } }
}

final class Recorder: Sendable {
    private let stored = Mutex<[Double]>([])
    func add(_ v: Double) { stored.withLock { $0.append(v) } }
    var values: [Double] { stored.withLock { $0 } }
}
