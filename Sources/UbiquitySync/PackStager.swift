import Dispatch
import UbiquityBacking
import UbiquityStore
import UbiquitySystem

/// Uploads the chunks this device writes while they are written (a 1 GiB `cp` is mostly
/// uploaded when `cp` returns), instead of reading them back and hashing them again at
/// the next push. The bytes come from the writer that just hashed them
/// (`ChunkStore.putWritten`), so nothing is read or hashed twice here.
///
/// Only whole packs leave early: a pack is sealed at `Pack.targetSize` and uploaded in the
/// background, at most `limit` at once (past that, chunks are left to the push, which
/// reads them: a write never waits for the network). The push takes the places
/// (`flush`), sealing the pack being filled if it holds a chunk the push needs. A staged
/// pack whose chunks no record names (the file was deleted before it went out) is an
/// unnamed pack: a fossil at the next gc. A failed upload is forgotten: the push uploads
/// those chunks itself.
final class PackStager: Sendable {
    private struct State {
        var writer: Pack.Writer?
        var inFlight = 0
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
    private let uploads = DispatchGroup()

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
        let full = state.withLock { s -> Pack.Writer? in
            guard s.enabled else { return nil }
            if s.writer == nil {
                guard s.inFlight < limit else { return nil } // the push takes it
                s.writer = Pack.Writer()
            }
            s.writer!.add(id, bytes)
            guard s.writer!.isFull else { return nil }
            s.inFlight += 1
            defer { s.writer = nil }
            return s.writer
        }
        if let full { launch(full) }
    }

    /// Places of the chunks staged so far (after their uploads finished), and the packs
    /// they are in; the pack being filled goes first if it holds one of `needed`.
    func flush(_ needed: some Sequence<ChunkID>) -> (places: [ChunkID: ChunkPlace], packs: [String: Int64]) {
        let partial = state.withLock { s -> Pack.Writer? in
            guard let writer = s.writer, needed.contains(where: { writer.contains($0) }) else { return nil }
            s.inFlight += 1
            defer { s.writer = nil }
            return s.writer
        }
        if let partial { launch(partial) }
        uploads.wait()
        return state.withLock { s in
            defer { s.placed = [:]; s.packs = [:] }
            return (s.placed, s.packs)
        }
    }

    /// Whether anything is staged (a push with nothing staged skips `flush`).
    var isEmpty: Bool { state.withLock { $0.writer == nil && $0.inFlight == 0 && $0.placed.isEmpty } }

    private func launch(_ writer: consuming Pack.Writer) {
        uploads.enter()
        let sealed = writer
        let store = self.store
        DispatchQueue.global().async { [state, uploads] in
            let result = Result { () throws(BackingError) -> [Pack.ChunkLocation] in try sealed.upload(to: store) }
            state.withLock { s in
                s.inFlight -= 1
                switch result {
                case .success(let locations):
                    for l in locations { s.placed[l.id] = ChunkPlace(pack: l.pack, offset: l.offset) }
                    if let pack = locations.first?.pack { s.packs[pack] = SyncEngine.bootSeconds() }
                case .failure(let error):
                    s.failures += 1
                    if s.failures == 1 { log("ubiquity: sync: uploading a pack early failed (\(error)); the next push uploads its chunks") }
                }
            }
            uploads.leave()
        }
    }
}
