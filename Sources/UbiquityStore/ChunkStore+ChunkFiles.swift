import Glibc
import UbiquitySystem

/// The chunk files of a store from before format 18 (`chunks/xx/<sha256>`), moved into
/// the packs in the background of a mount: the store needs nothing of it to work (files
/// stay readable), it only gives back their inodes and makes lookups memory-only.
///
/// Crash-safe and resumable at any point: a file is unlinked only after its chunk's
/// record (or row) was flushed, so a chunk is always in one place at least; a run after a
/// crash finds the chunks moved already and only unlinks their files. gc meets either
/// copy: a file goes only while its record is there, and the record is claimed then,
/// under the files' claim lock; a record gc removed since the put (while a commit's claim
/// of the file kept the file) leaves its file in place.
extension ChunkStore {
    public struct ChunkFileMove: Sendable, Equatable {
        public var files = 0
        public var bytes: Int64 = 0
        /// Files left in place: not a chunk's bytes (damage, for fsck to report) or not
        /// readable.
        public var left = 0
        /// Whether every chunk directory is gone (the store looks for files no more).
        public var finished = false
    }

    /// How many chunk files there are, and their bytes (a walk of the directories).
    public func chunkFileCount() -> (files: Int, bytes: Int64) {
        guard legacyFiles else { return (0, 0) }
        var files = 0, bytes: Int64 = 0
        for i in 0..<256 {
            let dir = directory + "/" + Hex.byte(i)
            for name in (try? directoryEntries(dir)) ?? [] where ChunkID(hex: name) != nil {
                var st = stat()
                if stat(dir + "/" + name, &st) == 0 { files += 1; bytes += Int64(st.st_size) }
            }
        }
        return (files, bytes)
    }

    /// Moves every chunk file into the packs (small ones, from before format 5, into rows),
    /// `batchBytes` at a time between flushes, then removes the empty directories, `00`
    /// last (and only when no other is left). `stop` is asked between files; `progress`
    /// after each batch, once it is flushed.
    @discardableResult
    public func moveChunkFilesIntoPacks(batchBytes: Int = 32 << 20, stop: () -> Bool = { false },
                                        progress: (ChunkFileMove) -> Void = { _ in }) throws(StoreError) -> ChunkFileMove {
        var moved = ChunkFileMove()
        guard legacyFiles else {
            moved.finished = true
            return moved
        }
        // 00 last: while it is there, files are looked for.
        let order = Array(1..<256) + [0]
        var batch: [(ChunkID, String, Int)] = [], batchSize = 0
        func flush() throws(StoreError) {
            guard !batch.isEmpty else { return }
            try sync() // the records and rows, before any file goes
            for (id, path, size) in batch {
                claims.withLock { _ in
                    // Under the lock a claim of the file takes: the file goes only while
                    // its record (or row) is there, which is claimed now in its place.
                    guard claimOutsideFiles(id, now: nowNanos()) else { return }
                    if unlink(path) == 0 {
                        moved.files += 1
                        moved.bytes += Int64(size)
                    }
                }
            }
            batch = []
            batchSize = 0
            progress(moved)
        }
        for i in order {
            let dir = directory + "/" + Hex.byte(i)
            let names: [String]
            do throws(SystemError) { names = try directoryEntries(dir) } catch {
                if error.code == ENOENT { continue }
                throw .io(errno: error.code, error.context)
            }
            for name in names {
                if stop() {
                    try flush()
                    return moved
                }
                let path = dir + "/" + name
                // A temp file a crash left behind (before format 18 a chunk file was
                // written under a temp name, then renamed): never a chunk.
                if name.contains(".tmp.") {
                    unlink(path)
                    continue
                }
                guard let id = ChunkID(hex: name) else { continue }
                let bytes: [UInt8]
                do throws(SystemError) {
                    guard let read = try readFile(path, limit: Self.maxChunkSize) else { continue } // gone meanwhile (gc)
                    bytes = read
                } catch {
                    moved.left += 1
                    continue
                }
                guard ChunkID(hashing: bytes) == id else {
                    moved.left += 1
                    continue
                }
                try withBytes(bytes) { (raw) throws(StoreError) in try storeOutsideFiles(id, raw) }
                batch.append((id, path, bytes.count))
                batchSize += bytes.count
                if batchSize >= batchBytes { try flush() }
            }
            try flush()
            // Empty now unless a file was left (damage) or came meanwhile (nothing writes
            // chunk files since format 18). 00 goes only after all the others: a file left
            // anywhere keeps the store looking for files (fsck names the damage).
            if i == 0 && moved.left > 0 { break }
            if rmdir(dir) != 0 && errno != ENOENT {
                moved.left += 1
                continue
            }
            if i == 0 {
                legacyFilesFlag.store(false, ordering: .releasing)
                moved.finished = true
            }
        }
        return moved
    }
}
