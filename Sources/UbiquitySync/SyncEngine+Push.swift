import Dispatch
import Glibc
import UbiquityBacking
import UbiquityStore
import UbiquitySystem

/// Sending this device's records (backing format 5): a batch's small chunks ride inside
/// their records, the others go into packs (a few PUTs of up to 8 MiB, several at once)
/// unless a pack known to hold them is still there, and then the records go out as one
/// segment of the log (one PUT). So 10,000 new small files cost about ten PUTs.
extension SyncEngine {
    static let seqKey = "log_seq"
    static let reservedKey = "log_reserved"
    static let startedKey = "log_started"
    static let logBytesKey = "log_bytes"
    static let checkpointBytesKey = "checkpoint_bytes"
    /// The sparse packs the last repacking checkpoint left named here (SyncEngine+Collect).
    static let repackTriedKey = "repack_tried"

    /// Once a session, before the first push: a segment reserved before a crash is
    /// settled (`settleReservation`); a store whose records went out in format 4 (or that
    /// never wrote a checkpoint) writes one of them, so devices that join later find them.
    func startLog() throws(StoreError) {
        guard !memory.logReady else { return }
        _ = try settleReservation()
        let (started, anyUploaded) = try shared.withLedger { (store) throws(StoreError) in
            (try store.setting(Self.startedKey) == "1", !(try store.uploadedRecords(after: 0, limit: 1)).isEmpty)
        }
        if !started {
            if anyUploaded { try writeCheckpoint() }
            try shared.withLedger { (store) throws(StoreError) in
                try store.setSetting(Self.startedKey, "1")
            }
        }
        memory.logReady = true
    }

    /// A segment whose PUT failed, timed out or was cut by a crash may still have landed
    /// (the server had the whole body). Its name stays reserved until this settles it:
    /// if it is there, its records are out (marked uploaded, the seq taken); if not, the
    /// next segment is written under the same name, so a seq never has two segments
    /// (`If-None-Match: *` lets only one of two racing PUTs of it land). Returns the name
    /// to reuse, if any.
    func settleReservation() throws(StoreError) -> SegmentLog.SegmentName? {
        let reserved = try shared.withLedger { (store) throws(StoreError) in try store.setting(Self.reservedKey) ?? "" }
        guard let name = Self.reservedName(reserved, device: backing.deviceID) else { return nil }
        guard let bytes = try backing.segment(name) else {
            // Not there. A PUT of it that is still on its way could land later, but none
            // outlives its deadline (S3Store bounds every call to about a minute): after
            // two minutes the seq gets a fresh <t>, so readers whose listing window has
            // moved on past the old one still find it.
            let now = Int64(time(nil)).multipliedClamped(by: 1000)
            guard now.subtractingClamped(name.time) > 120_000 else { return name }
            let fresh = SegmentLog.SegmentName(time: SegmentLog.time(now: now, cursor: memory.cursor ?? SegmentLog.Cursor()),
                                               device: backing.deviceID, seq: name.seq)
            try shared.withLedger { (store) throws(StoreError) in
                try store.setSetting(Self.reservedKey, "\(fresh.time)-\(fresh.seq)")
                try store.commitSettings() // before the PUT, as in `writeSegment`
            }
            return fresh
        }
        let ids = lines(bytes).compactMap { try? RecordCodec.decode($0, journalDevice: backing.deviceID).get().id }
        try shared.withLedger { (store) throws(StoreError) in
            try store.markUploaded(ids)
            try store.setSetting(Self.seqKey, String(name.seq))
            try store.setSetting(Self.reservedKey, "")
            try store.addToSetting(Self.logBytesKey, Int64(bytes.count))
        }
        log("ubiquity: sync: segment \(name.seq) of this device, whose upload was not confirmed, is there: its \(ids.count) records are out")
        return nil
    }

    static func reservedName(_ text: String, device: DeviceID) -> SegmentLog.SegmentName? {
        let parts = text.split(separator: "-")
        guard parts.count == 2, let t = Int64(parts[0]), let seq = UInt64(parts[1]), seq >= 1 else { return nil }
        return SegmentLog.SegmentName(time: t, device: device, seq: seq)
    }

    /// Whether this cycle pushes: a few records (interactive saves) go at once; a burst
    /// (a `tar -x`, a copy of a tree) waits while it grows, up to `maxPushDelay`, so it
    /// goes out as a few full segments instead of one small segment per cycle.
    private func pushDue(force: Bool) throws(StoreError) -> Bool {
        let pending = try shared.withLedger { (store) throws(StoreError) in store.pendingUploadCount }
        let now = bootSecondsDouble()
        let (before, then) = (memory.lastPending, memory.lastPendingTime)
        memory.lastPending = pending
        memory.lastPendingTime = now
        if pending == 0 {
            memory.pendingSince = nil
            if try shared.keyValues.unpublished() != nil { return true }
            return try shared.withLedger { (store) throws(StoreError) in try store.setting(Self.announceKey) != nil }
        }
        let since = memory.pendingSince ?? now
        memory.pendingSince = since
        // Records made per second since the last cycle, whatever the poll interval: a
        // burst makes hundreds, a person's saves a few (and a few records are never a
        // burst, however close the cycles).
        let growth = pending - before
        let burst = growth >= Self.burstRecords && Double(growth) / max(0.001, now - then) >= Self.burstRate
        return force || !burst || pending >= options.uploadBatch || now - since >= options.maxPushDelay
    }

    static let burstRate = 100.0
    static let burstRecords = 20

    func push(force: Bool = false) throws(StoreError) {
        guard try pushDue(force: force) else { return }
        memory.pendingSince = nil
        // A segment whose PUT landed though it seemed to fail: its records are out (marked
        // here), so the batch below does not send them again in a new segment.
        _ = try settleReservation()
        while true {
            // Taken with every local change made before it recorded: a file saved in a
            // directory made while this cycle's pull waited must not go out without the
            // directory's record (a peer that moved the directory meanwhile would have
            // no record to tombstone, and the late one would bring it back: PullRaceTests).
            // A cycle that began before `ubiquity pause` looks once more under the store's
            // lock: a save made after the pause returned cannot go out in it.
            var batch: [SyncRecord] = []
            var paused = false
            try withLocalChangesRecorded { (store, _) throws(StoreError) -> TreeChanges in
                paused = state.withLock { $0.paused }
                if !paused { batch = try store.pendingUploads(limit: options.uploadBatch) }
                return TreeChanges()
            }
            if paused { return }
            if batch.isEmpty { break }
            try makeDurable()
            // A pack found present and no fossil may become one later (BackingCollector),
            // to be deleted a week after: a batch whose checks took longer than
            // `objectCheckValidity` (the device slept meanwhile) checks once more.
            let checked = bootSeconds()
            try placeChunks(&batch)
            if bootSeconds().subtractingClamped(checked) > options.objectCheckValidity {
                memory.verifiedPacks = [:]
                try placeChunks(&batch)
            }
            // A segment stays under `partSize` bytes (one record always goes).
            var lines: [String] = []
            var bytes = 0
            for record in batch {
                let line = RecordCodec.encode(record)
                if !lines.isEmpty && bytes + line.utf8.count > Backing.partSize { break }
                lines.append(line)
                bytes += line.utf8.count
            }
            try writeSegment(lines, ids: batch.prefix(lines.count).map(\.id))
            if lines.count == batch.count && batch.count < options.uploadBatch { break }
        }
        // The key-value store: this device's file when it changed, then an empty segment
        // so that peers (who list devices/ only on activity) look after it landed. The
        // segment is owed until one lands: a failed one goes with a later cycle.
        let published = try pushKeyValues()
        let owed = try shared.withLedger { (store) throws(StoreError) in try store.setting(Self.announceKey) } != nil
        if published || owed {
            try writeSegment([], ids: [])
            try shared.withLedger { (store) throws(StoreError) in try store.removeSetting(Self.announceKey) }
        }
    }

    /// Set while a key-value file went out and no segment has followed it yet.
    static let announceKey = "kv_announce"


    /// Writes the next segment of this device's log. Its name is reserved in the store
    /// first: after a crash the next session finds out whether it landed (`startLog`), so
    /// a seq is never skipped (readers would wait for it) nor written twice.
    func writeSegment(_ lines: [String], ids: [VersionID]) throws(StoreError) {
        // A reservation left by a failed PUT is settled first: its name is reused, or it
        // landed and a new seq follows.
        var name = try settleReservation()
        if name == nil {
            let cursor = memory.cursor ?? SegmentLog.Cursor()
            let now = Int64(time(nil)).multipliedClamped(by: 1000)
            try shared.withLedger { (store) throws(StoreError) in
                let seq = (try store.setting(Self.seqKey).flatMap { UInt64($0) } ?? 0) + 1
                let reserved = SegmentLog.SegmentName(time: SegmentLog.time(now: now, cursor: cursor), device: backing.deviceID, seq: seq)
                try store.setSetting(Self.reservedKey, "\(reserved.time)-\(seq)")
                // Committed before the PUT: left in the open group-commit batch, a kill -9
                // after the PUT would lose it, and the next session would write the same
                // seq again, which the backing store refuses ("exists already").
                try store.commitSettings()
                name = reserved
            }
        }
        guard let name else { throw .io(errno: EIO, "no segment name reserved") }
        var bytes: [UInt8] = []
        for line in lines { bytes += Array(line.utf8) }
        // On failure the reservation stays: the next push settles it.
        try backing.putSegment(name, bytes)
        let size = bytes.count
        try shared.withLedger { (store) throws(StoreError) in
            try store.markUploaded(ids)
            try store.setSetting(Self.seqKey, String(name.seq))
            try store.setSetting(Self.reservedKey, "")
            try store.addToSetting(Self.logBytesKey, Int64(size))
        }
        noteActivity()
    }

    /// Gives every chunk of the batch's records a way to travel: small ones their bytes
    /// inline, others a place in a pack (known and still there, or a new pack uploaded
    /// now). `tolerant` (a checkpoint, which rewrites records already out): a chunk this
    /// store cannot read (damaged here, for `fsck --repair`) is logged and named by its
    /// hash alone, as it was.
    func placeChunks(_ batch: inout [SyncRecord], tolerant: Bool = false) throws(StoreError) {
        var large: [ChunkID: Int] = [:]
        for i in batch.indices {
            for (id, size) in batch[i].chunks.chunks where batch[i].inline[id] == nil {
                if size <= RecordCodec.maxInline {
                    // (Fetched if it is not here: the push runs outside every lock.)
                    do { batch[i].inline[id] = try chunks.read(id, size: size) } catch {
                        guard tolerant else { throw error }
                        logOnce("ubiquity: sync: writing a checkpoint: chunk \(id.hex) of \(batch[i].path) cannot be read here (\(error)); its record names it by hash")
                    }
                } else {
                    large[id] = Int(size)
                }
            }
        }
        if !stager.isEmpty {
            // Chunks uploaded while they were written: their places first (every push
            // takes them, so they never pile up in memory).
            let (staged, packs) = stager.flush(large.keys)
            try shared.withLedger { (store) throws(StoreError) in
                try store.setChunkPlaces(staged)
            }
            // Checked when uploaded: a pack staged long ago (a file open for days) is
            // checked again before it is named (the collector may have made it a fossil).
            memory.verifiedPacks.merge(packs) { _, uploaded in uploaded }
        }
        let known = large.isEmpty ? [:] : try shared.withLedger { (store) throws(StoreError) in try store.chunkPlaces(large.keys) }
        let (gone, sparse) = try unusablePacks(Set(known.values.map(\.pack)))
        var places = known.filter { !gone.contains($0.value.pack) && !sparse.contains($0.value.pack) }
        // In the order of the files that name them: a file's chunks lie together in a
        // pack, so a reader fetches a file (or a range of it) in one ranged GET.
        var missing: [ChunkID] = []
        var queued: Set<ChunkID> = []
        for record in batch {
            for (id, _) in record.chunks.chunks where large[id] != nil && places[id] == nil && queued.insert(id).inserted { missing.append(id) }
        }
        if !missing.isEmpty {
            // A chunk that is not here (a file not downloaded) is fetched from where it was
            // to go into the new pack; one that cannot be fetched any more (its pack is
            // gone) is named where it was, or by hash, rather than holding every record.
            let uploaded = try uploadPacks(missing, sizes: large) { id in
                tolerant || known[id].map { sparse.contains($0.pack) } == true || !chunks.isLocal(id)
            }
            places.merge(uploaded) { _, new in new }
            // A chunk of a sparse pack that cannot be read here keeps its place: the pack
            // stays named, rather than the record naming the chunk by hash alone.
            for id in missing where places[id] == nil {
                if let old = known[id], sparse.contains(old.pack) { places[id] = old }
            }
            try shared.withLedger { (store) throws(StoreError) in
                try store.setChunkPlaces(uploaded)
            }
        }
        // Places in packs that are gone or fossils are forgotten (after the upload, which
        // fetched from a fossil the chunks that are not here); those in sparse packs stay
        // until a new place replaces them (above, or when the chunk is named next).
        if !gone.isEmpty {
            try shared.withLedger { (store) throws(StoreError) in
                for pack in gone { try store.forgetPlaces(inPack: pack) }
            }
        }
        for i in batch.indices {
            for (id, _) in batch[i].chunks.chunks where batch[i].inline[id] == nil {
                if let place = places[id] { batch[i].places[id] = place }
            }
        }
    }

    /// Of packs this device would name, those it must not: sparse (being repacked), a
    /// fossil (the collector may delete it a week later) or gone. Each is checked at most
    /// once per `objectCheckValidity`: one LIST of `fossils/` and a HEAD per pack.
    private func unusablePacks(_ packs: Set<String>) throws(StoreError) -> (gone: Set<String>, sparse: Set<String>) {
        let now = bootSeconds()
        let stale = packs.filter { memory.verifiedPacks[$0].map { now.subtractingClamped($0) > options.objectCheckValidity } ?? true }
        if stale.isEmpty { return ([], packs.intersection(memory.sparsePacks)) }
        let fossils = try backing.fossils()
        var bad = Set(stale.filter { fossils[$0] != nil })
        let store = backing.store
        let candidates = stale.filter { !bad.contains($0) && Pack.isName($0) }.sorted()
        bad.formUnion(stale.filter { !Pack.isName($0) })
        let found = parallelMap(candidates, width: options.parallelRequests) { pack -> Result<Bool, BackingError> in
            Result { () throws(BackingError) -> Bool in try store.stat(Pack.key(pack)) != nil }
        }
        for (pack, result) in zip(candidates, found) {
            switch result {
            case .success(true): memory.verifiedPacks[pack] = now
            case .success(false): bad.insert(pack)
            case .failure(let error): throw Backing.storeError(error, "stat \(Pack.key(pack))")
            }
        }
        return (bad, packs.intersection(memory.sparsePacks).subtracting(bad))
    }

    /// Uploads the chunks into new packs, up to `parallelRequests` PUTs in flight while the
    /// next pack is filled (reading and verifying chunks overlaps the uploads); returns
    /// their places.
    /// `tolerant(id)`: a chunk that cannot be read here is left out (logged) rather than
    /// failing the upload.
    private func uploadPacks(_ ids: [ChunkID], sizes: [ChunkID: Int], tolerant: (ChunkID) -> Bool) throws(StoreError) -> [ChunkID: ChunkPlace] {
        let store = backing.store
        let results = Locked<[Result<[Pack.ChunkLocation], BackingError>]>([])
        let slots = DispatchSemaphore(value: max(1, options.parallelRequests))
        let group = DispatchGroup()
        func launch(_ writer: consuming Pack.Writer) {
            slots.wait()
            group.enter()
            let sealed = writer.seal()
            DispatchQueue.global().async {
                let result = Result { () throws(BackingError) -> [Pack.ChunkLocation] in try sealed.upload(to: store) }
                results.withLock { $0.append(result) }
                slots.signal()
                group.leave()
            }
        }
        // Those that are not here (files on demand) are fetched in one batch, not one by
        // one below (a chunk that cannot be fetched fails below, when it is read).
        let remote = ids.filter { !chunks.isLocal($0) }.compactMap { id in sizes[id].map { ChunkWant(id: id, size: $0) } }
        if !remote.isEmpty { try? chunks.ensureLocal(remote) }
        var writer = Pack.Writer()
        var failure: StoreError?
        for id in ids {
            // A failed PUT ends the batch: the next cycle tries again.
            if results.withLock({ $0.contains { if case .failure = $0 { true } else { false } } }) { break }
            let bytes: [UInt8]
            do throws(StoreError) {
                // Each chunk once: the upload of a large file must not push out of the
                // cache the chunks readers keep there.
                if let size = sizes[id] { bytes = try chunks.read(id, size: size, once: true) } else { bytes = try chunks.read(id, once: true) }
            } catch {
                guard tolerant(id) else { failure = error; break }
                logOnce("ubiquity: sync: chunk \(id.hex) cannot be read here (\(error)); its record names it where it was, or by hash")
                continue
            }
            writer.add(id, bytes)
            if writer.isFull {
                launch(writer)
                writer = Pack.Writer()
            }
        }
        if failure == nil && !writer.isEmpty { launch(writer) }
        group.wait()
        if let failure { throw failure }
        var places: [ChunkID: ChunkPlace] = [:]
        let now = bootSeconds()
        for result in results.withLock({ $0 }) {
            switch result {
            case .success(let locations):
                for l in locations { places[l.id] = ChunkPlace(pack: l.pack, offset: l.offset) }
                if let pack = locations.first?.pack { memory.verifiedPacks[pack] = now }
            case .failure(let error): throw Backing.storeError(error, "put a pack")
            }
        }
        return places
    }
}
