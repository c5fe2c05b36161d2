import Dispatch
import UbiquitySystem

/// Hashes and stores the chunks a `SequentialStream` cuts, in order, on a thread of its
/// own: the thread serving the writer goes back to the kernel for the next bytes while the
/// previous chunk is hashed (SHA-256 at about 1.8 GB/s is most of a chunk's cost) and
/// written. At most `inFlight` chunks wait (about 1 MiB); a writer faster than the disk
/// waits for room. A chunk that cannot be stored (a full disk) keeps its bytes: `retry`
/// and `finish` store it again, and until one succeeds the stream's writes fail.
final class ChunkWriter: @unchecked Sendable {
    private enum Slot {
        case pending
        case stored(ChunkID, Int)
        /// At most `ChunkList.inlineLimit` bytes: kept in the list, never stored.
        case inline([UInt8])
        case failed([UInt8], StoreError)
    }

    static let inFlight = 16

    private let store: ChunkStore
    /// Whether new chunks are shown to the store's observer (`ChunkStore.putWritten`).
    private let announce: Bool
    private let queue = DispatchQueue(label: "ubiquity.chunk-writer")
    private let room = DispatchSemaphore(value: ChunkWriter.inFlight)
    private let slots = Locked<[Slot]>([])

    init(store: ChunkStore, announce: Bool) {
        self.store = store
        self.announce = announce
    }

    /// Queues a chunk (its bytes, copied by the caller).
    func submit(_ bytes: [UInt8]) {
        if bytes.count <= ChunkList.inlineLimit {
            slots.withLock { $0.append(.inline(bytes)) }
            return
        }
        room.wait()
        let index = slots.withLock { s -> Int in s.append(.pending); return s.count - 1 }
        queue.async { [self] in
            defer { room.signal() }
            let slot: Slot
            do throws(StoreError) { slot = .stored(try put(bytes), bytes.count) } catch { slot = .failed(bytes, error) }
            slots.withLock { $0[index] = slot }
        }
    }

    /// Stores again the chunks that failed; throws if one still fails.
    func retry() throws(StoreError) {
        let failed = slots.withLock { s in s.indices.compactMap { i -> (Int, [UInt8])? in
            if case .failed(let bytes, _) = s[i] { return (i, bytes) } else { return nil }
        } }
        for (index, bytes) in failed {
            let id = try put(bytes)
            slots.withLock { $0[index] = .stored(id, bytes.count) }
        }
    }

    /// Waits for every queued chunk, stores again any that failed, and returns the
    /// chunks in order.
    func finish() throws(StoreError) -> ChunkList {
        queue.sync {}
        try retry()
        return slots.withLock { s in
            var list = ChunkList()
            for slot in s {
                switch slot {
                case .stored(let id, let size): list.append(id, size: size)
                case .inline(let bytes): list.appendInline(bytes)
                case .pending, .failed: break
                }
            }
            return list
        }
    }

    /// The chunks stored so far (gc keeps them while the file is open).
    var storedIDs: [ChunkID] {
        slots.withLock { s in s.compactMap { if case .stored(let id, _) = $0 { return id } else { return nil } } }
    }

    private func put(_ bytes: [UInt8]) throws(StoreError) -> ChunkID {
        try withBytes(bytes) { (raw) throws(StoreError) -> ChunkID in
            let id = ChunkID(hashing: raw)
            try store.putWritten(id, raw, announce: announce)
            return id
        }
    }
}
