import Glibc

/// Verifies a store: every chunk file hashes to its name, and every chunk a version
/// names exists with the size the version records.
public enum Fsck {
    public struct Report: Sendable {
        public var chunksChecked = 0
        public var versionsChecked = 0
        public var problems: [String] = []
        /// Chunks some version needs that are missing, damaged or of the wrong size, with
        /// the size the version records (what `fsck --repair` fetches).
        public var damaged: [ChunkID: Int64] = [:]
        /// Chunks some version needs that are not here but in the backing store (files on
        /// demand: fetched when read), with their sizes. Not damage; `--repair` leaves them.
        public var notLocal: [ChunkID: Int64] = [:]
    }

    public static func run(store: Store, progress: ((Int, Int) -> Void)? = nil) throws(StoreError) -> Report {
        var report = Report()
        let ids = store.chunks.allChunkIDs()
        var sizes: [ChunkID: Int] = [:]
        var bad: Set<ChunkID> = []
        for (i, id) in ids.enumerated() {
            do {
                let bytes = try store.chunks.readUnverified(id)
                sizes[id] = bytes.count
                if ChunkID(hashing: bytes) != id {
                    bad.insert(id)
                    report.problems.append("chunk \(id) is corrupt: its content does not match its hash (\(store.chunks.location(of: id)))")
                }
            } catch {
                bad.insert(id)
                report.problems.append("chunk \(id) cannot be read: \(error)")
            }
            report.chunksChecked += 1
            if i % 256 == 0 || i == ids.count - 1 { progress?(i + 1, ids.count) }
        }
        var places: [ChunkID: Bool] = [:]
        func placed(_ id: ChunkID) throws(StoreError) -> Bool {
            if let known = places[id] { return known }
            let known = try store.chunkPlaces([id])[id] != nil
            places[id] = known
            return known
        }
        try store.allChunkLists { (row, versionID, list) throws(StoreError) in
            report.versionsChecked += 1
            guard let list else {
                report.problems.append("version \(versionID) has a malformed chunk list")
                return
            }
            for (id, size) in list.chunks {
                if let actual = sizes[id] {
                    if bad.contains(id) {
                        report.problems.append("version \(versionID) needs corrupt chunk \(id)")
                        report.damaged[id] = Int64(size)
                    } else if actual != Int(size) {
                        report.problems.append("version \(versionID) expects chunk \(id) of \(size) bytes, found \(actual)")
                        report.damaged[id] = Int64(size)
                    }
                } else if try placed(id) {
                    report.notLocal[id] = Int64(size)
                } else {
                    report.problems.append("version \(versionID) needs missing chunk \(id)")
                    report.damaged[id] = Int64(size)
                }
            }
        }
        return report
    }

    public static let terminalProgress: @Sendable (Int, Int) -> Void = { done, total in
        let line = "\rchecking chunks: \(done)/\(total)" + (done == total ? "\n" : "")
        _ = line.withCString { write(STDERR_FILENO, $0, strlen($0)) }
    }
}
