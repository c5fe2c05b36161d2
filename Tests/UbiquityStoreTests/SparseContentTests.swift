import Glibc
import Testing
import TestSupport
@testable import UbiquityStore

/// Sparse files (issue: `truncate -s 1P` took the daemon down): holes are runs, staging is
/// packed, and no size or offset makes the content allocate or loop in proportion to it.
@Suite struct SparseContentTests {
    /// A file whose bytes are mostly never written: the model keeps only written bytes.
    struct SparseModel {
        var size: Int64 = 0
        var bytes: [Int64: UInt8] = [:]
        mutating func write(_ offset: Int64, _ data: [UInt8]) {
            for (i, b) in data.enumerated() { bytes[offset + Int64(i)] = b }
            size = max(size, offset + Int64(data.count))
        }
        mutating func truncate(_ newSize: Int64) {
            if newSize < size { bytes = bytes.filter { $0.key < newSize } }
            size = newSize
        }
        func read(_ offset: Int64, _ count: Int) -> [UInt8] {
            guard offset < size else { return [] }
            let end = min(size, offset + Int64(count))
            return (offset..<end).map { bytes[$0] ?? 0 }
        }
        /// Whether `offset` holds a byte that was written (data, for SEEK_DATA).
        func written(_ offset: Int64) -> Bool { bytes[offset] != nil }
    }

    /// Random writes and truncates at offsets up to 2^50, commits and reopens, against
    /// the model; every version's chunk list stays small and every read agrees.
    @Test(arguments: [11, 12, 13, UInt64.random(in: 100...UInt64.max)])
    func hugeOffsetsAgreeWithModel(seed: UInt64) throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let chunks = try ChunkStore(directory: dir.path + "/chunks")
        let chunker = Chunker(minSize: 256, avgSize: 1024, maxSize: 4096)
        var gen = SplitMix64(seed: seed)
        var model = SparseModel()
        var content = FileContent(base: ChunkList(), chunks: chunks, stagingDirectory: dir.path)
        var committed = ChunkList()
        var written = 0
        // Offsets near the current end, near 2^31/2^32, or anywhere up to 2^50.
        func offset() -> Int64 {
            switch gen.int(0..<4) {
            case 0: return Int64(gen.int(0..<Int(min(model.size, 1 << 30) + 2000)))
            case 1: return (Int64(1) << 31) + Int64(gen.int(0..<8192)) - 4096
            case 2: return (Int64(1) << 32) + Int64(gen.int(0..<8192)) - 4096
            default: return Int64(gen.next() % (UInt64(1) << 50))
            }
        }
        for step in 0..<200 {
            let context = "seed \(seed) step \(step)"
            switch gen.int(0..<10) {
            case 0..<4:
                let at = offset()
                let data = gen.bytes(gen.int(1..<3000))
                written += data.count
                try data.withUnsafeBytes { try content.write(offset: at, $0) }
                model.write(at, data)
            case 4:
                let size = gen.int(0..<3) == 0 ? Int64(gen.int(0..<5000)) : offset()
                try content.truncate(size)
                model.truncate(size)
            case 5, 6:
                try content.commit(chunker: chunker) { committed = $0; return $0 }
                #expect(committed.totalSize == model.size, "\(context): committed size")
                // Pieces are bounded by what was written, not by the size.
                #expect(committed.count <= 2 * (written / 256 + step + 2), "\(context): \(committed.count) pieces")
                #expect(committed.storedBytes <= Int64(written) + 8192 * Int64(step + 1), "\(context): stored bytes")
                let decoded = ChunkList(encoded: committed.encoded)
                #expect(decoded == committed, "\(context): encoding round trip")
                if step % 3 == 0 { content = FileContent(base: committed, chunks: chunks, stagingDirectory: dir.path) }
            case 7:
                let at = gen.int(0..<2) == 0 ? offset() : Int64(gen.int(0..<Int(min(model.size + 10, 1 << 40))))
                if let next = content.seek(data: true, from: at) {
                    #expect(next >= at && next < model.size, "\(context): SEEK_DATA(\(at)) = \(next)")
                    // No written byte lies between at and next.
                    #expect(!model.bytes.keys.contains { $0 >= at && $0 < next }, "\(context): SEEK_DATA skipped data")
                } else {
                    #expect(at >= model.size || !model.bytes.keys.contains { $0 >= at }, "\(context): SEEK_DATA(\(at)) ENXIO")
                }
                if let hole = content.seek(data: false, from: at) {
                    #expect(hole >= at && hole <= model.size, "\(context): SEEK_HOLE(\(at)) = \(hole)")
                } else {
                    #expect(at >= model.size, "\(context): SEEK_HOLE(\(at)) ENXIO")
                }
            default:
                let at = gen.int(0..<2) == 0 ? offset() : max(0, model.size - Int64(gen.int(0..<5000)))
                let count = gen.int(0..<5000)
                #expect(try content.read(offset: at, count: count) == model.read(at, count), "\(context): read(\(at), \(count))")
            }
            #expect(content.size == model.size, "\(context): size")
        }
        try content.commit(chunker: chunker) { committed = $0; return $0 }
        let reopened = FileContent(base: committed, chunks: chunks, stagingDirectory: dir.path)
        for at in model.bytes.keys.sorted().prefix(200) {
            #expect(try reopened.read(offset: at, count: 1) == model.read(at, 1), "seed \(seed): byte \(at) after reopen")
        }
    }

    /// `truncate -s 1P; echo x >> f`: one hole and one small chunk, no zero chunks.
    @Test func petabyteHoleCostsNothing() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let chunks = try ChunkStore(directory: dir.path + "/chunks")
        let content = FileContent(base: ChunkList(), chunks: chunks, stagingDirectory: dir.path)
        let petabyte: Int64 = 1 << 50
        try content.truncate(petabyte)
        var list = ChunkList()
        try content.commit { list = $0; return $0 }
        #expect(list.count == 1 && list.isHole(0) && list.totalSize == petabyte)
        try Array("x\n".utf8).withUnsafeBytes { try content.write(offset: petabyte, $0) }
        try content.commit { list = $0; return $0 }
        #expect(list.count == 2 && list.isHole(0) && list.storedBytes == 2)
        #expect(try content.read(offset: 0, count: 4) == [0, 0, 0, 0])
        #expect(try content.read(offset: petabyte - 1, count: 10) == [0] + Array("x\n".utf8))
        #expect(content.seek(data: true, from: 0) == petabyte)
        #expect(content.seek(data: false, from: 0) == 0)
        #expect(content.seek(data: false, from: petabyte) == petabyte + 2)
        #expect(content.seek(data: true, from: petabyte + 2) == nil)
        // The staging file held 2 bytes, not a petabyte: nothing on disk grew with the size.
        #expect(content.allocatedBytes == 2)
    }

    /// Sizes at the limit are refused with EFBIG, never trapped on.
    @Test func limitsAreErrors() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let chunks = try ChunkStore(directory: dir.path + "/chunks")
        let content = FileContent(base: ChunkList(), chunks: chunks, stagingDirectory: dir.path)
        #expect(throws: StoreError.io(errno: EFBIG, "truncate to \(Int64.max)")) { try content.truncate(.max) }
        #expect(throws: StoreError.self) { try [1].withUnsafeBytes { try content.write(offset: maxFileSize, $0) } }
        #expect(throws: StoreError.self) { try [1].withUnsafeBytes { try content.write(offset: .max, $0) } }
        try content.truncate(maxFileSize)
        #expect(try content.read(offset: .max, count: 1 << 20) == [])
        #expect(try content.read(offset: maxFileSize - 1, count: 1 << 20) == [0])
        #expect(content.seek(data: true, from: .max) == nil)
    }

    /// Chunk lists from the database are untrusted: malformed ones decode to nil.
    @Test func malformedListsAreRejected() {
        var hole = [UInt8](repeating: 0, count: 36)
        withUnsafeBytes(of: (Int64(1) << 62).littleEndian) { for (i, b) in $0.enumerated() { hole[i] = b } }
        #expect(ChunkList(encoded: hole)?.totalSize == 1 << 62)
        #expect(ChunkList(encoded: hole + hole) == nil, "two holes of 2^62 exceed the maximum size")
        #expect(ChunkList(encoded: [UInt8](repeating: 0, count: 36)) == nil, "a hole of 0 bytes")
        var bigChunk = Array(ChunkID(hashing: [1]).raw) + [0, 0, 0, 0]
        bigChunk[32...35] = [0xFF, 0xFF, 0xFF, 0x7F]
        #expect(ChunkList(encoded: bigChunk) == nil, "a chunk over 4 MiB")
        #expect(ChunkList(encoded: [1, 2, 3]) == nil)
    }

    /// The staging map against a byte model: overwrites in place, appends, partial overlaps.
    @Test(arguments: [21, 22, UInt64.random(in: 100...UInt64.max)])
    func stagedExtentsAgreeWithModel(seed: UInt64) {
        var gen = SplitMix64(seed: seed)
        var extents = StagedExtents()
        var staging: [UInt8] = []
        var model: [Int64: UInt8] = [:]
        for step in 0..<2000 {
            let at = Int64(gen.int(0..<5000))
            let data = gen.bytes(gen.int(1..<300))
            let r = at..<at + Int64(data.count)
            let where_ = extents.location(for: r)
            #expect(extents.place(r) == where_, "seed \(seed) step \(step): location")
            if staging.count < Int(where_) + data.count { staging += [UInt8](repeating: 0, count: Int(where_) + data.count - staging.count) }
            staging.replaceSubrange(Int(where_)..<Int(where_) + data.count, with: data)
            for (i, b) in data.enumerated() { model[at + Int64(i)] = b }
            if gen.int(0..<50) == 0 {
                let size = Int64(gen.int(0..<5000))
                _ = extents.clip(to: size)
                model = model.filter { $0.key < size }
            }
            guard step % 25 == 0 else { continue }
            var stagedTotal: Int64 = 0
            var previousEnd: Int64 = -1
            for e in extents.extents {
                #expect(e.range.lowerBound > previousEnd || (previousEnd == -1 && e.range.lowerBound >= 0), "seed \(seed) step \(step): sorted, disjoint")
                previousEnd = e.range.upperBound - 1
                stagedTotal += e.range.upperBound - e.range.lowerBound
                for p in e.range { #expect(model[p] == staging[Int(e.staged + p - e.range.lowerBound)], "seed \(seed) step \(step): byte \(p)") }
            }
            #expect(stagedTotal == Int64(model.count) && extents.stagedBytes == stagedTotal, "seed \(seed) step \(step): every written byte staged once")
        }
        // Overwrites in place keep staging from growing with rewrites.
        #expect(staging.count < 2000 * 300)
    }
}
