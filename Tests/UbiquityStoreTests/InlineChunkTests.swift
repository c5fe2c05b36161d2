import Glibc
import Testing
import TestSupport
@testable import UbiquityStore
import UbiquitySystem

/// Store format 14: a chunk of at most `ChunkList.inlineLimit` bytes lives in its list
/// (the version row), not in small.sqlite; lists written before read unchanged.
@Suite struct InlineChunkTests {
    /// A random list of stored chunks, inline chunks and holes.
    static func randomList(_ gen: inout SplitMix64) -> ChunkList {
        var list = ChunkList()
        for _ in 0..<gen.int(0..<12) {
            switch gen.int(0..<3) {
            case 0: list.appendInline(gen.bytes(gen.int(1..<ChunkList.inlineLimit + 1)))
            case 1:
                let bytes = gen.bytes(gen.int(1..<5000))
                list.append(ChunkID(hashing: bytes), size: bytes.count)
            default: list.appendHole(Int64(gen.int(1..<1 << 30)))
            }
        }
        return list
    }

    @Test func listsWithInlineChunksReadBackAsWritten() {
        let seed = UInt64(nowNanos())
        print("InlineChunkTests seed \(seed)")
        var gen = SplitMix64(seed: seed)
        for round in 0..<500 {
            let list = Self.randomList(&gen)
            guard let back = ChunkList(encoded: list.encoded) else {
                Issue.record("seed \(seed) round \(round): did not decode")
                continue
            }
            #expect(back == list && back.inline == list.inline, "seed \(seed) round \(round)")
            for i in 0..<list.count { #expect(back.isInline(i) == list.isInline(i)) }
            #expect(back.chunks.count == (0..<list.count).filter { !list.isHole($0) && !list.isInline($0) }.count)
        }
    }

    /// A list as every format before 14 wrote it (36 bytes per piece) reads the same.
    @Test func aListWrittenBeforeFormat14ReadsUnchanged() {
        let a = Array("a stored tiny chunk".utf8), b = [UInt8](repeating: 7, count: 3000)
        var legacy: [UInt8] = []
        for bytes in [a, b] {
            legacy += ChunkID(hashing: bytes).raw
            withUnsafeBytes(of: UInt32(bytes.count).littleEndian) { legacy += $0 }
        }
        withUnsafeBytes(of: Int64(4096).littleEndian) { legacy += $0 }
        legacy += [UInt8](repeating: 0, count: 28)
        let list = ChunkList(encoded: legacy)
        #expect(list?.count == 3 && list?.totalSize == Int64(a.count + b.count + 4096))
        #expect(list?.inline.isEmpty == true && list?.isHole(2) == true)
        #expect(list?.chunks.map(\.id) == [ChunkID(hashing: a), ChunkID(hashing: b)], "the tiny chunk stays in the store")
        #expect(list?.encoded == legacy)
    }

    @Test func malformedInlineEntriesAreRefused() {
        let flag: UInt32 = 1 << 31
        func entry(_ bytes: [UInt8], field: UInt32) -> [UInt8] {
            var out = bytes
            withUnsafeBytes(of: field.littleEndian) { out += $0 }
            return out
        }
        #expect(ChunkList(encoded: entry([], field: flag)) == nil, "an inline chunk of 0 bytes")
        #expect(ChunkList(encoded: entry([UInt8](repeating: 1, count: 65), field: flag | 65)) == nil, "over the limit")
        #expect(ChunkList(encoded: entry([1, 2], field: flag | 3)) == nil, "longer than what precedes it")
        #expect(ChunkList(encoded: [1, 2, 3] + entry([9, 9], field: flag | 2)) == nil, "a ragged start")
        #expect(ChunkList(encoded: entry([5, 6], field: flag | 2))?.inline.values.first == [5, 6])
        // Review finding: a stored entry naming an inline chunk's id with another size; a
        // reader would have copied 100 bytes out of 10.
        let ten = [UInt8](repeating: 65, count: 10)
        var stored = ChunkID(hashing: ten).raw
        withUnsafeBytes(of: UInt32(100).littleEndian) { stored += $0 }
        #expect(ChunkList(encoded: stored + entry(ten, field: flag | 10)) == nil)
        #expect(ChunkList(encoded: entry(ten, field: flag | 10) + stored) == nil)
    }

    /// Through the write path (FileContent, a chunker that cuts tiny pieces): every piece
    /// of at most 64 bytes is inline, nothing of it reaches small.sqlite, and the content
    /// reads back whole after a reopen from the encoded list.
    @Test(arguments: [1, 2, 3])
    func tinyPiecesStayInTheListThroughWritesAndReopens(seed: UInt64) throws {
        print("tinyPiecesStayInTheListThroughWritesAndReopens seed \(seed)")
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let chunks = try ChunkStore(directory: dir.path + "/chunks")
        let chunker = Chunker(minSize: 16, avgSize: 64, maxSize: 256)
        var gen = SplitMix64(seed: seed)
        var model: [UInt8] = []
        var content = FileContent(base: ChunkList(), chunks: chunks, stagingDirectory: dir.path)
        for step in 0..<60 {
            let offset = gen.int(0..<(model.count + 100))
            let data = gen.bytes(gen.int(1..<400))
            try data.withUnsafeBytes { try content.write(offset: Int64(offset), $0) }
            if model.count < offset + data.count { model += [UInt8](repeating: 0, count: offset + data.count - model.count) }
            model.replaceSubrange(offset..<offset + data.count, with: data)
            var committed = ChunkList()
            try content.commit(chunker: chunker) { committed = $0; return $0 }
            for i in 0..<committed.count where !committed.isHole(i) {
                #expect(committed.isInline(i) == (committed.size(i) <= Int64(ChunkList.inlineLimit)), "seed \(seed) step \(step)")
            }
            let stored = Set(chunks.allChunkIDs())
            #expect(committed.inline.keys.allSatisfy { !stored.contains($0) }, "seed \(seed) step \(step): an inline chunk in the store")
            let reopened = try #require(ChunkList(encoded: committed.encoded))
            content = FileContent(base: reopened, chunks: chunks, stagingDirectory: dir.path)
            #expect(try content.read(offset: 0, count: model.count + 10) == model, "seed \(seed) step \(step)")
        }
    }

    /// A tiny file's version costs no row in small.sqlite; a 65-byte one still does.
    @Test func aTinySaveLeavesTheSmallChunkStoreAlone() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let store = try Store(directory: dir.path, deviceName: "laptop")
        let tiny = try store.create(parent: Store.rootInode, name: "tiny", kind: .file, mode: 0o644, uid: 1, gid: 1)
        let small = try store.create(parent: Store.rootInode, name: "small", kind: .file, mode: 0o644, uid: 1, gid: 1)
        try store.commit(tiny.id, content: try store.chunks.listOfOneChunk(Array("twenty bytes of text".utf8)), path: "tiny", local: false)
        #expect(store.chunks.allChunkIDs().isEmpty)
        try store.commit(small.id, content: try store.chunks.listOfOneChunk([UInt8](repeating: 65, count: 65)), path: "small", local: false)
        #expect(store.chunks.allChunkIDs().count == 1)
        let head = try #require(try store.node(tiny.id)?.inode.head)
        let list = try store.chunkList(row: head)
        #expect(try store.chunks.bytes(of: list, limit: 64) == Array("twenty bytes of text".utf8))
    }
}
