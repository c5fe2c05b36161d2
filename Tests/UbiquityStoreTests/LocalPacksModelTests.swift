import Glibc
import Synchronization
import Testing
import TestSupport
import UbiquitySystem
@testable import UbiquityStore

/// Local packs (`LocalPacks`) against a model: random puts (new chunks and chunks already
/// there), reads, claims, gc's sweeps by last use, removals, punches of removed records,
/// syncs, compactions, clean closes and crashes at random points. A crash
/// is a copy of the files as they are, with each pack not flushed since cut at a random
/// length past what the last sync flushed, sometimes with stray bytes after the cut (a
/// power loss that kept part of a write), and a reopen from the copy.
/// - Every chunk reads back verified while open, and none that was removed.
/// - A sweep removes exactly the chunks last put or claimed before its cutoff (a reopen
///   counts as a use of everything there), and holds back the others.
/// - After a crash, every chunk synced and not removed since is there; whatever else is
///   there was put once and reads back verified; nothing else is.
/// - After a compaction of every pack with dead records, a sealed pack holds exactly its
///   header and its live records, on the disk too: no byte is left behind.
@Suite struct LocalPacksModelTests {
    struct Model {
        /// Everything ever put, by id, and the ids in the order they were first put (the
        /// run's random choices go by it: a set's order differs between processes, and a
        /// seed must replay).
        var everPut: [ChunkID: [UInt8]] = [:]
        var order: [ChunkID] = []
        /// In the packs now (not removed).
        var live: Set<ChunkID> = []
        /// Live and flushed by a sync since it was last put: must survive a crash.
        var durable: Set<ChunkID> = []
        /// The last put or claim of each live chunk, on the run's clock.
        var used: [ChunkID: Nanos] = [:]
    }

    @Test(arguments: [1, 2, 3, 4] as [UInt64])
    func agreesWithTheModelAcrossCrashes(seed given: UInt64) throws {
        let seed = replayableSeed(given, variable: "UBQ_PACKS_SEED", test: "agreesWithTheModelAcrossCrashes",
                                  filter: "LocalPacksModelTests")
        var rng = SplitMix64(seed: seed)
        var dir = TempDirectory()
        defer { dir.cleanup() }
        let limit = Int64(2_048 + rng.int(0..<16_384))
        var packs = try LocalPacks(directory: dir.path + "/packs", packLimit: limit, now: 0)
        var model = Model()
        // Each pack's size on the disk at the last sync: a crash keeps at least that much.
        var flushed: [String: Int64] = [:]
        var crashes = 0, compactions = 0, freedTotal: Int64 = 0
        var closes = 0, swept = 0, punches = 0, punched: Int64 = 0
        for round in 0..<1_500 {
            let context = "seed \(seed), round \(round)"
            let clock = Nanos(round + 1)
            switch rng.int(0..<110) {
            case 0..<45:
                // A new chunk, or one already there (a put of it is nothing).
                let bytes: [UInt8]
                if !model.order.isEmpty && rng.int(0..<5) == 0 {
                    bytes = model.everPut[model.order[rng.int(0..<model.order.count)]]!
                } else {
                    bytes = rng.bytes(1 + rng.int(0..<3_000))
                }
                let id = ChunkID(hashing: bytes)
                #expect(try packs.put(id, bytes, now: clock) == !model.live.contains(id), "\(context): put \(id)")
                if model.everPut.updateValue(bytes, forKey: id) == nil { model.order.append(id) }
                model.live.insert(id)
                model.used[id] = clock
            case 45..<58:
                guard !model.order.isEmpty else { continue }
                let id = model.order[rng.int(0..<model.order.count)]
                let read = try packs.read(id)
                #expect(read == (model.live.contains(id) ? model.everPut[id] : nil), "\(context): read \(id)")
            case 58..<65:
                // Reads of runs of neighbours: each live chunk asked for comes in exactly
                // one run, with its bytes; nothing else comes.
                let asked = model.order.filter { _ in rng.int(0..<3) != 0 }
                var got: [ChunkID: [UInt8]] = [:]
                for run in packs.runs(of: asked, maxBytes: 1 + rng.int(0..<20_000), maxRecords: 1 + rng.int(0..<8)) {
                    let records = try packs.read(run)
                    #expect(records.count == run.ids.count, "\(context): a run's records")
                    for (id, bytes) in zip(run.ids, records) {
                        #expect(got.updateValue(bytes, forKey: id) == nil, "\(context): \(id) in two runs")
                    }
                }
                #expect(Set(got.keys) == Set(asked.filter { model.live.contains($0) }), "\(context): the chunks of the runs")
                for (id, bytes) in got { #expect(bytes == model.everPut[id], "\(context): \(id) read in a run") }
            case 65..<75:
                let removed = model.order.filter { model.live.contains($0) && rng.int(0..<3) == 0 }
                packs.remove(removed)
                model.live.subtract(removed)
                model.durable.subtract(removed)
                for id in removed { model.used[id] = nil }
            case 75..<85:
                try packs.sync()
                model.durable = model.live
                flushed = Self.packSizes(dir.path + "/packs")
            case 85..<90:
                freedTotal += try packs.compact(deadShare: rng.int(0..<2) == 0 ? 0 : 0.5)
                compactions += 1
                // The compaction synced: everything live is flushed.
                model.durable = model.live
                flushed = Self.packSizes(dir.path + "/packs")
            case 90..<93:
                // Removed records become holes: never read back, before or after a crash
                // (a punched record an index still named would read as damage).
                punched += try packs.punchRemoved()
                punches += 1
            case 100..<104:
                guard !model.order.isEmpty else { continue }
                let id = model.order[rng.int(0..<model.order.count)]
                #expect(packs.claim(id, now: clock) == model.live.contains(id), "\(context): claim \(id)")
                if model.live.contains(id) { model.used[id] = clock }
            case 104..<107:
                // gc's sweep: a cutoff some rounds back, over some of the chunks ever put.
                let cutoff = clock - Nanos(rng.int(0..<60))
                let asked = model.order.filter { _ in rng.int(0..<2) == 0 }
                var held = GraceHeld()
                let freed = packs.sweep(asked, unusedSince: cutoff, held: &held)
                let expected = Set(asked.filter { model.live.contains($0) && model.used[$0]! < cutoff })
                #expect(Set(freed.keys) == expected, "\(context): swept at cutoff \(cutoff)")
                #expect(held.chunks == asked.filter { model.live.contains($0) && model.used[$0]! >= cutoff }.count, "\(context): held")
                model.live.subtract(expected)
                model.durable.subtract(expected)
                for id in expected { model.used[id] = nil }
                swept += expected.count
            case 107..<110:
                // A clean close: everything flushed and every pack indexed; the reopen
                // finds every live chunk (and maybe removed ones whose pack was indexed
                // before their removal).
                try packs.seal()
                #expect(packs.packs.allSatisfy { $0.sealed }, "\(context): a pack not sealed by the close")
                packs = try LocalPacks(directory: dir.path + "/packs", packLimit: limit, now: clock)
                closes += 1
                var present: Set<ChunkID> = []
                for (id, bytes) in model.everPut where packs.contains(id) {
                    #expect(try packs.read(id) == bytes, "\(context) after a close: chunk \(id)")
                    present.insert(id)
                }
                #expect(model.live.isSubset(of: present), "\(context) after a close: live chunks lost")
                #expect(packs.count == present.count, "\(context) after a close: chunks that were never put")
                model.live = present
                model.durable = present
                model.used = Dictionary(uniqueKeysWithValues: present.map { ($0, clock) })
                flushed = Self.packSizes(dir.path + "/packs")
            default:
                // A crash: the files as they are, packs cut past their flushed length.
                let copy = TempDirectory()
                copyTree(dir.path, to: copy.path)
                for (name, size) in Self.packSizes(copy.path + "/packs").sorted(by: { $0.key < $1.key }) {
                    let kept = flushed[name] ?? 0
                    guard size > kept, rng.int(0..<2) == 0 else { continue }
                    let cut = kept + Int64(rng.int(0..<Int(size - kept + 1)))
                    let path = copy.path + "/packs/" + name
                    #expect(truncate(path, off_t(cut)) == 0)
                    if rng.int(0..<3) == 0 { Self.append(rng.bytes(1 + rng.int(0..<100)), to: path) }
                }
                packs = try LocalPacks(directory: copy.path + "/packs", packLimit: limit, now: clock)
                dir.cleanup()
                dir = copy
                crashes += 1
                for id in model.durable {
                    #expect(try packs.read(id) == model.everPut[id], "\(context) after a crash: durable chunk \(id)")
                }
                var present: Set<ChunkID> = []
                for (id, bytes) in model.everPut where packs.contains(id) {
                    #expect(try packs.read(id) == bytes, "\(context) after a crash: chunk \(id)")
                    present.insert(id)
                }
                #expect(packs.count == present.count, "\(context) after a crash: chunks that were never put")
                // What the crash left is on the disk now, all of it used at the open.
                model.live = present
                model.durable = present
                model.used = Dictionary(uniqueKeysWithValues: present.map { ($0, clock) })
                flushed = Self.packSizes(dir.path + "/packs")
            }
            #expect(packs.count == model.live.count, "\(context): count")
        }
        // No byte left behind: every pack with dead records rewritten, then each sealed
        // pack is its header and its live records, and so is its file.
        // A compaction's copies can fill the pack being written, which it then seals with
        // its own dead records in it: compact until nothing is left to free.
        try packs.sync()
        while case let freed = try packs.compact(deadShare: 0), freed > 0 { freedTotal += freed }
        let onDisk = Self.packSizes(dir.path + "/packs")
        var liveTotal: Int64 = 0
        for pack in packs.packs {
            liveTotal += pack.live
            let name = String(LocalPacks.path("", pack.number, "pack").dropFirst())
            #expect(onDisk[name] == pack.bytes, "seed \(seed): pack \(pack.number) on the disk")
            if pack.sealed {
                #expect(pack.bytes == Int64(LocalPacks.fileHeader.count) + pack.live, "seed \(seed): sealed pack \(pack.number) holds dead bytes")
            }
        }
        let expected = model.live.reduce(Int64(0)) { $0 + Int64(LocalPacks.recordHeaderSize + model.everPut[$1]!.count) }
        #expect(liveTotal == expected, "seed \(seed): live bytes")
        for id in model.live { #expect(try packs.read(id) == model.everPut[id], "seed \(seed) at the end: chunk \(id)") }
        print("LocalPacksModelTests seed \(seed): pack limit \(limit), \(crashes) crashes, \(closes) closes, \(swept) swept, \(punches) punches made \(punched) bytes holes, \(compactions) compactions freed \(freedTotal) bytes, \(packs.packs.count) packs, \(model.live.count) chunks live")
        #expect(crashes > 0 && compactions > 0 && closes > 0 && swept > 0 && punched > 0, "seed \(seed): the run must crash, close, sweep, punch and compact")
    }

    /// A flipped byte in a record's bytes gives `.corruptChunk`, never the wrong bytes. A
    /// pack without an index whose first record's bytes and second record's header are
    /// damaged opens with the third alone: a record that does not hash is not the chunk,
    /// and the scan finds the next header past the damaged one.
    @Test func damageIsRefusedNotServed() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let packs = try LocalPacks(directory: dir.path + "/packs")
        let chunks = [7, 9, 11].map { [UInt8](repeating: $0, count: 1_000) }
        for chunk in chunks { try packs.put(ChunkID(hashing: chunk), chunk) }
        try packs.sync()
        let path = LocalPacks.path(dir.path + "/packs", 1, "pack")
        let header = LocalPacks.fileHeader.count, record = LocalPacks.recordHeaderSize
        Self.flip(path, at: Int64(header + record + 10))
        #expect(throws: StoreError.corruptChunk(ChunkID(hashing: chunks[0]))) { try packs.read(ChunkID(hashing: chunks[0])) }
        #expect(try packs.read(ChunkID(hashing: chunks[1])) == chunks[1])
        Self.flip(path, at: Int64(header + record + 1_000 + 2))
        let reopened = try LocalPacks(directory: dir.path + "/packs")
        #expect(!reopened.contains(ChunkID(hashing: chunks[0])))
        #expect(!reopened.contains(ChunkID(hashing: chunks[1])))
        #expect(try reopened.read(ChunkID(hashing: chunks[2])) == chunks[2])
        // An index whose numbers are hostile (an offset near 2^64), its check right: not
        // an index, so the pack is scanned.
        var index = LocalPacks.indexMagic
        for value in [UInt64(1_000), 1] { index += (0..<8).map { UInt8(truncatingIfNeeded: value >> (8 * $0)) } }
        index += ChunkID(hashing: chunks[2]).raw
        for value in [UInt64.max - 10, 100] { index += (0..<8).map { UInt8(truncatingIfNeeded: value >> (8 * $0)) } }
        let check = fnv1a(index)
        index += (0..<8).map { UInt8(truncatingIfNeeded: check >> (8 * $0)) }
        let fd = open(LocalPacks.path(dir.path + "/packs", 1, "idx"), O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        _ = index.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        close(fd)
        // Names that are no pack of this code's: a directory with a pack's name, an upper-
        // case name. They are left alone.
        mkdir(LocalPacks.path(dir.path + "/packs", 16, "pack"), 0o700)
        let upper = open(dir.path + "/packs/0000000A.pack", O_WRONLY | O_CREAT, 0o600)
        close(upper)
        let hostile = try LocalPacks(directory: dir.path + "/packs")
        #expect(try hostile.read(ChunkID(hashing: chunks[2])) == chunks[2])
        #expect(hostile.packs.map(\.number).sorted() == [1]) // an open begins no pack; a put does
    }

    /// Readers on two threads while puts, removals, syncs, punches and compactions run: a
    /// read gives the chunk's bytes or nothing (removed meanwhile), never other bytes or a
    /// damaged chunk, also while the pack it was in is compacted away or its bytes punched.
    @Test func readersDuringCompactionsSeeTheChunkOrNothing() throws {
        let seed = replayableSeed(UInt64.random(in: 1...1_000_000), variable: "UBQ_PACKS_SEED",
                                  test: "readersDuringCompactionsSeeTheChunkOrNothing", filter: "LocalPacksModelTests")
        var rng = SplitMix64(seed: seed)
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let packs = try LocalPacks(directory: dir.path + "/packs", packLimit: 8_192)
        let chunks = (0..<300).map { _ in rng.bytes(1 + rng.int(0..<2_000)) }
        let stop = Atomic<Bool>(false), wrong = Atomic<Int>(0), reads = Atomic<Int>(0)
        let readers = (0..<2).map { r in
            JoinableThread {
                var local = SplitMix64(seed: seed &+ UInt64(r) &+ 1)
                while !stop.load(ordering: .relaxed) {
                    let chunk = chunks[local.int(0..<chunks.count)]
                    do {
                        if let read = try packs.read(ChunkID(hashing: chunk)), read != chunk { wrong.add(1, ordering: .relaxed) }
                    } catch {
                        wrong.add(1, ordering: .relaxed)
                    }
                    reads.add(1, ordering: .relaxed)
                }
            }
        }
        for round in 0..<200 {
            for chunk in chunks where rng.int(0..<4) == 0 { try packs.put(ChunkID(hashing: chunk), chunk) }
            packs.remove(chunks.filter { _ in rng.int(0..<3) == 0 }.map { ChunkID(hashing: $0) })
            if round % 5 == 0 { try packs.sync() }
            if round % 7 == 0 { try packs.compact(deadShare: 0.3) }
            if round % 3 == 0 { try packs.punchRemoved() }
        }
        stop.store(true, ordering: .relaxed)
        for reader in readers { reader.join() }
        #expect(wrong.load(ordering: .relaxed) == 0, "seed \(seed): wrong or damaged reads")
        #expect(reads.load(ordering: .relaxed) > 0)
    }

    /// Removed records' space comes back at once: `punchRemoved` makes their bytes holes
    /// (the pack's blocks on the disk drop by about their size), the sealed pack's index
    /// no longer names them, and a reopen, from the index or by a scan of the pack
    /// without it, finds every other chunk and none of the punched ones.
    @Test func punchedRecordsFreeTheirBlocksAndStayGone() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let packs = try LocalPacks(directory: dir.path + "/packs")
        var rng = SplitMix64(seed: 45)
        let chunks = (0..<16).map { _ in rng.bytes(64 << 10) }
        for chunk in chunks { try packs.put(ChunkID(hashing: chunk), chunk) }
        try packs.seal()
        let path = LocalPacks.path(dir.path + "/packs", 1, "pack")
        func blocks() -> Int64 {
            var st = stat()
            #expect(stat(path, &st) == 0)
            return Int64(st.st_blocks) * 512
        }
        let before = blocks(), diskBefore = packs.diskBytes
        let removed = chunks.enumerated().filter { $0.offset % 2 == 0 }.map { ChunkID(hashing: $0.element) }
        packs.remove(removed)
        #expect(blocks() == before, "a removal alone frees nothing")
        let punched = try packs.punchRemoved()
        #expect(punched == 8 * (64 << 10))
        // Each record's header stays: a block at each end of a punched range may stay.
        #expect(blocks() <= before - 8 * (64 << 10) + 8 * 8_192, "blocks \(before) -> \(blocks())")
        #expect(packs.diskBytes == diskBefore - punched)
        #expect(try packs.punchRemoved() == 0, "nothing punched twice")
        for (i, chunk) in chunks.enumerated() {
            #expect(try packs.read(ChunkID(hashing: chunk)) == (i % 2 == 0 ? nil : chunk), "chunk \(i)")
        }
        for scan in [false, true] {
            if scan { #expect(unlink(LocalPacks.path(dir.path + "/packs", 1, "idx")) == 0) }
            let reopened = try LocalPacks(directory: dir.path + "/packs")
            for (i, chunk) in chunks.enumerated() {
                let id = ChunkID(hashing: chunk)
                #expect(reopened.contains(id) == (i % 2 == 1), "chunk \(i) after a reopen (scan: \(scan))")
                if i % 2 == 1 { #expect(try reopened.read(id) == chunk) }
            }
        }
    }

    /// Chunks gc removes while a compaction copies their packs stay removed: the copy of
    /// one removed between its check and its write is dead, not back in the index.
    @Test func removalsDuringACompactionStay() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let packs = try LocalPacks(directory: dir.path + "/packs", packLimit: 4_096)
        for round in 0..<20 {
            let chunks = (0..<400).map { i in [UInt8]("round \(round) chunk \(i) ".utf8) + [UInt8](repeating: UInt8(i % 251), count: 200) }
            for chunk in chunks { try packs.put(ChunkID(hashing: chunk), chunk) }
            // Every pack with some dead bytes, so the compaction below copies them all.
            packs.remove(chunks.enumerated().filter { $0.offset % 50 == 0 }.map { ChunkID(hashing: $0.element) })
            try packs.sync()
            let removed = chunks.enumerated().filter { $0.offset % 2 == 1 }.map { ChunkID(hashing: $0.element) }
            let remover = JoinableThread { for id in removed { packs.remove([id]) } }
            try packs.compact(deadShare: 0)
            remover.join()
            for id in removed { #expect(!packs.contains(id), "round \(round): a chunk removed during the compaction is back") }
            #expect(packs.count == (round + 1) * 192, "round \(round): live chunks (400 put, 8 and 200 removed, each round)")
        }
    }

    /// A second process beside the store's owner (`ubiquity fsck --repair` while mounted):
    /// it leaves the owner's pack alone (no index for a pack still being written: the
    /// owner's later records would not be in it), its own pack gets an index at its close,
    /// and the owner takes that pack in when it asks, its copy counting over a damaged one.
    @Test func aSecondWriterLeavesTheOwnersPackAloneAndItsCopiesAreTakenIn() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        var rng = SplitMix64(seed: 5)
        let chunks = (0..<4).map { _ in rng.bytes(5_000) }
        let ids = chunks.map { ChunkID(hashing: $0) }
        let owner = try LocalPacks(directory: dir.path + "/packs")
        try owner.put(ids[0], chunks[0])
        try owner.put(ids[1], chunks[1])
        try owner.sync()
        let (ownerPack, offset, _) = try #require(owner.location(of: ids[1]))
        Self.flip(ownerPack, at: offset + 10)
        do {
            let repairer = try LocalPacks(directory: dir.path + "/packs", othersMayWrite: true)
            try repairer.put(ids[2], chunks[2])
            try repairer.put(ids[1], chunks[1]) // there, as far as it knows: damaged, not a copy
            repairer.remove([ids[1]])
            try repairer.put(ids[1], chunks[1]) // the repair: a good copy
            try repairer.seal()
        }
        #expect(access(String(ownerPack.dropLast(4)) + "idx", F_OK) != 0, "the owner's pack was indexed by another process")
        try owner.put(ids[3], chunks[3]) // after the other's close, in the owner's pack
        #expect(throws: StoreError.corruptChunk(ids[1])) { try owner.read(ids[1]) }
        #expect(try owner.adoptSealedPacks() == 1)
        #expect(try owner.adoptSealedPacks() == 0, "taken in once")
        #expect(try owner.read(ids[1]) == chunks[1])
        #expect(try owner.read(ids[2]) == chunks[2])
        try owner.seal()
        let reopened = try LocalPacks(directory: dir.path + "/packs")
        for (id, chunk) in zip(ids, chunks) { #expect(try reopened.read(id) == chunk) }
    }

    /// An index whose pack was deleted by hand is not taken for the index of a new pack
    /// that gets its number.
    /// A run read past the end of a pack cut short (damage) gives each record what the
    /// file still holds of it: the reader's length check refuses the short ones.
    @Test func aRunPastTheEndOfACutPackComesBackShort() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let packs = try LocalPacks(directory: dir.path + "/packs")
        var gen = SplitMix64(seed: 9)
        let chunks = (0..<3).map { _ in gen.bytes(1_000) }
        for bytes in chunks { try packs.put(ChunkID(hashing: bytes), bytes) }
        let (path, second, _) = packs.location(of: ChunkID(hashing: chunks[1]))!
        #expect(truncate(path, off_t(second + 400)) == 0)
        let runs = packs.runs(of: chunks.map { ChunkID(hashing: $0) })
        #expect(runs.count == 1)
        let records = try packs.read(runs[0])
        #expect(records == [chunks[0], Array(chunks[1][..<400]), []])
    }

    /// Small records start their writeback a batch at a time (one sync_file_range per MiB,
    /// not one per file), and a sync starts the count over.
    @Test func writebackStartsABatchAtATime() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let packs = try LocalPacks(directory: dir.path + "/packs")
        var gen = SplitMix64(seed: 11)
        func put(_ count: Int) throws {
            for _ in 0..<count {
                let bytes = gen.bytes(4_096)
                _ = try bytes.withUnsafeBytes { (raw) throws(StoreError) in try packs.put(ChunkID(hashing: bytes), raw, writeback: true) }
            }
        }
        let record = 4_096 + LocalPacks.recordHeaderSize
        let perBatch = Int((LocalPacks.writebackBatch + Int64(record) - 1) / Int64(record))
        try put(perBatch - 1)
        #expect(packs.writebacksStarted.load(ordering: .relaxed) == 0)
        try put(1)
        #expect(packs.writebacksStarted.load(ordering: .relaxed) == 1)
        try put(3 * perBatch)
        #expect(packs.writebacksStarted.load(ordering: .relaxed) == 4)
        try packs.sync()
        try put(perBatch - 1)
        #expect(packs.writebacksStarted.load(ordering: .relaxed) == 4, "a sync flushed what waited: the batch starts over")
        // A fetched chunk (no writeback of its own) starts what waits before it and is
        // never in a batch: a batch after it starts past it.
        let fetched = gen.bytes(4_096)
        _ = try fetched.withUnsafeBytes { (raw) throws(StoreError) in try packs.put(ChunkID(hashing: fetched), raw, writeback: false) }
        #expect(packs.writebacksStarted.load(ordering: .relaxed) == 5)
        let bytesBefore = packs.writebackBytes.load(ordering: .relaxed)
        try put(perBatch)
        #expect(packs.writebacksStarted.load(ordering: .relaxed) == 6)
        #expect(packs.writebackBytes.load(ordering: .relaxed) - bytesBefore == Int64(perBatch * record),
                "the batch after a fetched chunk took it in")
    }

    @Test func anIndexWithoutItsPackIsNotANewPacksIndex() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        var rng = SplitMix64(seed: 8)
        let old = (0..<3).map { _ in rng.bytes(3_000) }, new = (0..<3).map { _ in rng.bytes(5_000) }
        do {
            let packs = try LocalPacks(directory: dir.path + "/packs")
            for chunk in old { try packs.put(ChunkID(hashing: chunk), chunk) }
            try packs.seal()
        }
        unlink(LocalPacks.path(dir.path + "/packs", 1, "pack")) // the index stays
        do {
            let packs = try LocalPacks(directory: dir.path + "/packs")
            #expect(packs.count == 0)
            for chunk in new { try packs.put(ChunkID(hashing: chunk), chunk) } // pack 1 again
            try packs.sync()
        }
        let reopened = try LocalPacks(directory: dir.path + "/packs")
        for chunk in new { #expect(try reopened.read(ChunkID(hashing: chunk)) == chunk) }
        for chunk in old { #expect(!reopened.contains(ChunkID(hashing: chunk))) }
    }

    static func packSizes(_ directory: String) -> [String: Int64] {
        var sizes: [String: Int64] = [:]
        for name in (try? directoryEntries(directory)) ?? [] where name.hasSuffix(".pack") {
            var st = stat()
            if stat(directory + "/" + name, &st) == 0 { sizes[name] = Int64(st.st_size) }
        }
        return sizes
    }

    static func append(_ bytes: [UInt8], to path: String) {
        let fd = open(path, O_WRONLY | O_APPEND)
        defer { close(fd) }
        _ = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
    }

    static func flip(_ path: String, at offset: Int64) {
        let fd = open(path, O_RDWR)
        defer { close(fd) }
        var byte: UInt8 = 0
        _ = pread(fd, &byte, 1, off_t(offset))
        byte ^= 0xff
        _ = pwrite(fd, &byte, 1, off_t(offset))
    }
}
