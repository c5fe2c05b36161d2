import Glibc
import Testing
import TestSupport
@testable import UbiquityStore

/// fallocate on open content (issue 22): PUNCH_HOLE and ZERO_RANGE make zeros that commit
/// as holes, reserved ranges count their holes (st_blocks), against a byte model; the
/// reservation file holds what the holes promise through every change and every restart.
@Suite struct FallocateContentTests {
    /// Per byte of a small file: its value, whether it is data (written, not punched) and
    /// whether fallocate reserved it (past the end too).
    struct Model {
        var size = 0
        var bytes: [UInt8] = []
        var data: [Bool] = []
        var reserved = [Bool](repeating: false, count: 1 << 18)
        mutating func grow(_ to: Int) {
            if to > bytes.count { bytes += [UInt8](repeating: 0, count: to - bytes.count); data += [Bool](repeating: false, count: to - data.count) }
            size = max(size, to)
        }
        mutating func write(_ at: Int, _ d: [UInt8]) {
            grow(at + d.count)
            for (i, b) in d.enumerated() { bytes[at + i] = b; data[at + i] = true }
        }
        mutating func truncate(_ n: Int) {
            if n < size { for i in n..<size { bytes[i] = 0; data[i] = false } }
            // Truncating to the size or below frees reserves past the new end (ext4).
            if n <= size { for i in n..<reserved.count { reserved[i] = false } }
            grow(n)
            size = n
        }
        mutating func zero(_ r: Range<Int>, keepSize: Bool, keepAllocated: Bool) {
            for i in r where i < size { bytes[i] = 0; data[i] = false }
            if !keepSize { grow(r.upperBound) }
            for i in r { reserved[i] = keepAllocated }
        }
        var reservedHoles: Int { (0..<reserved.count).filter { reserved[$0] && ($0 >= size || !data[$0]) }.count }
        var dataBytes: Int { (0..<size).filter { data[$0] }.count }
    }

    @Test(arguments: [31, 32, 33, UInt64.random(in: 100...UInt64.max)])
    func punchZeroReserveAgreeWithModel(seed: UInt64) throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let chunks = try ChunkStore(directory: dir.path + "/chunks")
        let chunker = Chunker(minSize: 256, avgSize: 1024, maxSize: 4096)
        var gen = SplitMix64(seed: seed)
        var model = Model()
        let id = InodeNumber(rawValue: 7)
        var reservation = SpaceReservation(directory: dir.path)
        var content = FileContent(base: ChunkList(), chunks: chunks, stagingDirectory: dir.path, reservation: reservation.account(for: id))
        var committed = ChunkList()
        func range() -> Range<Int> {
            let at = gen.int(0..<(1 << 17)), length = gen.int(1..<(1 << 15))
            return at..<at + length
        }
        for step in 0..<150 {
            let context = "seed \(seed) step \(step)"
            switch gen.int(0..<10) {
            case 0..<3:
                let at = gen.int(0..<(1 << 17)), d = gen.bytes(gen.int(1..<8000))
                try d.withUnsafeBytes { try content.write(offset: Int64(at), $0) }
                model.write(at, d)
            case 3:
                let r = range(), keepSize = gen.int(0..<2) == 0
                try reservation.setAside(id, content.addedReserve(in: Int64(r.lowerBound)..<Int64(r.upperBound), zeroing: false))
                try content.reserve(Int64(r.lowerBound)..<Int64(r.upperBound), keepSize: keepSize)
                if !keepSize { model.grow(r.upperBound) }
                for i in r { model.reserved[i] = true }
            case 4:
                let r = range()
                try content.zero(Int64(r.lowerBound)..<Int64(r.upperBound), keepSize: true, keepAllocated: false)
                model.zero(r, keepSize: true, keepAllocated: false)
            case 5:
                let r = range(), keepSize = gen.int(0..<2) == 0
                try reservation.setAside(id, content.addedReserve(in: Int64(r.lowerBound)..<Int64(r.upperBound), zeroing: true))
                try content.zero(Int64(r.lowerBound)..<Int64(r.upperBound), keepSize: keepSize, keepAllocated: true)
                model.zero(r, keepSize: keepSize, keepAllocated: true)
            case 6:
                let n = gen.int(0..<(1 << 17))
                try content.truncate(Int64(n))
                model.truncate(n)
            case 7:
                try content.commit(chunker: chunker, record: { committed = $0; return $0 })
                if committed.count > 0 && !content.isChanged {
                    // Punched and never-written bytes are holes; a cut that begins in data
                    // may take zeros after it along (as for any sparse file).
                    #expect(committed.storedBytes >= Int64(model.dataBytes), "\(context): stored bytes")
                    #expect(committed.totalSize == Int64(model.size), "\(context): committed size")
                    #expect(content.reservedHoleBytes <= Int64(model.reservedHoles), "\(context): reserved holes")
                    #expect(content.reservedHoleBytes >= 0, "\(context): reserved holes never negative")
                    #expect(content.reservedHoleBytes + committed.storedBytes >= Int64(model.reservedHoles + model.dataBytes) - Int64(4096 * committed.count),
                            "\(context): reserved holes and data")
                }
                if gen.int(0..<2) == 0 {
                    // A restart: the promise is counted again from the committed content.
                    let ranges = content.reservation.ranges
                    reservation = SpaceReservation(directory: dir.path)
                    let reopened = FileContent(base: committed, chunks: chunks, stagingDirectory: dir.path, reserved: ranges)
                    try reservation.start(levels: [id: reopened.reservedHoleBytes])
                    content = FileContent(base: committed, chunks: chunks, stagingDirectory: dir.path, reserved: ranges,
                                          reservation: reservation.account(for: id))
                }
            case 8:
                let at = gen.int(0..<(model.size + 10))
                if let hole = content.seek(data: false, from: Int64(at)) {
                    #expect(hole >= at && hole <= model.size, "\(context): SEEK_HOLE")
                    if hole < model.size { #expect(model.bytes[Int(hole)] == 0, "\(context): SEEK_HOLE at a non-zero byte") }
                } else {
                    #expect(at >= model.size, "\(context): SEEK_HOLE ENXIO")
                }
            default:
                let at = gen.int(0..<(model.size + 10)), count = gen.int(0..<20000)
                let want = at < model.size ? Array(model.bytes[at..<min(model.size, at + count)]) : []
                #expect(try content.read(offset: Int64(at), count: count) == want, "\(context): read(\(at), \(count))")
            }
            #expect(content.size == Int64(model.size), "\(context): size")
            // The kept count of reserved holes (updated by each call, not recounted) agrees
            // with a recount, and the reservation file holds it (and at most a slack more
            // that writes drew).
            #expect(content.reservedHoleBytes == content.recountedReserveHoles, "\(context): incremental reserved holes")
            #expect(reservation.level(id) == content.reservedHoleBytes, "\(context): the promise")
            #expect(reservation.bytes == SpaceReservation.need(content.reservedHoleBytes), "\(context): what it holds")
            let held = reservation.heldBytes
            #expect(held >= reservation.bytes && held < reservation.bytes + SpaceReservation.slack, "\(context): held \(held)")
            var st = stat() // no file before the first reservation
            #expect(stat(reservation.path, &st) == 0 ? Int64(st.st_size) == held : held == 0, "\(context): the file's size")
            #expect(Int64(st.st_blocks) * 512 >= held, "\(context): the file's blocks")
        }
    }

    @Test func rangesParseStrictly() {
        #expect(Store.decodeRanges("0-10,20-30") == [0..<10, 20..<30])
        for bad in ["", "5-5", "10-5", "-1-3", "0-10,5-20", "a-b", "0-4611686018427387905", "1-2,", "1-2-3"] {
            #expect(Store.decodeRanges(bad) == nil, "\(bad)")
        }
    }

    /// The reserves are read once and kept in memory with every write; a row that does not
    /// parse reads as none and still goes with its file.
    @Test func reservesAreKeptInMemoryAndADamagedRowStillGoes() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let store = try Store(directory: dir.path, deviceName: "reserves")
        let a = InodeNumber(rawValue: 1000), b = InodeNumber(rawValue: 1001)
        try store.db.statement("INSERT INTO reserves(inode, ranges) VALUES(?, 'not ranges')", [.inode(b)])
        try store.setReservedRanges(a, [0..<4096])
        #expect(try store.reservedRanges(a) == [0..<4096] && store.reservedRanges(b) == [])
        let before = store.db.statements
        #expect(try store.reservedRanges(a) == [0..<4096] && store.reservedRanges(InodeNumber(rawValue: 7)) == [])
        #expect(store.db.statements == before, "reads after the first run no statement")
        try store.dropReservedRanges(b)
        try store.setReservedRanges(a, [])
        let rows = try store.db.rows("SELECT count(*) FROM reserves", []) { $0.int(0) }
        #expect(rows == [0], "rows left: \(rows)")
        store.forgetCachedTree()
        #expect(try store.reservedRanges(a) == [])
    }

    @Test func byteRangesMergeAndSplit() {
        var r = ByteRanges()
        r.insert(10..<20); r.insert(30..<40); r.insert(20..<30)
        #expect(r.ranges == [10..<40])
        r.remove(15..<25)
        #expect(r.ranges == [10..<15, 25..<40])
        #expect(r.gaps(in: 0..<50) == [0..<10, 15..<25, 40..<50])
        r.clip(to: 30)
        #expect(r.ranges == [10..<15, 25..<30])
        #expect(r.nextStart(atOrAfter: 16) == 25 && r.range(containing: 12) == 10..<15)
    }
}
