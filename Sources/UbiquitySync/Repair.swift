import UbiquityBacking
import UbiquityStore
import UbiquitySystem

/// `ubiquity fsck --repair`: fetches the chunks fsck found missing or damaged from the
/// backing store: from the pack the store knows holds each (`chunk_places`), or, for a
/// chunk that went out in backing format 4 and is still there, from `objects/`. Each is
/// verified (hash and the size its versions record) before it replaces the damaged copy;
/// chunks are immutable, so this is safe while the store is mounted (a reader of the chunk
/// at that moment gets EIO, as it did before the repair).
public enum Repair {
    public struct Report: Sendable {
        public var repaired: [ChunkID] = []
        /// Chunk and why it could not be repaired.
        public var unrepaired: [(ChunkID, String)] = []
    }

    /// Repairs `damaged` (chunk → size, from `Fsck.Report.damaged`) into `chunks`.
    public static func run(damaged: [ChunkID: Int64], chunks: ChunkStore, backing: any BackingStore,
                           places: [ChunkID: ChunkPlace], progress: ((Int, Int) -> Void)? = nil) throws(StoreError) -> Report {
        var report = Report()
        for (i, (id, size)) in damaged.sorted(by: { $0.key.hex < $1.key.hex }).enumerated() {
            defer { progress?(i + 1, damaged.count) }
            guard size >= 0, size <= Int64(ChunkStore.maxChunkSize) else {
                report.unrepaired.append((id, "its versions record \(size) bytes"))
                continue
            }
            var why = "no pack is known to hold it and it is not in objects/ (format 4)"
            var bytes: [UInt8]?
            if let place = places[id] {
                let fetched = Locked<[UInt8]?>(nil)
                let failures = PackFetch(store: backing, width: 1).fetch([PackFetch.Want(id: id, size: Int(size), place: place)]) { _, got in
                    fetched.withLock { $0 = got }
                }
                bytes = fetched.withLock { $0 }
                if let failure = failures[id] { why = failure }
            }
            if bytes == nil {
                let hex = id.hex
                if let got = try? backing.get(BackingKey(checked: "objects/\(hex.prefix(2))/\(hex)"), range: 0..<Int64(size) + 1) {
                    if ChunkID(hashing: got) == id && Int64(got.count) == size { bytes = got } else { why = "the backing store's copy is damaged too" }
                }
            }
            guard let bytes else {
                report.unrepaired.append((id, why))
                continue
            }
            chunks.discard(id)
            try chunks.put(id, bytes)
            report.repaired.append(id)
        }
        try chunks.sync()
        return report
    }
}
