import Glibc
import Testing
import TestSupport
@testable import UbiquityStore

/// A file written in order from its start is cut and stored as it is written
/// (`SequentialStream`), with the cuts a commit of staged bytes would make.
@Suite struct SequentialStreamTests {
    static func write(_ content: FileContent, _ bytes: [UInt8], at offset: Int, pieces: Int) throws {
        var at = 0
        while at < bytes.count {
            let end = min(bytes.count, at + pieces)
            try bytes[at..<end].withUnsafeBytes { try content.write(offset: Int64(offset + at), $0) }
            at = end
        }
    }

    @Test func chunksAreStoredWhileWritingWithTheCommitsCuts() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let chunks = try ChunkStore(directory: dir.path + "/chunks")
        var gen = SplitMix64(seed: 11)
        let data = gen.bytes(3 << 20)
        let streamed = FileContent(base: ChunkList(), chunks: chunks, stagingDirectory: dir.path)
        try Self.write(streamed, data, at: 0, pieces: 128 << 10)
        // Before any commit, the first chunks are in the store already.
        let firstCut = data.withUnsafeBytes { Chunker.standard.cut(UnsafeRawBufferPointer(rebasing: $0[0..<Chunker.standard.maxSize])) }
        #expect(chunks.size(of: ChunkID(hashing: Array(data[0..<firstCut]))) == firstCut)
        var viaStream = ChunkList()
        try streamed.commit { viaStream = $0; return $0 }
        // The same bytes written backwards (never a stream) commit to the same chunks.
        let other = TempDirectory()
        defer { other.cleanup() }
        let staged = FileContent(base: ChunkList(), chunks: try ChunkStore(directory: other.path + "/chunks"), stagingDirectory: other.path)
        for start in stride(from: data.count - (64 << 10), through: 0, by: -(64 << 10)) {
            try data[start..<start + (64 << 10)].withUnsafeBytes { try staged.write(offset: Int64(start), $0) }
        }
        var viaStaging = ChunkList()
        try staged.commit { viaStaging = $0; return $0 }
        #expect(viaStream == viaStaging)
        #expect(try streamed.read(offset: 0, count: data.count) == data)
    }

    /// A preallocated file (fallocate, or a sparse size, then written from its start:
    /// fio's default, `dd conv=notrunc`) streams as a new file does (issue 26): its first
    /// chunks are in the store before any commit, the unwritten rest commits as one hole,
    /// and the chunks are those a staged commit of the same bytes makes. Reads, SEEK_DATA
    /// and SEEK_HOLE see the bytes and the hole at every step; then an overwrite elsewhere
    /// ends the stream and the content stays right.
    @Test(arguments: ["fallocate", "sparse", "committed hole", "overwrite after"])
    func aPreallocatedFileWrittenFromItsStartStreams(_ how: String) throws {
        print("SequentialStreamTests.aPreallocatedFile \(how) seed 13")
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let chunks = try ChunkStore(directory: dir.path + "/chunks")
        var gen = SplitMix64(seed: 13)
        let size = 5 << 20
        let data = gen.bytes(3 << 20)
        let content = FileContent(base: ChunkList(), chunks: chunks, stagingDirectory: dir.path)
        switch how {
        case "sparse": try content.truncate(Int64(size))
        case "committed hole":
            try content.reserve(0..<Int64(size), keepSize: false)
            try content.commit { $0 }
        default: try content.reserve(0..<Int64(size), keepSize: false)
        }
        try Self.write(content, data, at: 0, pieces: 256 << 10)
        let firstCut = data.withUnsafeBytes { Chunker.standard.cut(UnsafeRawBufferPointer(rebasing: $0[0..<Chunker.standard.maxSize])) }
        #expect(chunks.size(of: ChunkID(hashing: Array(data[0..<firstCut]))) == firstCut, "not streamed")
        #expect(content.size == Int64(size))
        #expect(content.seek(data: true, from: 0) == 0 && content.seek(data: false, from: 0) == Int64(data.count))
        #expect(content.seek(data: true, from: Int64(data.count)) == nil && content.seek(data: false, from: Int64(data.count) + 5) == Int64(data.count) + 5)
        var model = data + [UInt8](repeating: 0, count: size - data.count)
        if how == "overwrite after" {
            let patch = gen.bytes(70_000)
            try patch.withUnsafeBytes { try content.write(offset: 1_000_000, $0) }
            model.replaceSubrange(1_000_000..<1_070_000, with: patch)
        }
        var committed = ChunkList()
        try content.commit { committed = $0; return $0 }
        #expect(committed.totalSize == Int64(size))
        #expect(committed.isHole(committed.count - 1) && committed.offsets[committed.count - 1] == Int64(data.count))
        #expect(try content.read(offset: 0, count: size) == model)
        // The same bytes staged (written backwards, never a stream) commit to the same list.
        let other = TempDirectory()
        defer { other.cleanup() }
        let staged = FileContent(base: ChunkList(), chunks: try ChunkStore(directory: other.path + "/chunks"), stagingDirectory: other.path)
        try staged.truncate(Int64(size))
        for start in stride(from: data.count - (64 << 10), through: 0, by: -(64 << 10)) {
            try model[start..<start + (64 << 10)].withUnsafeBytes { try staged.write(offset: Int64(start), $0) }
        }
        var viaStaging = ChunkList()
        try staged.commit { viaStaging = $0; return $0 }
        #expect(try staged.read(offset: 0, count: size) == model)
        if how != "overwrite after" { #expect(committed == viaStaging) }
    }

    /// Anything but an append ends the stream; the content stays what was written.
    @Test(arguments: ["read", "overwrite", "truncate", "discard"])
    func otherOperationsEndTheStream(_ operation: String) throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let chunks = try ChunkStore(directory: dir.path + "/chunks")
        var gen = SplitMix64(seed: 12)
        let old = gen.bytes(100_000), data = gen.bytes(2 << 20), more = gen.bytes(300_000)
        let content = FileContent(base: ChunkList(), chunks: chunks, stagingDirectory: dir.path)
        try Self.write(content, old, at: 0, pieces: 50_000)
        try content.commit { $0 }
        try content.truncate(0) // `> file`: the committed bytes are gone, a stream may start
        try Self.write(content, data, at: 0, pieces: 100_000)
        var model = data
        switch operation {
        case "read":
            #expect(try content.read(offset: 1_000_000, count: 10) == Array(data[1_000_000..<1_000_010]))
        case "overwrite":
            try [UInt8](repeating: 9, count: 10).withUnsafeBytes { try content.write(offset: 500_000, $0) }
            model.replaceSubrange(500_000..<500_010, with: [UInt8](repeating: 9, count: 10))
        case "truncate":
            try content.truncate(1_500_000)
            model.removeLast(model.count - 1_500_000)
        default:
            content.discardChanges()
            #expect(try content.read(offset: 0, count: 1 << 20) == old)
            return
        }
        // Appending goes on after the stream ended, through the staging overlay.
        try Self.write(content, more, at: model.count, pieces: 100_000)
        model += more
        #expect(try content.read(offset: 0, count: model.count) == model)
        var list = ChunkList()
        try content.commit { list = $0; return $0 }
        let reopened = FileContent(base: list, chunks: chunks, stagingDirectory: dir.path)
        #expect(try reopened.read(offset: 0, count: model.count + 1) == model)
    }
}
