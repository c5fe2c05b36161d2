import Testing
import TestSupport
@testable import UbiquityStore

/// Lineage (dots and contexts with missing ranges): the context must hold exactly the
/// dots inserted or united into it, whatever the order; its text round-trips and hostile
/// text is refused.
@Suite struct LineageTests {
    static let devices = ["0000000000000001", "00000000000000aa", "ffffffffffffffff"].map { DeviceID(hex: $0)! }

    /// A random set of dots, built as a Lineage by inserts and unions in random order,
    /// against a plain set. Prints its seed.
    @Test(arguments: [1, 2, 3, 4, 5, 6, 7, 8] as [UInt64]) func holdsExactlyItsDots(seed: UInt64) throws {
        var rng = SplitMix64(seed: seed)
        print("LineageTests seed \(seed)")
        var parts: [(Lineage, Set<String>)] = []
        for _ in 0..<6 {
            var lineage = Lineage(), dots: Set<String> = []
            for _ in 0..<Int(rng.next() % 12) {
                let device = Self.devices[Int(rng.next() % 3)], counter = Int64(rng.next() % 20) + 1
                lineage.insert(device: device, counter: counter)
                dots.insert("\(device):\(counter)")
            }
            parts.append((lineage, dots))
        }
        var union = Lineage(), all: Set<String> = []
        for (lineage, dots) in parts.shuffled(using: &rng) {
            union.formUnion(lineage.context)
            all.formUnion(dots)
            #expect(Lineage.parseContext(Substring(union.contextText)) == union.context, "seed \(seed)")
        }
        for device in Self.devices {
            for counter in Int64(0)...22 {
                #expect(union.contains(device: device, counter: counter) == all.contains("\(device):\(counter)"),
                        "seed \(seed): \(device):\(counter) in \(union.contextText)")
            }
        }
    }

    @Test func aGapIsOneRange() {
        var lineage = Lineage()
        let d = Self.devices[0]
        lineage.insert(device: d, counter: 1)
        lineage.insert(device: d, counter: 1_000_000)
        #expect(lineage.contextText == "\(d):1000000:2-999999")
        lineage.insert(device: d, counter: 500)
        #expect(lineage.contextText == "\(d):1000000:2-499:501-999999")
        lineage.dot = 7
        #expect(Lineage(stored: lineage.stored(device: d)!, device: d) == lineage)
        // A linear lineage is stored as its dot alone.
        var linear = Lineage()
        linear.insert(device: d, counter: 1)
        linear.insert(device: d, counter: 2)
        linear.dot = 3
        #expect(linear.stored(device: d) == "3")
        #expect(Lineage(stored: "3", device: d) == linear)
        #expect(linear.stored(device: Self.devices[1]) == "3;\(d):2")
    }

    /// A device never gives a dot twice, even when the records that held its dots are
    /// gone from the node's heads (review: a rollback after its parent was pruned left a
    /// node without heads, and the next save got dot 1 again).
    @Test func dotsAreNeverGivenTwice() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let store = try Store(directory: dir.path, deviceName: "one")
        let f = try store.create(parent: Store.rootInode, name: "a.txt", kind: .file, mode: 0o644, uid: 1, gid: 1)
        for _ in 0..<3 { try store.commit(f.id, content: ChunkList(), path: "a.txt", local: false) }
        let node = try #require(store.inode(f.id)?.fileID)
        #expect(try store.replica.current(.file(node))?.lineage.dot == 3)
        try store.db.execute("DELETE FROM view_heads")
        try store.db.execute("DELETE FROM versions")
        #expect(try store.replica.lineage(node: .file(node), parents: [], device: store.deviceID).0.dot == 4)
    }

    /// A parent whose context is at the limit (hostile): the record that continues it goes
    /// without lineage (parents only) rather than with one no reader accepts.
    @Test func aContextPastTheLimitIsDropped() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let store = try Store(directory: dir.path, deviceName: "one")
        let other = DeviceID(hex: "00000000000000aa")!
        var record = SyncRecord(id: VersionID(hex: String(repeating: "a", count: 32))!, node: .file(FileID(hex: String(repeating: "b", count: 32))!), kind: .file,
                                parents: [], deviceID: other, deviceName: "x", committed: 1, mtime: 1, mode: 0o644,
                                isTombstone: false, isMeta: false, path: "f")
        record.lineage.dot = 1
        // Every second counter: a max and 4,095 ranges, 4,096 items (the most a reader takes).
        for k in 1...4_095 { record.lineage.insert(device: Self.devices[0], counter: Int64(2 * k)) }
        #expect(record.lineage.itemCount == Lineage.maxItems)
        #expect(Lineage.parseContext(Substring(record.lineage.contextText)) != nil)
        try store.addRemote([record])
        let (next, _) = try store.replica.lineage(node: record.node, parents: [record.id], device: store.deviceID)
        #expect(next.isEmpty)
    }

    @Test func hostileContextsAreRefused() {
        let d = Self.devices[0], e = Self.devices[1]
        for bad in ["\(d)", "\(d):0", "\(d):01", "\(d):5:3-2", "\(d):5:2-5", "\(d):5:3-3:2-2", "\(d):5:0-1",
                    "\(e):1,\(d):1", "\(d):1,\(d):2", "ABCDEF0123456789:1", "\(d):4611686018427387905",
                    "\(d):99999999999999999999", "\(d):1,", ",\(d):1", "\(d):1:x-y"] {
            #expect(Lineage.parseContext(Substring(bad)) == nil, "accepted \(bad)")
        }
        #expect(Lineage.parseContext("")?.isEmpty == true)
        let many = (1...5000).map { "\($0 * 2)-\($0 * 2)" }.joined(separator: ":")
        #expect(Lineage.parseContext(Substring("\(d):20000:" + many)) == nil) // over maxItems
    }
}
