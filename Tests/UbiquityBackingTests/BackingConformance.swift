import Dispatch
import Synchronization
import Testing
import TestSupport
import UbiquityBacking

/// One conformance suite for every `BackingStore` (restic's backend test, Perkeep's
/// storagetest): the protocol's contract, checked the same way against each
/// implementation. `run(store, label)` is called by the directory, memory and S3 tests.
enum BackingConformance {
    static func key(_ s: String) -> BackingKey { BackingKey(checked: s) }

    static func run(_ store: any BackingStore, _ label: String, seed: UInt64) throws {
        var gen = SplitMix64(seed: seed)
        let base = "conf-\(gen.next() % 1_000_000_000)/"
        let k: @Sendable (String) -> BackingKey = { (s: String) in key(base + s) }

        // A missing object: get says notFound, stat nil, delete succeeds.
        #expect(throws: BackingError.notFound(k("none").path), "\(label): get of a missing key") { try store.get(k("none")) }
        #expect(try store.stat(k("none")) == nil, "\(label): stat of a missing key")
        try store.delete(k("none"))

        // Put, get, stat, overwrite, empty object, a larger object.
        let small = gen.bytes(1000)
        try store.put(k("a/one"), small)
        #expect(try store.get(k("a/one")) == small, "\(label): get after put")
        #expect(try store.stat(k("a/one")) == ObjectInfo(key: k("a/one"), size: 1000), "\(label): stat")
        let other = gen.bytes(10)
        try store.put(k("a/one"), other)
        #expect(try store.get(k("a/one")) == other, "\(label): an overwrite replaces")
        try store.put(k("empty"), [])
        #expect(try store.get(k("empty")) == [], "\(label): an empty object")
        #expect(try store.stat(k("empty"))?.size == 0, "\(label): stat of an empty object")
        let big = gen.bytes(3 << 20)
        try store.put(k("big"), big)
        #expect(try store.get(k("big")) == big, "\(label): 3 MiB round trip")

        // Ranges: inside, at the start, cut at the end, past the end.
        #expect(try store.get(k("big"), range: 100..<200) == Array(big[100..<200]), "\(label): range inside")
        #expect(try store.get(k("big"), range: 0..<1) == [big[0]], "\(label): first byte")
        let size = Int64(big.count)
        #expect(try store.get(k("big"), range: size - 10..<size + 100) == Array(big[(big.count - 10)...]), "\(label): range cut at the end")
        #expect(try store.get(k("big"), range: size..<size + 5) == [], "\(label): range past the end")
        #expect(throws: BackingError.notFound(k("none").path), "\(label): range of a missing key") { try store.get(k("none"), range: 0..<1) }

        // ifAbsent: the first wins, the second gets .exists and changes nothing.
        try store.put(k("once"), small, ifAbsent: true)
        #expect(throws: BackingError.exists(k("once").path), "\(label): second ifAbsent put") { try store.put(k("once"), other, ifAbsent: true) }
        #expect(try store.get(k("once")) == small, "\(label): ifAbsent kept the first")

        // Listing: by prefix, byte order (`a-b` before `a/x`), pages that resume after a key.
        // (Never a key that is also another's directory, `l/a` beside `l/a/x`: a directory
        // cannot hold both, and the layout never makes such keys.)
        let names = ["l/a-b", "l/a/x", "l/a/y/z", "l/b", "l/b0", "l/c/d", "lz"]
        for (i, name) in names.enumerated() { try store.put(k(name), [UInt8(i)]) }
        let all = try store.listAll(prefix: base + "l/", pageSize: 3).map(\.key.path)
        let expected = names.filter { $0.hasPrefix("l/") }.map { base + $0 }
            .sorted { $0.utf8.lexicographicallyPrecedes($1.utf8) }
        #expect(all == expected, "\(label): listing in byte order, paged by 3")
        let partial = try store.list(prefix: base + "l/a", after: nil, limit: 100).objects.map(\.key.path)
        #expect(partial == [base + "l/a-b", base + "l/a/x", base + "l/a/y/z"], "\(label): a prefix that is not a directory")
        let page = try store.list(prefix: base + "l/", after: k("l/a/x"), limit: 2)
        #expect(page.objects.map(\.key.path) == [base + "l/a/y/z", base + "l/b"] && page.more, "\(label): a page after a key")
        #expect(page.objects.first?.size == 1, "\(label): listed sizes")
        #expect(try store.list(prefix: base + "nothing/", after: nil, limit: 10).objects.isEmpty, "\(label): an empty prefix")

        // Delete, then everything is gone.
        for name in names { try store.delete(k(name)) }
        for name in ["a/one", "empty", "big", "once"] { try store.delete(k(name)) }
        #expect(try store.listAll(prefix: base).isEmpty, "\(label): nothing left after deleting")

        // Concurrent puts of different keys and gets of one: all land, none torn.
        let shared = gen.bytes(256 << 10)
        try store.put(k("shared"), shared)
        try concurrently(8) { (i) throws(BackingError) in
            try store.put(k("c/\(i)"), [UInt8](repeating: UInt8(i), count: 4096))
            let got = try store.get(k("shared"))
            if got != shared { throw .garbage("torn read of shared: \(got.count) bytes") }
        }
        #expect(try store.listAll(prefix: base + "c/").count == 8, "\(label): concurrent puts")
        for i in 0..<8 { try store.delete(k("c/\(i)")) }
        try store.delete(k("shared"))
    }

    /// Runs `body(0..<n)` on n threads at once and rethrows the first failure.
    static func concurrently(_ n: Int, _ body: @escaping @Sendable (Int) throws(BackingError) -> Void) throws {
        let failures = Mutex<[BackingError]>([])
        DispatchQueue.concurrentPerform(iterations: n) { i in
            do throws(BackingError) { try body(i) } catch { failures.withLock { $0.append(error) } }
        }
        if let first = failures.withLock({ $0.first }) { throw first }
    }
}
