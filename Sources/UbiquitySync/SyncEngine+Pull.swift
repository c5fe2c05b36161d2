import Glibc
import UbiquityBacking
import UbiquityStore
import UbiquitySystem

/// Taking in other devices' records (backing format 5): one LIST of the log finds every
/// peer's new segments; a peer this device is behind of further than its segments go
/// (they were collected, or it never read that peer) is read from its newest checkpoint.
/// Records a slice per hold of the store's lock, metadata first: chunks come when
/// read or from the background download, by ranged GETs of their packs (adjacent chunks
/// of one pack in one GET), each verified.
extension SyncEngine {
    func pull() throws(StoreError) {
        // A peer's segments stay a day after its checkpoint covers them (its collector's
        // grace): a device that last looked longer ago than half that (asleep, paused)
        // may find none of the segments it missed, only the checkpoint that has them.
        let now = bootSeconds()
        if let last = memory.lastPull, now.subtractingClamped(last) > Self.rescanAfter { memory.scanDevices = true }
        memory.lastPull = now
        if state.withLock({ s in defer { s.retryNow = false }; return s.retryNow }) { memory.waiting = [:] }
        var cursor = try loadCursor()
        var look = try lookAtLog(cursor)
        // A segment whose record waits (its pack is missing or damaged) is tried again
        // after a wait that doubles up to an hour, and does not count as activity: it
        // must not cost a GET of the segment and its pack at every poll.
        let clock = bootSecondsDouble()
        let due = look.segments.filter { name in memory.waiting[name.device].map { $0.seq != name.seq || clock >= $0.next } ?? true }
        if !due.isEmpty || !look.blocked.isEmpty {
            memory.scanDevices = true
            noteActivity()
        }
        if memory.scanDevices {
            let devices = try backing.devices()
            for name in devices.ignored {
                logOnce("ubiquity: sync: ignoring devices/\(RecordCodec.printable(name)) in the backing store (not a device id)")
            }
            var readAny = false
            for device in devices.checkpoints.keys.sorted() where device != backing.deviceID {
                guard let newest = devices.newestCheckpoint(of: device) else { continue }
                let applied = cursor.applied[device, default: 0]
                let generation = try generation(of: device)
                guard newest.seq > applied || (newest.seq == 0 && generation == 0) else { continue }
                if try readCheckpoint(of: device, seq: newest.seq, parts: newest.parts, cursor: &cursor) { readAny = true }
            }
            try pullKeyValues(devices)
            memory.scanDevices = false
            if readAny { look = try lookAtLog(cursor) }
        }
        for device in look.blocked.sorted() {
            logOnce("ubiquity: sync: device \(device): segment \(cursor.applied[device, default: 0] + 1) is missing from the log and no checkpoint covers it; its later records wait")
        }
        var stopped: Set<DeviceID> = []
        var next = 0
        while next < look.segments.count {
            let name = look.segments[next]
            next += 1
            if stopped.contains(name.device) { continue }
            guard name.seq == cursor.applied[name.device, default: 0] + 1 else { continue }
            if let waiting = memory.waiting[name.device], waiting.seq == name.seq, bootSecondsDouble() < waiting.next {
                stopped.insert(name.device)
                continue
            }
            if let size = look.sizes[name], size > Backing.maxObjectRead {
                // No writer makes one (they end a segment at 4 MiB): damage or hostile,
                // skipped unread, as an over-long journal line was in format 4.
                logOnce("ubiquity: sync: skipping \(name.key): \(size) bytes, more than a segment can be")
                cursor.applied[name.device] = name.seq
                try savePosition(name.device, cursor: cursor)
                continue
            }
            let read: [UInt8]??
            do { read = try backing.segment(name) } catch {
                // Unreadable (damaged, or failing authentication in an encrypted
                // container; never applied): that device's later records wait and the
                // segment is fetched again later, as a record whose pack is missing
                // does; the other devices go on.
                logOnce("ubiquity: sync: device \(name.device): \(error); its later records wait")
                backOff(name)
                stopped.insert(name.device)
                continue
            }
            guard let bytes = read ?? nil else {
                // Collected since it was listed: its checkpoint has it (next cycle).
                memory.scanDevices = true
                stopped.insert(name.device)
                continue
            }
            // Catching up: the device's next segments too, taken in together (bigger
            // slices and fewer commits: each commit of a slice rewrites the pages of
            // indexes its records touched all over, tens of megabytes a slice in a big join).
            var group: [(name: SegmentLog.SegmentName, lines: [ArraySlice<UInt8>])] = [(name, lines(bytes))]
            var groupBytes = bytes.count, groupLines = group[0].lines.count
            while next < look.segments.count, memory.waiting[name.device] == nil,
                  groupLines < Self.groupLines, groupBytes < Self.groupBytes {
                let following = look.segments[next]
                guard following.device == name.device, following.seq == group[group.count - 1].name.seq + 1,
                      (look.sizes[following] ?? 0) <= Backing.maxObjectRead,
                      let more = (try? backing.segment(following)) ?? nil else { break } // read again on its own
                group.append((following, lines(more)))
                groupBytes += more.count
                groupLines += group[group.count - 1].lines.count
                next += 1
            }
            let generation = try generation(of: name.device)
            if group.count > 1, try apply(group.map { ($0.name.key.path, $0.lines) }, of: name.device, generation: generation) {
                memory.waiting[name.device] = nil
                cursor.applied[name.device] = group[group.count - 1].name.seq
                try savePosition(name.device, cursor: cursor)
                continue
            }
            // One segment, or a group in which a record waits: segment by segment (the
            // records a group took in are known now and skipped), up to the one that waits.
            for (segment, segmentLines) in group {
                let complete = try apply([(segment.key.path, segmentLines)], of: segment.device, generation: generation)
                guard complete else {
                    backOff(segment)
                    stopped.insert(segment.device)
                    break
                }
                memory.waiting[segment.device] = nil
                cursor.applied[segment.device] = segment.seq
                try savePosition(segment.device, cursor: cursor)
            }
        }
        // Everything the look returned is applied: the next look starts from its last key.
        // (A device waiting out a back-off does not count: the look when its wait is due
        // lists the whole window, `lookAtLog`.)
        let finished = bootSecondsDouble()
        memory.resumable = look.blocked.isEmpty && look.segments.allSatisfy { segment in
            segment.seq <= cursor.applied[segment.device, default: 0] || memory.waiting[segment.device].map { $0.next > finished } == true
        }
        let listed = max(cursor.listedUpTo, look.cursor.listedUpTo)
        // Written only when it moved: a quiet poll writes nothing to the store.
        if listed != cursor.listedUpTo {
            try shared.withLedger { (store) throws(StoreError) in
                try store.setSetting(Self.listedKey, String(listed))
            }
        }
        cursor.listedUpTo = listed
        memory.cursor = cursor
    }

    /// `segment` is tried again after a wait that doubles (5 s up to an hour) while it
    /// keeps failing.
    private func backOff(_ segment: SegmentLog.SegmentName) {
        let delay = min(3_600, max(5, (memory.waiting[segment.device].map { $0.seq == segment.seq ? $0.delay * 2 : 5 }) ?? 5))
        memory.waiting[segment.device] = (segment.seq, bootSecondsDouble() + delay, delay)
    }

    static let listedKey = "log_listed"
    /// A group of a device's segments taken in together stops past this many lines or
    /// bytes (its lines are in memory at once).
    static let groupLines = 16_000
    static let groupBytes = 16 << 20
    /// Seconds without a look at the log after which `devices/` is listed again.
    static let rescanAfter: Int64 = 12 * 3_600

    /// Lists the log from the last segment listed (`SegmentLog.start`), or its whole skew window once a minute
    /// (`SegmentLog.windowSeconds`), whenever the last look left something unapplied, and
    /// when a segment that waits (`backOff`) is due again.
    private func lookAtLog(_ cursor: SegmentLog.Cursor) throws(StoreError) -> SegmentLog.Look {
        let clock = bootSecondsDouble()
        var since: BackingKey?
        if memory.resumable, clock - memory.windowListedAt < SegmentLog.windowSeconds, let key = memory.listedKey,
           !memory.waiting.values.contains(where: { $0.next <= clock }) {
            since = SegmentLog.start(after: key, quietSeconds: clock - memory.listedKeySince)
        }
        memory.resumable = false // until what this look returns is applied
        let look = try backing.call("list log/") { () throws(BackingError) in
            try SegmentLog.look(backing.store, after: cursor, exclude: backing.deviceID, since: since)
        }
        if look.listedWindow { memory.windowListedAt = clock }
        if let key = look.lastKey, key != memory.listedKey {
            memory.listedKey = key
            memory.listedKeySince = clock
        }
        return look
    }

    /// The cursor: in memory, loaded from the store (setting `log_listed` and the
    /// segment seq applied per device in `sync_peers`) the first time.
    private func loadCursor() throws(StoreError) -> SegmentLog.Cursor {
        if let cursor = memory.cursor { return cursor }
        var cursor = SegmentLog.Cursor()
        var generations: [DeviceID: Int64] = [:]
        try shared.withLedger { (store) throws(StoreError) in
            cursor.listedUpTo = max(0, try store.setting(Self.listedKey).flatMap { Int64($0) } ?? 0)
            for (device, position) in try store.peerPositions() {
                if position.offset > 0 { cursor.applied[device] = UInt64(position.offset) }
                generations[device] = position.generation
            }
        }
        memory.cursor = cursor
        memory.generations = generations
        return cursor
    }

    /// The generation (checkpoint seq + 1) `device`'s records are read in: pruned records
    /// met there are marked with it (Store+Journal).
    private func generation(of device: DeviceID) throws(StoreError) -> Int64 {
        memory.generations[device] ?? 0
    }

    private func savePosition(_ device: DeviceID, cursor: SegmentLog.Cursor) throws(StoreError) {
        let position = Store.JournalPosition(generation: memory.generations[device] ?? 0,
                                             offset: Int64(clamping: cursor.applied[device, default: 0]))
        try shared.withLedger { (store) throws(StoreError) in
            try store.setPeerPosition(device, position)
        }
        // The memory follows the store at once: a pull that fails after this (a GET that
        // times out) does not take the same segments again next cycle.
        memory.cursor?.applied[device] = cursor.applied[device]
    }

    /// Reads `device`'s checkpoint `seq` whole; true when it was (false: rewritten
    /// meanwhile, or a record waits: the next cycle tries again).
    private func readCheckpoint(of device: DeviceID, seq: UInt64, parts: Int, cursor: inout SegmentLog.Cursor) throws(StoreError) -> Bool {
        guard let end = try backing.checkpointEnd(device, seq: seq), end.parts == parts else { return false }
        let generation = Int64(clamping: seq) + 1
        // Stored at once: a prune while the checkpoint is read must remember what it drops
        // as met in it (`seen`), or reaching its end would forget it.
        memory.generations[device] = generation
        try savePosition(device, cursor: cursor)
        for part in 0..<parts {
            guard let bytes = try backing.checkpointPart(device, seq: seq, part: part) else { return false }
            let source = "devices/\(device)/checkpoint-\(seq) part \(part)"
            guard try apply([(source, lines(bytes))], of: device, generation: generation) else { return false }
        }
        let forgotten = try shared.withLedger { (store) throws(StoreError) in try store.forgetPrunedRecords(of: device, before: generation) }
        if forgotten > 0 {
            log("ubiquity: sync: device \(device) wrote a checkpoint without \(forgotten) record(s) this device pruned: forgotten")
        }
        cursor.applied[device] = max(cursor.applied[device, default: 0], seq)
        try savePosition(device, cursor: cursor)
        log("ubiquity: sync: read the checkpoint of device \(device) (\(end.records) records)")
        return true
    }

    /// The complete lines of an object (a last line without its newline is damage).
    func lines(_ bytes: [UInt8]) -> [ArraySlice<UInt8>] {
        var result = bytes.split(separator: UInt8(ascii: "\n"), omittingEmptySubsequences: false)
        if result.last?.isEmpty == true { result.removeLast() } else if !result.isEmpty { result.removeLast() }
        return result
    }

    /// Takes in the records of `parts` (the lines of a segment or checkpoint part each,
    /// named by where they came from) this store does not hold, in order, a slice per
    /// hold of the store's lock. Returns false when one waits (a chunk could not be
    /// fetched): those before it are in, it and those after are read again next cycle.
    func apply(_ parts: [(source: String, lines: [ArraySlice<UInt8>])], of device: DeviceID, generation: Int64) throws(StoreError) -> Bool {
        let source = parts.count == 1 ? parts[0].source : "\(parts[0].source) to \(parts[parts.count - 1].source)"
        let pieces = Self.pieces(of: parts, lines: max(Self.pieceLines, options.pullSliceMost))
        guard !pieces.isEmpty else { return true }
        var sliceSize = max(1, options.pullSlice)
        var records = decoded(pieces[0], of: device)
        var next = 1
        while true {
            // The next piece is decoded on a thread of its own while this one is taken in:
            // only the first piece's decoding is waited for.
            let following = Locked<(records: [SyncRecord], skipped: [String])>(([], []))
            let decoder = next < pieces.count ? { [piece = pieces[next]] in
                JoinableThread { following.withLock { $0 = Self.decode(piece, of: device, width: 1) } }
            }() : nil
            let complete: Bool
            do { complete = try takeIn(records, of: device, generation: generation, source: source, sliceSize: &sliceSize) } catch {
                decoder?.join()
                throw error
            }
            decoder?.join()
            guard next < pieces.count else { return complete }
            if !complete {
                // A record waits, perhaps for a chunk's place a later record gives (taken
                // in as one, every record's places are stored before any record): the rest
                // as one, this piece's records again (those taken in are known now).
                records += loggingSkipped(following.withLock { $0 })
                for piece in pieces[(next + 1)...] { records += decoded(piece, of: device) }
                return try takeIn(records, of: device, generation: generation, source: source, sliceSize: &sliceSize)
            }
            records = loggingSkipped(following.withLock { $0 })
            next += 1
        }
    }

    /// Takes in `records` (of one piece, or of the rest): those not held, their chunks'
    /// places first, then the ready ones a slice per hold of the store's lock. Returns
    /// whether none waits.
    private func takeIn(_ records: [SyncRecord], of device: DeviceID, generation: Int64, source: String,
                        sliceSize: inout Int) throws(StoreError) -> Bool {
        if records.isEmpty { return true }
        let ids = records.map(\.id)
        let held = try shared.withLedger { (store) throws(StoreError) in try store.knownRecords(ids, device: device, generation: generation) }
        var taken: Set<VersionID> = []
        let fresh = records.filter { !held.contains($0.id) && taken.insert($0.id).inserted }
        var places: [ChunkID: ChunkPlace] = [:]
        for record in records { places.merge(record.places) { a, _ in a } }
        // Places first: a record may name a chunk by a place another record gave, and a
        // fetch (now, or a reader's later) looks places up in the store.
        if !places.isEmpty {
            try shared.withLedger { (store) throws(StoreError) in
                try store.setChunkPlaces(places)
            }
        }
        let (ready, complete) = try readyRecords(fresh, source: source)
        var start = 0
        while start < ready.count {
            let slice = Array(ready[start..<min(ready.count, start + sliceSize)])
            // Local changes are not recorded first here: the directories a reconcile made
            // for records whose own directory record comes in a later slice would be
            // recorded as new local directories (echo records). A local change made while
            // this slice waited on the network meets this reconcile unrecorded: reconcile
            // leaves the paths it touched for the next cycle, which records it first.
            // A slice settles moved directories first; a big move's settling goes a slice
            // a hold here, not all in the slice's hold.
            try shared.settleMoves()
            let waited = try shared.change { (store, busy) throws(StoreError) -> TreeChanges in try store.takeIn(slice, busy: busy) }
            // Slices grow while no request waits for the store's lock (up to
            // `pullSliceMost`: fewer commits, each of which rewrites pages all over the
            // indexes) and fall back to `pullSlice` once one does.
            sliceSize = waited ? max(1, options.pullSlice) : min(max(options.pullSlice, options.pullSliceMost), sliceSize * 2)
            start += slice.count
            if start < ready.count { shared.yieldToWaiters() }
        }
        if !ready.isEmpty { downloader.poke() }
        return complete
    }

    /// The least lines of a piece: a thread decodes each piece after the first.
    static let pieceLines = 1_024

    /// A part's lines from its `first` (0-based, for the log), in a piece.
    struct Fragment: Sendable {
        let source: String
        let first: Int
        let lines: ArraySlice<ArraySlice<UInt8>>
    }

    /// `parts` cut into pieces of about `lines` lines each, in order.
    static func pieces(of parts: [(source: String, lines: [ArraySlice<UInt8>])], lines: Int) -> [[Fragment]] {
        var pieces: [[Fragment]] = []
        var current: [Fragment] = [], count = 0
        for part in parts {
            var at = 0
            while at < part.lines.count {
                let end = min(part.lines.count, at + (lines - count))
                current.append(Fragment(source: part.source, first: at, lines: part.lines[at..<end]))
                count += end - at
                at = end
                if count >= lines {
                    pieces.append(current)
                    current = []
                    count = 0
                }
            }
        }
        if !current.isEmpty { pieces.append(current) }
        return pieces
    }

    static var decodeWidth: Int { max(1, min(8, Int(sysconf(Int32(_SC_NPROCESSORS_ONLN))))) }

    /// A piece's records, in order, and what is wrong with each malformed line (skipped).
    static func decode(_ piece: [Fragment], of device: DeviceID, width: Int) -> (records: [SyncRecord], skipped: [String]) {
        var records: [SyncRecord] = [], skipped: [String] = []
        for fragment in piece {
            for (n, decoded) in decode(Array(fragment.lines), of: device, width: width).enumerated() {
                switch decoded {
                case .failure(let why): skipped.append("ubiquity: sync: skipping line \(fragment.first + n + 1) of \(fragment.source): \(why)")
                case .success(let record): records.append(record)
                }
            }
        }
        return (records, skipped)
    }

    /// `decode`, on this thread, with the skipped lines logged.
    private func decoded(_ piece: [Fragment], of device: DeviceID, width: Int = SyncEngine.decodeWidth) -> [SyncRecord] {
        loggingSkipped(Self.decode(piece, of: device, width: width))
    }

    private func loggingSkipped(_ decoded: (records: [SyncRecord], skipped: [String])) -> [SyncRecord] {
        for line in decoded.skipped { logOnce(line) }
        return decoded.records
    }

    /// Lines decoded on `width` threads, in order: checking each line's checksum and
    /// hashing its carried chunks is a large part of a device's first sync on one core.
    static func decode(_ lines: [ArraySlice<UInt8>], of device: DeviceID, width: Int) -> [Result<SyncRecord, RecordCodec.Rejection>] {
        let piece = 256
        guard lines.count > piece, width > 1 else { return lines.map { RecordCodec.decode($0, journalDevice: device) } }
        let starts = Array(stride(from: 0, to: lines.count, by: piece))
        return parallelMap(starts, width: width) { start in
            lines[start..<min(lines.count, start + piece)].map { RecordCodec.decode($0, journalDevice: device) }
        }.flatMap { $0 }
    }

    /// The records of `records` ready to apply, in order, up to the first that waits
    /// (malformed ones are logged and skipped), and whether none waits. Metadata first
    /// (files on demand): a record is ready once its small chunks (carried inline) are
    /// stored and every other chunk is here or has a known place in a pack; contents come
    /// when read, or from the background download (`Downloader`).
    private func readyRecords(_ records: [SyncRecord], source: String) throws(StoreError) -> ([SyncRecord], Bool) {
        var unplaced: Set<ChunkID> = []
        for record in records {
            for (id, _) in record.chunks.chunks where record.inline[id] == nil && record.places[id] == nil { unplaced.insert(id) }
        }
        let notHere = unplaced.filter { !chunks.isLocal($0) }
        // (Stored by `apply` just before: places other records of the batch gave, too.)
        let known = notHere.isEmpty ? [:] : try shared.withLedger { (store) throws(StoreError) in try store.chunkPlaces(notHere) }
        // Small chunks are always here (a TinyPix picture is rendered from them under the
        // store's lock, with no fetch): one that came with a place and not inline (our
        // writers never do that) is fetched now, before its record applies.
        var small: [ChunkWant] = []
        for record in records {
            for (id, size) in record.chunks.chunks where size <= RecordCodec.maxInline && record.inline[id] == nil && !chunks.isLocal(id) {
                small.append(ChunkWant(id: id, size: size))
            }
        }
        if !small.isEmpty { try? chunks.ensureLocal(small) }
        var ready: [SyncRecord] = []
        records: for record in records {
            for (id, size) in record.chunks.chunks {
                if let bytes = record.inline[id] {
                    // Carried in the record, checked against its id by the codec.
                    do { try chunks.put(id, bytes) } catch {
                        logOnce("ubiquity: sync: record \(record.id) of \(source) waits: chunk \(id.hex): \(error)")
                        return (ready, false)
                    }
                    continue
                }
                if let stored = chunks.size(of: id) {
                    if stored != Int(size) {
                        logOnce("ubiquity: sync: skipping record \(record.id) of \(source): chunk \(id.hex) is \(stored) bytes, not \(size)")
                        continue records
                    }
                    continue
                }
                if size <= RecordCodec.maxInline {
                    logOnce("ubiquity: sync: record \(record.id) of \(source) waits: its small chunk \(id.hex) could not be fetched")
                    return (ready, false)
                }
                if let place = record.places[id] ?? known[id] {
                    guard Pack.isName(place.pack) else {
                        logOnce("ubiquity: sync: skipping record \(record.id) of \(source): chunk \(id.hex) has a bad pack name in its place")
                        continue records
                    }
                    continue
                }
                logOnce("ubiquity: sync: record \(record.id) of \(source) waits: no pack holds chunk \(id.hex) (its record names no place)")
                return (ready, false)
            }
            ready.append(record)
        }
        return (ready, true)
    }
}

// MARK: files on demand

extension SyncEngine {
    /// One LIST of `fossils/` and a HEAD per pack (SyncControl).
    public func packsPresent(_ packs: Set<String>) throws(StoreError) -> Set<String> {
        let candidates = packs.filter(Pack.isName)
        if candidates.isEmpty { return [] }
        let fossils = try backing.fossils()
        let store = backing.store
        let names = candidates.filter { fossils[$0] == nil }.sorted()
        let found = parallelMap(names, width: options.parallelRequests) { pack -> Result<Bool, BackingError> in
            Result { () throws(BackingError) -> Bool in try store.stat(Pack.key(pack)) != nil }
        }
        var present: Set<String> = []
        for (pack, result) in zip(names, found) {
            switch result {
            case .success(true): present.insert(pack)
            case .success(false): break
            case .failure(let error): throw Backing.storeError(error, "stat \(Pack.key(pack))")
            }
        }
        return present
    }
}

extension SyncEngine: ChunkSource {
    /// Chunks a reader or the downloader wants: their places looked up under the
    /// store's lock (briefly), then ranged GETs of their packs outside it.
    public func fetch(_ wants: [ChunkWant], into chunks: ChunkStore, arrived: @escaping @Sendable (ChunkID) -> Void) -> [ChunkID: String] {
        let places: [ChunkID: ChunkPlace]
        do {
            places = try shared.withLedger { (store) throws(StoreError) in try store.chunkPlaces(wants.map(\.id)) }
        } catch {
            return Dictionary(uniqueKeysWithValues: wants.map { ($0.id, "looking up its place: \(error)") })
        }
        var located: [PackFetch.Want] = []
        var failures: [ChunkID: String] = [:]
        for want in wants {
            guard let place = places[want.id] else {
                failures[want.id] = "no pack is known to hold it"
                continue
            }
            located.append(PackFetch.Want(id: want.id, size: want.size, place: place))
        }
        // PackFetch verified each chunk against its id before it keeps it.
        let fetched = PackFetch(store: backing.store, width: options.parallelRequests).fetch(located) { id, bytes throws(StoreError) in
            try chunks.putVerified(id, bytes)
            arrived(id)
        }
        failures.merge(fetched) { a, _ in a }
        if let (id, why) = failures.min(by: { $0.key.hex < $1.key.hex }) {
            // Logged, not remembered (`logOnce` would keep every chunk id for good).
            log("ubiquity: fetching \(failures.count) chunk(s) failed; chunk \(id.hex): \(why)")
        }
        return failures
    }
}

/// Fetches chunks from packs: those of one pack sorted by offset, neighbours (at most
/// `gap` apart, `span` bytes in all) in one ranged GET, GETs `width` at once; every
/// chunk verified against its id before `keep` gets it.
struct PackFetch {
    struct Want: Sendable {
        let id: ChunkID
        let size: Int
        let place: ChunkPlace
    }

    let store: any BackingStore
    let width: Int
    var gap: Int64 = 256 << 10
    var span: Int64 = 16 << 20

    /// Returns why each chunk that was not kept was not. Each run's chunks are verified
    /// and kept as its GET ends (concurrently with the other runs: `keep` is thread-safe),
    /// so a reader waiting for one of them goes on before the whole batch is in.
    func fetch(_ wants: [Want], keep: @escaping @Sendable (ChunkID, [UInt8]) throws(StoreError) -> Void) -> [ChunkID: String] {
        var failures: [ChunkID: String] = [:]
        var runs: [[Want]] = []
        let byPack = Dictionary(grouping: wants) { $0.place.pack }
        for pack in byPack.keys.sorted() {
            guard Pack.isName(pack) else {
                for w in byPack[pack]! { failures[w.id] = "a bad pack name in its place" }
                continue
            }
            var run: [Want] = []
            for want in byPack[pack]!.sorted(by: { $0.place.offset < $1.place.offset }) {
                if let first = run.first, let last = run.last,
                   want.place.offset - (last.place.offset + Int64(last.size)) > gap
                    || want.place.offset + Int64(want.size) - first.place.offset > span {
                    runs.append(run)
                    run = []
                }
                run.append(want)
            }
            if !run.isEmpty { runs.append(run) }
        }
        let store = self.store
        let results = parallelMap(runs, width: width) { run -> [ChunkID: String] in
            let start = run.first!.place.offset
            let end = run.map { $0.place.offset + Int64($0.size) }.max()!
            // Places come from other devices' records: bounded before any request.
            guard start >= 8, end > start, end - start <= 64 << 20 else {
                return Dictionary(run.map { ($0.id, "a chunk place out of bounds") }) { a, _ in a }
            }
            let bytes: [UInt8]
            do { bytes = try store.get(Pack.key(run.first!.place.pack), range: start..<end) } catch {
                return Dictionary(run.map { ($0.id, "pack \($0.place.pack): \(error)") }) { a, _ in a }
            }
            var failed: [ChunkID: String] = [:]
            for w in run {
                let from = Int(w.place.offset - start)
                guard from >= 0, from + w.size <= bytes.count else {
                    failed[w.id] = "pack \(w.place.pack) came short at \(w.place.offset)"
                    continue
                }
                let chunk = Array(bytes[from..<from + w.size])
                guard ChunkID(hashing: chunk) == w.id else {
                    failed[w.id] = "pack \(w.place.pack): the bytes at \(w.place.offset) are not chunk \(w.id.hex)"
                    continue
                }
                do { try keep(w.id, chunk) } catch { failed[w.id] = "\(error)" }
            }
            return failed
        }
        for failed in results { failures.merge(failed) { a, _ in a } }
        return failures
    }
}
