import UbiquityBacking
import UbiquityStore
import UbiquitySystem

/// Chunks travel in packs (backing format 5): many chunks in one object, so
/// 10,000 small files are a handful of PUTs, not 10,000, and a reader fetches one chunk
/// with a ranged GET of its bytes. The records that name a chunk carry where it is
/// (`ChunkLocation`: pack, offset, length), so reading needs no index lookup; the index at
/// the pack's end is for those who enumerate a pack (gc, repack, fsck), one ranged GET of
/// the tail. Layout (integers little-endian):
///
///     "UBQPACK1"                                  8 bytes
///     the chunks' bytes, one after another
///     index: per chunk its 32-byte id and 4-byte length, in the same order
///     count (4 bytes), "UBQPIDX1" (8 bytes)       the trailer
///
/// Pack names are random (128 bits, hex), not derived from the content: two devices never
/// write the same name, and with encryption a name must reveal nothing.
public enum Pack {
    static let magic = Array("UBQPACK1".utf8)
    static let indexMagic = Array("UBQPIDX1".utf8)
    static let headerSize = 8
    static let trailerSize = 12
    static let entrySize = 36
    /// A pack is sealed once it holds this much (and a chunk is at most 4 MiB).
    public static let targetSize = 8 << 20
    /// Chunks per pack at most: bounds the index a reader accepts (36 bytes each).
    public static let maxChunks = 1 << 16

    /// `packs/<first two digits>/<32 hex digits>`.
    public static func key(_ name: String) -> BackingKey { BackingKey(checked: "packs/\(name.prefix(2))/\(name)") }

    public static func newName() -> String { randomHex(bytes: 16) }

    /// A pack name as the layout makes them: 32 lowercase hex digits.
    public static func isName(_ name: String) -> Bool { Hex.isLowercase(name, count: 32) }

    /// Where a chunk is: a byte range of a pack.
    public struct ChunkLocation: Equatable, Sendable {
        public let id: ChunkID
        public let pack: String
        public let offset: Int64
        public let length: Int
    }

    /// Collects chunks for one pack (not thread-safe: one writer per pack).
    public struct Writer: Sendable {
        private(set) var bytes: [UInt8] = Pack.magic
        private(set) var entries: [(id: ChunkID, length: Int)] = []
        private var seen: Set<ChunkID> = []

        public init() {
            // One allocation for a full pack (and its index): no regrowth copies.
            bytes.reserveCapacity(Pack.targetSize + 4 << 20 + 64 << 10)
        }

        public var isEmpty: Bool { entries.isEmpty }
        /// Whether the pack should be sealed before another chunk goes in.
        public var isFull: Bool { bytes.count >= Pack.targetSize || entries.count >= Pack.maxChunks }
        public var byteCount: Int { bytes.count }

        /// Adds a chunk (once: a second add of the same id is ignored).
        public mutating func add(_ id: ChunkID, _ chunk: [UInt8]) {
            chunk.withUnsafeBytes { add(id, $0) }
        }

        public mutating func add(_ id: ChunkID, _ chunk: UnsafeRawBufferPointer) {
            guard seen.insert(id).inserted else { return }
            // Typed, so the append is one memcpy (a raw buffer is copied byte by byte).
            chunk.withMemoryRebound(to: UInt8.self) { bytes.append(contentsOf: $0) }
            entries.append((id, chunk.count))
        }

        public func contains(_ id: ChunkID) -> Bool { seen.contains(id) }

        /// The pack's bytes, and where each chunk is in it under `name`.
        /// Consumes the writer: the index is appended to its bytes in place (no copy of
        /// the pack).
        public consuming func sealed(name: String) -> (bytes: [UInt8], locations: [ChunkLocation]) {
            var out = bytes
            bytes = []
            var locations: [ChunkLocation] = []
            var offset = Int64(Pack.headerSize)
            for e in entries {
                locations.append(ChunkLocation(id: e.id, pack: name, offset: offset, length: e.length))
                offset += Int64(e.length)
                out += e.id.raw
                out += le32(UInt32(e.length))
            }
            out += le32(UInt32(entries.count))
            out += Pack.indexMagic
            return (out, locations)
        }

        /// Seals under a fresh random name. Seal where the writer is held alone (a writer
        /// captured by a closure shares its buffer, and appending the index would copy the
        /// whole pack).
        public consuming func seal() -> Sealed {
            let name = Pack.newName()
            let (bytes, locations) = sealed(name: name)
            return Sealed(name: name, bytes: bytes, locations: locations)
        }

        /// Seals and uploads.
        public consuming func upload(to store: any BackingStore) throws(BackingError) -> [ChunkLocation] {
            try seal().upload(to: store)
        }
    }

    /// A pack ready to go.
    public struct Sealed: Sendable {
        public let name: String
        public let bytes: [UInt8]
        public let locations: [ChunkLocation]

        /// Uploads it (`ifAbsent`: a name that exists, which 128 random bits make a
        /// programming error, is never overwritten).
        public func upload(to store: any BackingStore) throws(BackingError) -> [ChunkLocation] {
            do {
                try store.put(Pack.key(name), bytes, ifAbsent: true)
            } catch .exists(_) {
                // A retried put whose first attempt landed (a reply lost to a timeout): the
                // name is 128 random bits, so an object of this size there is ours.
                guard try store.stat(Pack.key(name))?.size == Int64(bytes.count) else { throw .exists(Pack.key(name).path) }
            }
            return locations
        }
    }

    /// One chunk, by a ranged GET, verified: bytes that do not hash to the id (a damaged
    /// or hostile pack) are `.garbage`, never returned.
    public static func fetch(_ location: ChunkLocation, from store: any BackingStore) throws(BackingError) -> [UInt8] {
        // Locations come from other devices' records: checked before any arithmetic or key.
        guard isName(location.pack), location.offset >= Int64(headerSize), location.offset <= 5 << 40,
              location.length >= 0, location.length <= 4 << 20 else {
            throw .garbage("a chunk location out of bounds: \(location.pack.prefix(40)) at \(location.offset)+\(location.length)")
        }
        let bytes = try store.get(key(location.pack), range: location.offset..<location.offset + Int64(location.length))
        guard bytes.count == location.length, ChunkID(hashing: bytes) == location.id else {
            throw .garbage("pack \(location.pack): the chunk at \(location.offset) does not match \(location.id)")
        }
        return bytes
    }

    /// A pack's index, from its size and one ranged GET of its tail; every number checked
    /// against the size before use.
    public static func index(_ name: String, in store: any BackingStore) throws(BackingError) -> [ChunkLocation] {
        guard isName(name) else { throw .garbage("not a pack name: \(name.prefix(40))") }
        guard let info = try store.stat(key(name)) else { throw .notFound(key(name).path) }
        let size = info.size
        guard size >= Int64(headerSize + trailerSize) else { throw .garbage("pack \(name): \(size) bytes is too short") }
        let trailer = try store.get(key(name), range: size - Int64(trailerSize)..<size)
        guard trailer.count == trailerSize, Array(trailer[4...]) == indexMagic else { throw .garbage("pack \(name): no index trailer") }
        let count = Int(readLE32(trailer, 0))
        let indexSize = Int64(count) * Int64(entrySize)
        guard count <= maxChunks, indexSize + Int64(headerSize + trailerSize) <= size else {
            throw .garbage("pack \(name): an index of \(count) chunks does not fit its \(size) bytes")
        }
        let raw = try store.get(key(name), range: size - Int64(trailerSize) - indexSize..<size - Int64(trailerSize))
        guard raw.count == Int(indexSize) else { throw .garbage("pack \(name): the index came short") }
        return try parseIndex(raw, count: count, name: name, dataEnd: size - Int64(trailerSize) - indexSize)
    }

    static func parseIndex(_ raw: [UInt8], count: Int, name: String, dataEnd: Int64) throws(BackingError) -> [ChunkLocation] {
        var locations: [ChunkLocation] = []
        var offset = Int64(headerSize)
        for i in 0..<count {
            let at = i * entrySize
            guard let id = ChunkID(raw: raw[at..<at + 32]) else { throw .garbage("pack \(name): a bad id") }
            let length = Int(readLE32(raw, at + 32))
            guard length <= 4 << 20, offset + Int64(length) <= dataEnd else {
                throw .garbage("pack \(name): chunk \(i) runs past the data")
            }
            locations.append(ChunkLocation(id: id, pack: name, offset: offset, length: length))
            offset += Int64(length)
        }
        guard offset == dataEnd else { throw .garbage("pack \(name): the index covers \(offset) of \(dataEnd) bytes") }
        return locations
    }

    static func le32(_ v: UInt32) -> [UInt8] { [UInt8(v & 0xff), UInt8(v >> 8 & 0xff), UInt8(v >> 16 & 0xff), UInt8(v >> 24)] }
    static func readLE32(_ b: [UInt8], _ at: Int) -> UInt32 {
        UInt32(b[at]) | UInt32(b[at + 1]) << 8 | UInt32(b[at + 2]) << 16 | UInt32(b[at + 3]) << 24
    }
}
