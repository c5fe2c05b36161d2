import Glibc
import Synchronization
import Testing
import TestSupport
@testable import UbiquityBacking
import UbiquitySystem

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

    /// A directory store on a local disk keeps the names of the directories it lists
    /// (inotify) instead of reading them again at every LIST. Random puts and deletes
    /// through it, through another store on the same directory (another device) and
    /// behind both (files and directories made, renamed over, exchanged, moved away and
    /// removed; the whole directory swapped with another) between random LISTs: every LIST equals what a store that reads everything sees,
    /// and a LIST after only such changes reads no directory.
    @Test(arguments: [43, UInt64.random(in: 100...UInt64.max)])
    func keptListingsFollowEveryChange(seed: UInt64) throws {
        let seed = replayableSeed(seed, variable: "UBQ_LISTING_SEED", test: "BackingStoreTests.keptListingsFollowEveryChange", filter: "keptListings")
        var rng = SplitMix64(seed: seed)
        let dir = TempDirectory()
        defer { dir.cleanup(); removeTree(dir.path + "-spare") }
        let store = DirectoryStore(root: dir.path), other = DirectoryStore(root: dir.path)
        let names = ["log/a", "log/b", "log/a-b", "log/a/x", "log/c/d/e", "log/é", "packs/p1", "x"]
        func listAll(_ s: DirectoryStore, after: String?) throws -> [String] {
            var keys: [String] = []
            var cursor = after.map { BackingKey(checked: $0) }
            while true {
                let page = try s.list(prefix: "", after: cursor, limit: 3)
                keys += page.objects.map(\.key.path)
                guard page.more, let last = page.objects.last else { return keys }
                cursor = last.key
            }
        }
        _ = try listAll(store, after: nil)
        for step in 0..<400 {
            let name = names.randomElement(using: &rng)!
            let path = dir.path + "/" + name
            switch rng.next() % 9 {
            case 0: try? store.put(BackingKey(checked: name), [1])
            case 1: try? other.put(BackingKey(checked: name), [2])
            case 2: try? store.delete(BackingKey(checked: name))
            case 3: _ = unlink(path)
            case 4: // a directory appears or goes, with what it holds
                let top = dir.path + "/" + name.split(separator: "/").prefix(2).joined(separator: "/")
                removeTree(top)
            case 5: // moved away and back under another name
                let moved = dir.path + "/moved-\(step)"
                if rename(path, moved) == 0 { _ = rename(moved, dir.path + "/" + names.randomElement(using: &rng)!) }
            case 6: _ = mkdir(dir.path + "/log/newdir-\(step % 3)", 0o755)
            case 7: // two names swap places (four move events), maybe across directories
                try? exchangePaths(path, dir.path + "/" + names.randomElement(using: &rng)!)
            default: // the whole directory swapped with another one (no event reaches the watches below it)
                let spare = dir.path + "-spare", aside = dir.path + "-aside"
                _ = mkdir(spare, 0o755)
                _ = mkdir(spare + "/log", 0o755)
                if rng.next() % 2 == 0 { close(open(spare + "/log/s\(step)", O_WRONLY | O_CREAT, 0o644)) }
                #expect(rename(dir.path, aside) == 0 && rename(spare, dir.path) == 0 && rename(aside, spare) == 0)
            }
            let after = rng.next() % 2 == 0 ? nil : names.randomElement(using: &rng)!
            let kept = try listAll(store, after: after)
            let fresh = try listAll(DirectoryStore(root: dir.path), after: after)
            #expect(kept == fresh, "step \(step), after \(after ?? "nil"): kept \(kept), fresh \(fresh)")
        }
        // Nothing changed: no directory read; a change by another store: none either. The
        // steps may have left no `log/`: a put makes it, and the first LIST after reads it
        // once (a directory that is new must be read), before the count starts.
        try other.put(BackingKey(checked: "log/early"), [3])
        _ = try listAll(store, after: nil)
        let reads = store.listings.reads
        _ = try listAll(store, after: nil)
        try other.put(BackingKey(checked: "log/late"), [3])
        #expect(try listAll(store, after: "log/b").contains("log/late"))
        #expect(store.listings.reads == reads, "a kept listing reads no directory")
    }

    /// More events than inotify queues (16,384 here) between two LISTs: the listings are
    /// read again, not trusted.
    @Test func anOverflowedQueueReadsTheDirectoryAgain() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let store = DirectoryStore(root: dir.path)
        try store.put(BackingKey(checked: "log/first"), [1])
        #expect(try store.listAll(prefix: "log/").count == 1)
        let before = store.listings.reads
        #expect(try store.listAll(prefix: "log/").count == 1)
        #expect(store.listings.reads == before, "the listing is kept before the flood")
        let limit = ((try? readFile("/proc/sys/fs/inotify/max_queued_events", limit: 64)) ?? nil)
            .flatMap { Int(String(decoding: $0.filter { $0 >= 48 && $0 <= 57 }, as: UTF8.self)) } ?? 16_384
        for i in 0...(limit / 2 + 1) { // a create and a delete event each, and the last one stays
            let path = dir.path + "/log/f\(i)"
            close(open(path, O_WRONLY | O_CREAT, 0o644))
            if i <= limit / 2 { unlink(path) }
        }
        let reads = store.listings.reads
        #expect(try store.listAll(prefix: "log/").map(\.key.path) == ["log/f\(limit / 2 + 1)", "log/first"])
        #expect(store.listings.reads > reads, "read again after the overflow")
    }

    /// `mayFollow` drops only names no key after the cursor can be at or below: the
    /// candidates of the kept (sorted) names equal those of all names, for random names
    /// and cursors.
    @Test(arguments: [44, UInt64.random(in: 100...UInt64.max)])
    func namesBeforeTheCursorAreSkippedOnlyWhenNothingAfterItIsThere(seed: UInt64) {
        print("BackingStoreTests.namesBeforeTheCursorAreSkippedOnlyWhenNothingAfterItIsThere seed \(seed)")
        var rng = SplitMix64(seed: seed)
        let alphabet = ["a", "b", "-", ".", "0", "z", "é"]
        func word() -> String { (0..<Int(1 + rng.next() % 4)).map { _ in alphabet.randomElement(using: &rng)! }.joined() }
        for _ in 0..<2_000 {
            let names = Array(Set((0..<Int(rng.next() % 12)).map { _ in word() })).sorted { $0.utf8.lexicographicallyPrecedes($1.utf8) }
            let directory = rng.next() % 3 == 0 ? "" : "d/"
            let after = rng.next() % 5 == 0 ? nil : directory + word() + (rng.next() % 3 == 0 ? "/" + word() : "")
            let prefix = rng.next() % 4 == 0 ? directory + "a" : directory
            let kept = DirectoryStore.mayFollow(names, directory: directory, after: after)
            let all = DirectoryStore.candidates(names, directory: directory, prefix: prefix, after: after)
            let some = DirectoryStore.candidates(kept, directory: directory, prefix: prefix, after: after)
            #expect(Set(all.map(\.name)) == Set(some.map(\.name)), "names \(names), after \(after ?? "nil"), prefix \(prefix)")
        }
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
