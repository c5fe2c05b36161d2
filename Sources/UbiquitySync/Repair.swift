import UbiquityStore
import UbiquitySystem

/// `ubiquity fsck --repair`: fetches the chunks fsck found missing or damaged from the
/// backing directory, where every uploaded chunk is an object named by its hash. Each
/// object is verified (hash and the size its versions record) before it replaces the
/// damaged copy; chunks are immutable, so this is safe while the store is mounted (a
/// reader of the chunk at that moment gets EIO, as it did before the repair).
public enum Repair {
    public struct Report: Sendable {
        public var repaired: [ChunkID] = []
        /// Chunk and why it could not be repaired.
        public var unrepaired: [(ChunkID, String)] = []
    }

    /// Repairs `damaged` (chunk → size, from `Fsck.Report.damaged`) into `chunks`.
    public static func run(damaged: [ChunkID: Int64], chunks: ChunkStore, backingDirectory: String,
                           progress: ((Int, Int) -> Void)? = nil) throws(StoreError) -> Report {
        var report = Report()
        let backing = Backing(directory: backingDirectory, deviceID: "")
        for (i, (id, size)) in damaged.sorted(by: { $0.key.hex < $1.key.hex }).enumerated() {
            defer { progress?(i + 1, damaged.count) }
            let bytes: [UInt8]
            do throws(StoreError) {
                guard let found = try backing.object(id) else {
                    report.unrepaired.append((id, "not in the backing directory"))
                    continue
                }
                bytes = found
            } catch .corruptChunk {
                report.unrepaired.append((id, "the backing directory's copy is damaged too"))
                continue
            } catch {
                report.unrepaired.append((id, "\(error)"))
                continue
            }
            guard Int64(bytes.count) == size else {
                report.unrepaired.append((id, "the backing directory's copy has \(bytes.count) bytes, not \(size)"))
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
