import Dispatch
import UbiquityBacking
import UbiquityStore
import UbiquitySystem

/// Uploads the chunks this device writes while they are written (a 1 GiB `cp` is mostly
/// uploaded when `cp` returns), instead of reading them back and hashing them again at
/// the next push. The bytes come from the writer that just hashed them
/// (`ChunkStore.putWritten`; never a local-only file's), so nothing is read or hashed
/// twice here.
///
/// Only whole packs leave early: a pack is sealed at `Pack.targetSize` and uploaded in the
/// background, at most `limit` at once (past that, chunks are left to the push, which
/// reads them: a write never waits for the network). The push takes the places
/// (`flush`), sealing the pack being filled if it holds a chunk the push needs. A staged
/// pack whose chunks no record names (the file was deleted before it went out) is an
/// unnamed pack: a fossil at the next gc; one that also holds a live file's chunks keeps
/// the dead bytes until it is repacked. A failed upload is forgotten: the push uploads
/// those chunks itself.
final class PackStager: Sendable {
    private struct State {
        var writer: Pack.Writer?
        /// Tickets of the uploads in flight (numbered in launch order).
        var inFlight: Set<UInt64> = []
        var launched: UInt64 = 0
        var placed: [ChunkID: ChunkPlace] = [:]
        /// Packs uploaded, with the boot second they were found there (a pack is named
        /// without checking again only within `objectCheckValidity` of that).
        var packs: [String: Int64] = [:]
        var enabled = false
        var failures = 0
    }

    private let store: any BackingStore
    private let limit: Int
    private let state = Locked(State())
    /// Signalled at the end of each upload (`wait` looks at the tickets again).
    private let finished = DispatchSemaphore(value: 0)

    init(store: any BackingStore, limit: Int) {
        self.store = store
        self.limit = max(1, limit)
    }

    /// Off while syncing is paused or offline (the push decides what goes then).
    func setEnabled(_ on: Bool) {
        state.withLock { s in
            s.enabled = on
            if !on { s.writer = nil }
        }
    }

    /// A chunk this device wrote (called by the chunk store, on the writer's thread).
    func add(_ id: ChunkID, _ bytes: UnsafeRawBufferPointer) {
        guard bytes.count > RecordCodec.maxInline else { return } // travels in its record
        let full = state.withLock { s -> (Pack.Writer, UInt64)? in
            guard s.enabled else { return nil }
            if s.writer == nil {
                guard s.inFlight.count < limit else { return nil } // the push takes it
                s.writer = Pack.Writer()
            }
            s.writer!.add(id, bytes)
            guard s.writer!.isFull else { return nil }
            return take(&s)
        }
        if let (writer, ticket) = full { launch(writer, ticket) }
    }

    /// Places of the chunks staged so far, and the packs they are in, once the uploads
    /// launched before this call finished (not those launched meanwhile: a writer faster
    /// than the network must not hold the push). The pack being filled goes first if it
    /// holds one of `needed`.
    func flush(_ needed: some Sequence<ChunkID>) -> (places: [ChunkID: ChunkPlace], packs: [String: Int64]) {
        let (partial, upTo) = state.withLock { s -> ((Pack.Writer, UInt64)?, UInt64) in
            guard let writer = s.writer, needed.contains(where: { writer.contains($0) }) else { return (nil, s.launched) }
            let taken = take(&s)
            return (taken, s.launched)
        }
        if let (writer, ticket) = partial { launch(writer, ticket) }
        wait(upTo: upTo, timeout: nil)
        return state.withLock { s in
            defer { s.placed = [:]; s.packs = [:] }
            return (s.placed, s.packs)
        }
    }

    /// Waits (at most `timeout` seconds) for the uploads in flight (unmount).
    func drain(timeout: Double) {
        wait(upTo: state.withLock { $0.launched }, timeout: timeout)
    }

    /// Whether anything is staged (a push with nothing staged skips `flush`).
    var isEmpty: Bool { state.withLock { $0.writer == nil && $0.inFlight.isEmpty && $0.placed.isEmpty } }

    private func wait(upTo ticket: UInt64, timeout: Double?) {
        let deadline = timeout.map { DispatchTime.now() + $0 }
        while state.withLock({ s in s.inFlight.contains { $0 <= ticket } }) {
            if let deadline {
                if finished.wait(timeout: deadline) == .timedOut { return }
            } else {
                finished.wait()
            }
        }
    }

    /// Takes the writer for upload (callers hold the state), with its ticket.
    private func take(_ s: inout State) -> (Pack.Writer, UInt64)? {
        guard let writer = s.writer else { return nil }
        s.writer = nil
        s.launched += 1
        s.inFlight.insert(s.launched)
        return (writer, s.launched)
    }

    private func launch(_ writer: consuming Pack.Writer, _ ticket: UInt64) {
        let sealed = writer.seal() // here, where the writer is held alone: no copy
        let store = self.store
        DispatchQueue.global().async { [state, finished] in
            let result = Result { () throws(BackingError) -> [Pack.ChunkLocation] in try sealed.upload(to: store) }
            state.withLock { s in
                s.inFlight.remove(ticket)
                switch result {
                case .success(let locations):
                    for l in locations { s.placed[l.id] = ChunkPlace(pack: l.pack, offset: l.offset) }
                    s.packs[sealed.name] = SyncEngine.bootSeconds()
                case .failure(let error):
                    s.failures += 1
                    if s.failures == 1 { log("ubiquity: sync: uploading a pack early failed (\(error)); the next push uploads its chunks") }
                }
            }
            finished.signal()
        }
    }
}
