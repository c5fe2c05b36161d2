import Glibc
import UbiquitySystem

/// Chunks in local append-only pack files: the store's way to keep chunks without a file
/// each. `ChunkStore` does not use it yet: `LocalPacksModelTests` holds it against a
/// model, with crashes and torn tails, before it carries user data.
///
/// On disk (`directory`, docs/FORMAT.md "Local packs"):
/// - `NNNNNNNN.pack`: a 16-byte header, then records appended one after another, each a
///   48-byte header (magic, length, chunk id, a check of those) and the chunk's bytes.
/// - `NNNNNNNN.idx`: a sealed pack's index (every record's id, offset and length), written
///   once the pack is full and flushed, so an open reads indexes, not every header. A
///   pack without one (the one being written, or one a crash caught before its index) is
///   scanned at open, its records' bytes hashed; nothing is appended to it after an open.
///
/// In memory, an index from chunk to (pack, offset, length); lookups never touch the
/// disk. Descriptors stay open; a pack is closed when the last reader holding it is done.
///
/// Locks: appends take `appending` (one writer at a time, the write itself inside it: a
/// record half written must never have a record after it, else a scan at open would stop
/// at the gap and lose what follows); the index and the pack table take `state`, briefly,
/// never around I/O. Flushes (`sync`) run outside both.
public final class LocalPacks: Sendable {
    /// Where a chunk's bytes are: the pack, the offset of its bytes (after the record's
    /// header) and their length.
    struct Place: Equatable {
        let pack: UInt32
        let offset: Int64
        let length: Int
    }

    /// One pack file, kept open while anything holds it.
    final class Pack: Sendable {
        let number: UInt32
        let fd: Int32
        let path: String
        init(number: UInt32, fd: Int32, path: String) {
            self.number = number
            self.fd = fd
            self.path = path
        }
        deinit { close(fd) }
    }

    private struct PackState {
        let pack: Pack
        /// Its bytes: where the next record goes while it is the active pack; after an open,
        /// the file's length (what is not a record there counts as dead).
        var size: Int64
        var liveBytes: Int64 = 0
        var deadBytes: Int64 = 0
        /// Full (or cut short by a failure) and not appended to again; `sealed` once its
        /// bytes are flushed and its index written.
        var full = false
        var sealed = false
        /// Without its header (made, and a crash came first): nothing in it, to delete.
        var headerless = false
        /// The chunks written here, in the order they lie (removed ones too: the index
        /// says which still live here), so a pack's work costs its own records.
        var records: [ChunkID] = []
    }

    /// A pack's chunks that still live there, with their places, in the order they lie.
    private static func live(in number: UInt32, _ s: State) -> [(ChunkID, Place)] {
        guard let pack = s.packs[number] else { return [] }
        var seen: Set<ChunkID> = []
        return pack.records.compactMap { id in
            guard let place = s.index[id], place.pack == number, seen.insert(id).inserted else { return nil }
            return (id, place)
        }
    }

    private struct State {
        var index: [ChunkID: Place] = [:]
        var packs: [UInt32: PackState] = [:]
        var active: UInt32 = 0
        var nextNumber: UInt32 = 1
    }

    public let directory: String
    /// A pack takes records until it holds this many bytes (one record may pass it).
    public let packLimit: Int64
    private let state = Locked(State(), rank: .leaf)
    private let appending = Locked((), rank: .packAppend)

    static let fileHeader: [UInt8] = Array("UBQLPCK1".utf8) + [UInt8](repeating: 0, count: 8)
    static let recordHeaderSize = 48
    static let recordMagic: [UInt8] = Array("UPUR".utf8)
    static let indexMagic: [UInt8] = Array("UBQLIDX1".utf8)
    /// The longest record a scan or an index accepts (a chunk is at most 256 KiB; this
    /// bounds what a damaged length can make a reader allocate).
    static let maxChunkLength = 16 << 20

    public init(directory: String, packLimit: Int64 = 64 << 20) throws(StoreError) {
        self.directory = directory
        self.packLimit = max(Int64(Self.fileHeader.count + Self.recordHeaderSize + 1), packLimit)
        if mkdir(directory, 0o700) != 0 && errno != EEXIST { throw StoreError.io(errno: errno, "create \(directory)") }
        let loaded = try Self.load(directory)
        state.withLock { $0 = loaded }
        try appending.withLock { (_: inout Void) throws(StoreError) in try startPackIfNeeded() }
    }

    // MARK: reads

    public func contains(_ id: ChunkID) -> Bool { state.withLock { $0.index[id] != nil } }

    public var count: Int { state.withLock { $0.index.count } }

    /// The chunk's bytes, verified against its id; nil when it is not here. A record whose
    /// bytes do not hash to the id throws `.corruptChunk` (never wrong bytes).
    public func read(_ id: ChunkID) throws(StoreError) -> [UInt8]? {
        guard let (place, pack) = state.withLock({ s -> (Place, Pack)? in
            guard let place = s.index[id], let pack = s.packs[place.pack]?.pack else { return nil }
            return (place, pack)
        }) else { return nil }
        let bytes = try StoreError.wrap { () throws(SystemError) in
            try readBytes(pack.fd, count: place.length, at: place.offset, path: pack.path)
        }
        guard bytes.count == place.length, ChunkID(hashing: bytes) == id else { throw .corruptChunk(id) }
        return bytes
    }

    // MARK: writes

    /// Appends the chunk unless it is here already. Durable after the next `sync`.
    public func put(_ id: ChunkID, _ bytes: [UInt8]) throws(StoreError) {
        guard bytes.count <= Self.maxChunkLength else { throw .invalidContent("a chunk of \(bytes.count) bytes is longer than a pack record may be") }
        try appending.withLock { (_: inout Void) throws(StoreError) in
            if contains(id) { return }
            try append(id, bytes)
        }
    }

    /// Under `appending`: the record goes at the active pack's end, then into the index.
    /// `moving`: a compaction's copy out of that pack, which the index takes only if the
    /// chunk still lives there (one removed meanwhile stays removed; its copy is dead).
    private func append(_ id: ChunkID, _ bytes: [UInt8], moving from: UInt32? = nil) throws(StoreError) {
        try startPackIfNeeded()
        let (pack, at) = state.withLock { s in (s.packs[s.active]!.pack, s.packs[s.active]!.size) }
        var record = Self.recordHeader(id, length: bytes.count)
        record += bytes
        do {
            try Self.write(record, to: pack, at: at)
        } catch {
            // What the failed write left is not a record: nothing is appended after it (a
            // scan would stop there); the pack is cut back and the next append starts a new one.
            _ = ftruncate(pack.fd, off_t(at))
            state.withLock { $0.packs[pack.number]?.full = true }
            throw error
        }
        state.withLock { s in
            let written = Int64(record.count)
            s.packs[pack.number]!.size = at + written
            s.packs[pack.number]!.records.append(id)
            if let from, s.index[id]?.pack != from {
                s.packs[pack.number]!.deadBytes += written
            } else {
                s.packs[pack.number]!.liveBytes += written
                if let old = s.index[id], old.pack != pack.number {
                    let oldBytes = Int64(Self.recordHeaderSize + old.length)
                    s.packs[old.pack]?.liveBytes -= oldBytes
                    s.packs[old.pack]?.deadBytes += oldBytes
                }
                s.index[id] = Place(pack: pack.number, offset: at + Int64(Self.recordHeaderSize), length: bytes.count)
            }
            if s.packs[pack.number]!.size >= packLimit { s.packs[pack.number]!.full = true }
        }
    }

    /// Under `appending`: a new active pack when there is none or it is full.
    private func startPackIfNeeded() throws(StoreError) {
        if state.withLock({ s in s.packs[s.active].map { !$0.full } ?? false }) { return }
        // The next free number (a name taken by a file this process did not make, or the
        // numbers run past the last, is passed over).
        var number: UInt32 = 0, fd: Int32 = -1, path = ""
        for _ in 0..<1_000 {
            number = state.withLock { s in
                defer { s.nextNumber = s.nextNumber == .max ? 1 : s.nextNumber + 1 }
                return s.nextNumber
            }
            path = Self.path(directory, number, "pack")
            fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
            if fd >= 0 || errno != EEXIST { break }
        }
        if fd < 0 { throw .io(errno: errno, "create \(path)") }
        let pack = Pack(number: number, fd: fd, path: path)
        do { try Self.write(Self.fileHeader, to: pack, at: 0) } catch {
            unlink(path) // holds nothing (a full disk, say): no file to leave behind
            throw error
        }
        state.withLock { s in
            s.packs[number] = PackState(pack: pack, size: Int64(Self.fileHeader.count))
            s.active = number
        }
    }

    /// Chunks no version names any more (gc): out of the index, their bytes counted dead
    /// until `compact` rewrites their packs. Not persisted: after a crash they are back,
    /// and gc's next sweep finds them again.
    public func remove(_ ids: [ChunkID]) {
        state.withLock { s in
            for id in ids {
                guard let place = s.index.removeValue(forKey: id) else { continue }
                let bytes = Int64(Self.recordHeaderSize + place.length)
                s.packs[place.pack]?.liveBytes -= bytes
                s.packs[place.pack]?.deadBytes += bytes
            }
        }
    }

    // MARK: durability

    /// Makes every chunk put so far durable: the packs written since the last call are
    /// flushed (no lock held), then full ones get their index and are sealed.
    public func sync() throws(StoreError) {
        let (open, full) = state.withLock { s in
            (s.packs.values.filter { !$0.sealed }.map(\.pack), s.packs.values.filter { $0.full && !$0.sealed }.map { ($0.pack, $0.size) })
        }
        for pack in open where fdatasync(pack.fd) != 0 { throw .io(errno: errno, "flush \(pack.path)") }
        for (pack, size) in full {
            let entries = state.withLock { s in Self.live(in: pack.number, s) }
            try StoreError.wrap { () throws(SystemError) in
                try writeFileAtomically(Self.path(directory, pack.number, "idx"), Self.indexFile(entries, packSize: size),
                                        tempPrefix: ".tmp-idx-", durable: true)
            }
            state.withLock { $0.packs[pack.number]?.sealed = true }
        }
        if !full.isEmpty || !open.isEmpty {
            try StoreError.wrap { () throws(SystemError) in try fsyncPath(directory, directory: true) }
        }
    }

    // MARK: compaction

    /// Rewrites the sealed packs whose dead bytes are at least `deadShare` of what they
    /// hold: their live chunks are appended to the active pack, flushed, and the old pack
    /// and its index deleted. A crash in between leaves a chunk in both places, either
    /// good. Returns the bytes freed.
    @discardableResult
    public func compact(deadShare: Double = 0.5) throws(StoreError) -> Int64 {
        let victims = state.withLock { s in
            s.packs.values.filter {
                $0.sealed && ($0.headerless || $0.deadBytes > 0 && Double($0.deadBytes) >= deadShare * Double($0.liveBytes + $0.deadBytes))
            }
                .map(\.pack.number).sorted()
        }
        for number in victims {
            // In the order they lie: the copies keep their neighbours.
            let live = state.withLock { s in Self.live(in: number, s).map(\.0) }
            for id in live {
                try appending.withLock { (_: inout Void) throws(StoreError) in
                    // Removed meanwhile: nothing to copy. One that does not read (damaged)
                    // stays, and so does its pack, for fsck to repair.
                    guard state.withLock({ $0.index[id]?.pack == number }), let bytes = try? read(id) else { return }
                    try append(id, bytes, moving: number)
                }
            }
        }
        // The copies flushed once for all the packs, before any old one goes.
        try sync()
        var freed: Int64 = 0
        for number in victims {
            let gone = state.withLock { s -> PackState? in
                // Only a sealed pack is compacted, and nothing is appended to a sealed
                // pack: what still lives here is what did not read.
                guard Self.live(in: number, s).isEmpty else { return nil }
                return s.packs.removeValue(forKey: number)
            }
            guard let gone else { continue }
            unlink(Self.path(directory, number, "idx"))
            unlink(gone.pack.path)
            freed += gone.size
        }
        if freed > 0 { try StoreError.wrap { () throws(SystemError) in try fsyncPath(directory, directory: true) } }
        return freed
    }

    /// Each pack: its number, bytes (header and whole records), bytes of live records,
    /// and whether it is sealed.
    public var packs: [(number: UInt32, bytes: Int64, live: Int64, sealed: Bool)] {
        state.withLock { s in
            s.packs.values.map { ($0.pack.number, $0.size, $0.liveBytes, $0.sealed) }.sorted { $0.number < $1.number }
        }
    }

    // MARK: format

    static func path(_ directory: String, _ number: UInt32, _ suffix: String) -> String {
        let hex = String(number, radix: 16)
        return "\(directory)/\(String(repeating: "0", count: max(0, 8 - hex.count)))\(hex).\(suffix)"
    }

    static func recordHeader(_ id: ChunkID, length: Int) -> [UInt8] {
        var header: [UInt8] = []
        header.reserveCapacity(recordHeaderSize)
        header += recordMagic
        appendLE(&header, UInt64(length), bytes: 4)
        header += id.raw
        appendLE(&header, fnv1a(header), bytes: 8)
        return header
    }

    /// The record's id and length, if `header` is a whole record header.
    static func parseRecordHeader(_ header: ArraySlice<UInt8>) -> (ChunkID, Int)? {
        guard header.count == recordHeaderSize else { return nil }
        let h = Array(header)
        guard h[0..<4].elementsEqual(recordMagic), readLE(h, 40, 8) == fnv1a(h[0..<40]),
              let id = ChunkID(raw: h[8..<40]) else { return nil }
        let length = Int(readLE(h, 4, 4))
        guard length <= maxChunkLength else { return nil }
        return (id, length)
    }

    /// `entries` in the order they lie in the pack (`live(in:)`).
    static func indexFile(_ entries: [(ChunkID, Place)], packSize: Int64) -> [UInt8] {
        var out = indexMagic
        appendLE(&out, UInt64(packSize), bytes: 8)
        appendLE(&out, UInt64(entries.count), bytes: 8)
        for (id, place) in entries {
            out += id.raw
            appendLE(&out, UInt64(place.offset), bytes: 8)
            appendLE(&out, UInt64(place.length), bytes: 8)
        }
        appendLE(&out, fnv1a(out[...]), bytes: 8)
        return out
    }

    /// A sealed pack's records from its index; nil when the index is not whole and right
    /// for a pack of `fileSize` bytes (the pack is then scanned).
    static func parseIndex(_ bytes: [UInt8], pack: UInt32, fileSize: Int64) -> [(ChunkID, Place)]? {
        guard bytes.count >= 32, Array(bytes[0..<8]) == indexMagic,
              readLE(bytes, bytes.count - 8, 8) == fnv1a(bytes[0..<(bytes.count - 8)]) else { return nil }
        let size = readLE(bytes, 8, 8), count = readLE(bytes, 16, 8)
        guard size <= UInt64(fileSize), count <= UInt64((bytes.count - 32) / 48), 24 + Int(count) * 48 + 8 == bytes.count else { return nil }
        var places: [(ChunkID, Place)] = []
        places.reserveCapacity(Int(count))
        for i in 0..<Int(count) {
            let at = 24 + i * 48
            guard let id = ChunkID(raw: bytes[at..<(at + 32)]) else { return nil }
            let offset = readLE(bytes, at + 32, 8), length = readLE(bytes, at + 40, 8)
            guard offset >= UInt64(fileHeader.count + recordHeaderSize), length <= UInt64(maxChunkLength),
                  offset <= size, length <= size - offset else { return nil }
            places.append((id, Place(pack: pack, offset: Int64(offset), length: Int(length))))
        }
        return places
    }

    private static func write(_ bytes: [UInt8], to pack: Pack, at offset: Int64) throws(StoreError) {
        var failure: SystemError?
        bytes.withUnsafeBytes { raw in
            do throws(SystemError) { try writeAll(pack.fd, raw, at: offset, path: pack.path) } catch { failure = error }
        }
        if let failure { throw .io(errno: failure.code, failure.context) }
    }

    // MARK: open

    private static func load(_ directory: String) throws(StoreError) -> State {
        var s = State()
        let names = try StoreError.wrap { () throws(SystemError) in try directoryEntries(directory) }
        // An index a crash caught before its rename: written again at the next sync.
        for name in names where name.hasPrefix(".tmp-idx-") { unlink(directory + "/" + name) }
        // Only the names this code gives (a stray `0000000A.pack` is not one).
        let numbers = names.compactMap { name -> UInt32? in
            guard name.hasSuffix(".pack"), name.utf8.count == 13, let number = UInt32(name.prefix(8), radix: 16),
                  Self.path("", number, "pack").utf8.dropFirst().elementsEqual(name.utf8) else { return nil }
            return number
        }.sorted()
        for number in numbers {
            let path = Self.path(directory, number, "pack")
            let fd = open(path, O_RDWR | O_CLOEXEC)
            if fd < 0 && errno == EISDIR { continue } // not a pack
            if fd < 0 { throw .io(errno: errno, "open \(path)") }
            let pack = Pack(number: number, fd: fd, path: path)
            var st = stat()
            guard fstat(fd, &st) == 0 else { throw .io(errno: errno, "stat \(path)") }
            let indexBytes = try StoreError.wrap { () throws(SystemError) in
                // A pack of 64 MiB has an index of a few MiB; a larger one is not an index.
                try readFile(Self.path(directory, number, "idx"), limit: 1 << 28)
            }
            // The whole file counts, not only its records: nothing is appended to a pack
            // after an open, and what is not a record (a torn tail, stray bytes) is dead
            // until a compaction rewrites the pack.
            var entry = PackState(pack: pack, size: Int64(st.st_size))
            let places: [(ChunkID, Place)]
            let hasHeader = try Self.hasHeader(pack)
            if let indexBytes, let parsed = parseIndex(indexBytes, pack: number, fileSize: Int64(st.st_size)) {
                entry.full = true
                entry.sealed = true
                places = parsed
            } else {
                places = hasHeader ? try scan(pack, fileSize: Int64(st.st_size)) : []
            }
            let headerBytes = hasHeader ? Int64(fileHeader.count) : 0
            entry.headerless = !hasHeader
            for (id, place) in places {
                let bytes = Int64(recordHeaderSize + place.length)
                // Twice (a compaction a crash cut short, or a chunk put again after gc
                // removed it): the later copy counts.
                if let old = s.index[id] {
                    let oldBytes = Int64(recordHeaderSize + old.length)
                    if old.pack == number {
                        entry.liveBytes -= oldBytes
                    } else {
                        s.packs[old.pack]?.liveBytes -= oldBytes
                        s.packs[old.pack]?.deadBytes += oldBytes
                    }
                }
                s.index[id] = place
                entry.liveBytes += bytes
                entry.records.append(id)
            }
            entry.deadBytes = max(0, entry.size - headerBytes - entry.liveBytes)
            s.packs[number] = entry
            s.nextNumber = max(s.nextNumber, number == .max ? 1 : number + 1)
        }
        // Appends go to a fresh pack: the last one may be another process's half record
        // away from full, and a new file costs nothing.
        for number in s.packs.keys { s.packs[number]?.full = true }
        return s
    }

    /// Whether the pack begins with its header. One that does not was made, and a crash
    /// came before its header was whole: nothing in it was ever flushed, and all of it
    /// counts as dead, for a compaction to delete. (A later format of packs comes with a
    /// later format of the store, which this one refuses first.)
    private static func hasHeader(_ pack: Pack) throws(StoreError) -> Bool {
        let header = try StoreError.wrap { () throws(SystemError) in
            try readBytes(pack.fd, count: fileHeader.count, at: 0, path: pack.path)
        }
        return header.count == fileHeader.count && header.starts(with: fileHeader.prefix(8))
    }

    /// The whole records of a pack without an index. Past a record that is not whole (a
    /// torn tail after a crash, or a damaged header) the scan looks for the next record
    /// header, so damage in the middle costs only its record.
    private static func scan(_ pack: Pack, fileSize: Int64) throws(StoreError) -> [(ChunkID, Place)] {
        var at = Int64(fileHeader.count)
        var places: [(ChunkID, Place)] = []
        while at + Int64(recordHeaderSize) <= fileSize {
            let bytes = try StoreError.wrap { () throws(SystemError) in
                try readBytes(pack.fd, count: recordHeaderSize, at: at, path: pack.path)
            }
            if let (id, length) = parseRecordHeader(bytes[...]), at + Int64(recordHeaderSize) + Int64(length) <= fileSize {
                // A pack without an index was not all flushed: a power loss can keep a
                // record's header and not its bytes. Such a record is not the chunk (else a
                // later put of it would find it here and keep the damaged copy).
                let data = try StoreError.wrap { () throws(SystemError) in
                    try readBytes(pack.fd, count: length, at: at + Int64(recordHeaderSize), path: pack.path)
                }
                if data.count == length && ChunkID(hashing: data) == id {
                    places.append((id, Place(pack: pack.number, offset: at + Int64(recordHeaderSize), length: length)))
                }
                at += Int64(recordHeaderSize + length)
                continue
            }
            guard let next = try nextRecord(in: pack, from: at + 1, fileSize: fileSize) else { break }
            at = next
        }
        return places
    }

    /// The offset of the next whole record header at or after `from`, read a window at a
    /// time (a damaged pack is never read into memory whole).
    private static func nextRecord(in pack: Pack, from: Int64, fileSize: Int64) throws(StoreError) -> Int64? {
        let window = 1 << 20
        var start = from
        while start + Int64(recordHeaderSize) <= fileSize {
            let bytes = try StoreError.wrap { () throws(SystemError) in
                try readBytes(pack.fd, count: Int(min(Int64(window + recordHeaderSize), fileSize - start)), at: start, path: pack.path)
            }
            var i = 0
            while i + recordHeaderSize <= bytes.count {
                if bytes[i..<(i + 4)].elementsEqual(recordMagic),
                   let (_, length) = parseRecordHeader(bytes[i..<(i + recordHeaderSize)]),
                   start + Int64(i + recordHeaderSize + length) <= fileSize {
                    return start + Int64(i)
                }
                i += 1
            }
            start += Int64(window)
        }
        return nil
    }
}

/// FNV-1a, 64 bits: a check against torn and stray bytes in local pack headers (the
/// chunks themselves are checked by their SHA-256).
func fnv1a(_ bytes: some Collection<UInt8>) -> UInt64 {
    var hash: UInt64 = 0xcbf2_9ce4_8422_2325
    for b in bytes { hash = (hash ^ UInt64(b)) &* 0x0000_0100_0000_01b3 }
    return hash
}

private func appendLE(_ out: inout [UInt8], _ value: UInt64, bytes: Int) {
    for i in 0..<bytes { out.append(UInt8(truncatingIfNeeded: value >> (8 * i))) }
}

private func readLE(_ bytes: [UInt8], _ at: Int, _ count: Int) -> UInt64 {
    var value: UInt64 = 0
    for i in (0..<count).reversed() { value = value << 8 | UInt64(bytes[at + i]) }
    return value
}
