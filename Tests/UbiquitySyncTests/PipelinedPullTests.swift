import Testing
import TestSupport
@testable import UbiquityFS
@testable import UbiquityStore
@testable import UbiquitySync

/// `SyncEngine.apply` takes a group of records in pieces, decoding the next piece while
/// it takes in this one.
@Suite struct PipelinedPullTests {
    @Test func piecesKeepEveryLineInOrderWithItsSource() {
        let parts = (0..<5).map { p in (source: "s\(p)", lines: (0..<(p * 700 + 1)).map { ArraySlice(Array("\(p).\($0)".utf8)) }) }
        let pieces = SyncEngine.pieces(of: parts, lines: 1_024)
        var seen: [String] = []
        for piece in pieces {
            #expect(piece.reduce(0) { $0 + $1.lines.count } <= 1_024)
            for fragment in piece {
                for (n, line) in fragment.lines.enumerated() {
                    #expect(String(decoding: line, as: UTF8.self) == "\(fragment.source.dropFirst()).\(fragment.first + n)")
                    seen.append(String(decoding: line, as: UTF8.self))
                }
            }
        }
        #expect(seen == parts.flatMap { $0.lines.map { String(decoding: $0, as: UTF8.self) } })
        #expect(pieces.dropLast().allSatisfy { $0.reduce(0) { $0 + $1.lines.count } == 1_024 })
    }

    /// Taken in as one, every record's chunk places are stored before any record, so a
    /// record may name a chunk whose place only a later record gives. Regression guard
    /// for the pieces: the first piece's record waits for that place, and the rest must
    /// then be taken in as one, not left waiting for good.
    @Test func aRecordWhosePlaceALaterPieceGivesIsTakenIn() throws {
        let temp = TempDirectory(prefix: "ubiquity-pieces")
        defer { temp.cleanup() }
        let device = try SimDevice(name: "b", root: temp.path, backing: temp.path + "/backing", clock: nowNanos)
        let other = DeviceID(hex: "a1a2a3a4a5a6a7a8")!
        let chunk = ChunkID(hashing: Array(repeating: 7, count: 4_096))
        func record(_ n: Int, chunks: ChunkList = ChunkList()) -> SyncRecord {
            SyncRecord(id: .new(), node: .file(.new()), kind: .file, parents: [], deviceID: other, deviceName: "a",
                       committed: 1, mtime: 1, mode: 0o644, isTombstone: false, isMeta: false, path: "f\(n)", chunks: chunks)
        }
        var withChunk = ChunkList()
        withChunk.append(chunk, size: 4_096)
        let count = SyncEngine.pieceLines + 100
        var records = [record(0, chunks: withChunk)] + (1..<count - 1).map { record($0) }
        var giver = record(count - 1, chunks: withChunk)
        giver.places = [chunk: ChunkPlace(pack: String(repeating: "c", count: 32), offset: 8)]
        records.append(giver)
        let lines = records.map { ArraySlice(Array(RecordCodec.encode($0).utf8.dropLast())) } // without the newline
        let complete = try device.engine.apply([(source: "test", lines: lines)], of: other, generation: 1)
        #expect(complete, "a record whose chunk's place comes later waits for good")
        let held = try device.fs.withMetaLock { (_, store) throws(StoreError) in
            try store.db.rows("SELECT count(*) FROM versions WHERE local = 0", []) { $0.int(0) }
        }
        #expect(held == [Int64(count)])
    }
}
