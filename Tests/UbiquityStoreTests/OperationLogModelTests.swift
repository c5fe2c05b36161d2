import Glibc
import Testing
import TestSupport
import UbiquitySystem
@testable import UbiquityStore

/// The operation log and its fold against a model, before the log carries user data:
/// random operations on a small key-value namespace are appended, applied in memory and
/// to the model; at random points a folder applies a prefix of them to a real SQLite
/// index (data and fold mark in one transaction), the log is synced or drops folded
/// segments, and the process "dies":
///
/// - kill -9: memory is gone, the log files stay as written, sometimes with a frame torn
///   halfway (the crash came inside a write). Reopened, index + replay must equal the
///   model after every acknowledged operation.
/// - power loss: what was not synced may be lost, a prefix of each segment's unsynced
///   bytes at a time, and a segment made or deleted since the last sync may or may not be
///   there. Reopened, the state must equal the model after some prefix of the operations
///   that is at least everything synced (and the numbering goes on right after it).
///
/// Replay: `UBQ_OPLOG_SEED=1234 swift test --filter OperationLogModelTests`.
@Suite struct OperationLogModelTests {
    @Test(arguments: [1, 2, 3, UInt64.random(in: 4...UInt64.max)])
    func logAndFoldEqualTheModelAcrossCrashes(seed: UInt64) throws {
        let seed = replayableSeed(seed, variable: "UBQ_OPLOG_SEED", test: "OperationLogModelTests", filter: "OperationLogModelTests")
        var rng = SplitMix64(seed: seed)
        let temp = TempDirectory(prefix: "ubiquity-oplog")
        defer { temp.cleanup() }
        var engine: Engine? = try Engine(directory: temp.path)
        var model: [String: String] = [:]
        // The model after each sequence (power loss may keep any prefix from the last sync on).
        var history: [UInt64: [String: String]] = [0: [:]]
        var disk = DiskImage(directory: temp.path + "/oplog") // the files as of the last sync
        var trace: [String] = []
        var crashes = 0
        func reopen() throws -> Engine {
            do { return try Engine(directory: temp.path) } catch {
                Issue.record("reopening failed: \(error) (seed \(seed)); last steps: \(trace.suffix(16))")
                throw error
            }
        }
        func expect(_ state: [String: String], _ what: String) {
            #expect(state == model, "\(what) (seed \(seed)); last steps: \(trace.suffix(12))")
        }
        for step in 0..<600 {
            let e = engine!
            let roll = rng.int(0..<100)
            switch roll {
            case 0..<70:
                let op = Op.random(&rng)
                let sequence = try e.perform(op)
                op.apply(&model)
                history[sequence.value] = model
                trace.append("\(step) \(op) -> \(sequence)")
            case 70..<78:
                let count = rng.int(0..<e.unfolded.count + 1)
                try e.fold(count)
                trace.append("\(step) fold \(count) -> mark \(e.mark)")
            case 78..<84:
                let through = try e.log.sync()
                disk = DiskImage(directory: temp.path + "/oplog")
                trace.append("\(step) sync through \(through)")
            case 84..<88:
                e.log.dropFolded(through: e.mark)
                trace.append("\(step) drop folded through \(e.mark): segments \(e.log.segmentStarts)")
            case 88..<94:
                // kill -9, perhaps inside a write.
                let torn = rng.int(0..<2) == 0 ? e.tornFrame(&rng) : nil
                engine = nil
                if let torn { try appendRaw(torn, toLastSegmentIn: temp.path + "/oplog") }
                engine = try reopen()
                crashes += 1
                trace.append("\(step) kill -9\(torn.map { " inside a write (\($0.count) bytes)" } ?? "")")
                expect(engine!.memory, "state after kill -9 and replay")
                #expect(engine!.log.nextSequence.value == (history.keys.max() ?? 0) + 1, "numbering after kill -9 (seed \(seed))")
            default:
                // Power loss: the unsynced part of the log is partly gone.
                let synced = e.log.syncedThrough
                engine = nil
                try disk.losePower(keepingSomeOf: temp.path + "/oplog", &rng)
                engine = try reopen()
                crashes += 1
                let kept = engine!.log.nextSequence.value - 1
                trace.append("\(step) power loss (synced through \(synced)): kept through \(kept)")
                #expect(kept >= synced.value, "power loss lost synced frames: kept through \(kept), synced through \(synced) (seed \(seed))")
                guard let then = history[kept] else {
                    Issue.record("after power loss the log ends at \(kept), past every operation (seed \(seed))")
                    return
                }
                model = then
                history = history.filter { $0.key <= kept }
                expect(engine!.memory, "state after power loss and replay")
                disk = DiskImage(directory: temp.path + "/oplog")
            }
        }
        expect(engine!.memory, "state at the end")
        try engine!.fold(engine!.unfolded.count)
        #expect(try engine!.indexContents() == model, "the index after folding everything (seed \(seed))")
        print("OperationLogModelTests seed \(seed): 600 steps, \(crashes) crashes, \(history.count - 1) operations")
    }

    @Test func damagedSegmentsEndTheLogWithoutHarm() throws {
        var rng = SplitMix64(seed: 7)
        for trial in 0..<200 {
            let temp = TempDirectory(prefix: "ubiquity-oplog-damage")
            defer { temp.cleanup() }
            let directory = temp.path + "/oplog"
            var replayed: [UInt64] = []
            do {
                let log = try OperationLog(directory: directory, after: .none, segmentBytes: 4096) { _, _ in }
                for i in 0..<rng.int(1..<40) { _ = try log.append(Array("operation \(i) ".utf8) + [UInt8](repeating: 7, count: rng.int(0..<500))) }
            }
            // Damage: a flipped byte, a length that claims 4 GiB, or garbage appended.
            let segments = try OperationLog.segmentFiles(directory)
            let victim = segments[rng.int(0..<segments.count)].path
            var bytes = try readFile(victim, limit: 1 << 30) ?? []
            switch rng.int(0..<3) {
            case 0 where !bytes.isEmpty: bytes[rng.int(0..<bytes.count)] ^= UInt8(rng.int(1..<256))
            case 1 where bytes.count >= 4: bytes.replaceSubrange(0..<4, with: [0xff, 0xff, 0xff, 0xff])
            default: bytes += (0..<rng.int(1..<64)).map { _ in UInt8(rng.int(0..<256)) }
            }
            try writeFileAtomically(victim, bytes, tempPrefix: ".damage")
            let log = try OperationLog(directory: directory, after: .none, segmentBytes: 4096) { sequence, _ in replayed.append(sequence.value) }
            #expect(replayed == Array(1..<UInt64(replayed.count + 1)), "trial \(trial): replay is a gapless prefix")
            #expect(log.nextSequence.value == UInt64(replayed.count + 1), "trial \(trial)")
            // New frames follow the last whole one and survive another open.
            _ = try log.append(Array("after the damage".utf8))
            var again: [UInt64] = []
            _ = try OperationLog(directory: directory, after: .none, segmentBytes: 4096) { sequence, _ in again.append(sequence.value) }
            #expect(again == Array(1...UInt64(replayed.count + 1)), "trial \(trial): the frame appended after recovery is kept")
        }
    }

    @Test func framesAfterAMissingSegmentAreSetAsideNotReplayed() throws {
        let temp = TempDirectory(prefix: "ubiquity-oplog-gap")
        defer { temp.cleanup() }
        let directory = temp.path + "/oplog"
        do {
            let log = try OperationLog(directory: directory, after: .none, segmentBytes: 4096) { _, _ in }
            for _ in 0..<100 { _ = try log.append([UInt8](repeating: 1, count: 400)) }
            log.dropFolded(through: LogSequence(60))
            #expect(log.segmentStarts.first!.value > 1)
        }
        // Folded through 60: the frames after it are all there.
        var replayed: [UInt64] = []
        _ = try OperationLog(directory: directory, after: LogSequence(60)) { sequence, _ in replayed.append(sequence.value) }
        #expect(replayed == Array(61...100))
        // An index folded only through 5 finds no segment holding frame 6: the log ends
        // there (what a power loss before any sync leaves), the later segments are set
        // aside, unread and kept, and numbering goes on at 6.
        replayed = []
        let log = try OperationLog(directory: directory, after: LogSequence(5)) { sequence, _ in replayed.append(sequence.value) }
        #expect(replayed.isEmpty)
        #expect(log.nextSequence == LogSequence(6))
        let names = try directoryEntries(directory)
        #expect(!names.isEmpty && names.allSatisfy { $0.contains(".seg.dropped-") }, "\(names)")
        #expect(try log.append([1]) == LogSequence(6))
    }

    /// Format 19: segments of formats 15 to 18 (`.log`, SHA-256 checks) are read, a torn
    /// tail cut off, and never appended to; new frames go to `.seg` segments (CRC-32C),
    /// and a reopen, a kill -9 with a torn frame, and the folding of the old frames all
    /// keep the one gapless log. Replay: `UBQ_OPLOG_SEED=N ... --filter OperationLogModelTests`.
    @Test(arguments: [1, 2, UInt64.random(in: 3...UInt64.max)])
    func segmentsOfTheOlderFormatAreReadAndNeverAppendedTo(seed: UInt64) throws {
        let seed = replayableSeed(seed, variable: "UBQ_OPLOG_SEED", test: "OperationLogModelTests", filter: "OperationLogModelTests")
        var rng = SplitMix64(seed: seed)
        for trial in 0..<40 {
            let temp = TempDirectory(prefix: "ubiquity-oplog-legacy")
            defer { temp.cleanup() }
            let directory = temp.path + "/oplog"
            try makeDirectories(directory, mode: 0o700)
            // What a format-18 program left: frames 1...old in segments of a few frames each.
            let old = rng.int(1..<30)
            var payloads: [[UInt8]] = (0..<old).map { i in Array("old \(i) ".utf8) + [UInt8](repeating: 5, count: rng.int(0..<300)) }
            var first = 1
            while first <= old {
                let last = min(old, first + rng.int(0..<8))
                var bytes: [UInt8] = []
                for sequence in first...last {
                    var frame = OperationLog.encode(payloads[sequence - 1], kind: .sha256)
                    OperationLog.stamp(&frame, LogSequence(UInt64(sequence)))
                    bytes += frame
                }
                try writeFileAtomically(OperationLog.segmentPath(directory, LogSequence(UInt64(first)), kind: .sha256), bytes, tempPrefix: ".t")
                first = last + 1
            }
            let torn = rng.int(0..<2) == 0
            if torn {
                var frame = OperationLog.encode(Array("torn".utf8), kind: .sha256)
                OperationLog.stamp(&frame, LogSequence(UInt64(old + 1)))
                try appendRaw(Array(frame.prefix(rng.int(1..<frame.count))), toLastSegmentIn: directory)
            }
            let legacy = try OperationLog.segmentFiles(directory).map(\.path)
            let sizes = Dictionary(uniqueKeysWithValues: legacy.map { ($0, fileSize($0)) })
            let mark = rng.int(0..<old + 1)
            let context = "seed \(seed) trial \(trial): \(old) old frames, folded through \(mark), torn \(torn)"

            var replayed: [[UInt8]] = []
            var log: OperationLog? = try OperationLog(directory: directory, after: LogSequence(UInt64(mark)), segmentBytes: 4096) { _, p in replayed.append(Array(p)) }
            #expect(replayed == Array(payloads[mark...]), "\(context): the old frames after the mark replay")
            let added = rng.int(1..<20)
            for i in 0..<added {
                let payload = Array("new \(i) ".utf8) + [UInt8](repeating: 9, count: rng.int(0..<600))
                #expect(try log!.append(payload) == LogSequence(UInt64(old + i + 1)), "\(context)")
                payloads.append(payload)
            }
            let segments = try OperationLog.segmentFiles(directory)
            #expect(segments.filter { $0.kind == .sha256 }.allSatisfy { legacy.contains($0.path) }, "\(context)")
            #expect(segments.contains { $0.kind == .crc32c && $0.first == LogSequence(UInt64(old + 1)) },
                    "\(context): the first new frame begins a .seg segment: \(segments.map(\.path))")
            for path in legacy where segments.contains(where: { $0.path == path }) {
                #expect(fileSize(path) <= sizes[path]!, "\(context): \(path) was appended to")
            }
            // kill -9, perhaps inside the next append: the log reopens to every whole frame.
            let tornAgain = rng.int(0..<2) == 0
            if tornAgain {
                var frame = OperationLog.encode(Array("cut".utf8))
                OperationLog.stamp(&frame, log!.nextSequence)
                try appendRaw(Array(frame.prefix(rng.int(1..<frame.count))), toLastSegmentIn: directory)
            }
            log = nil
            replayed = []
            log = try OperationLog(directory: directory, after: LogSequence(UInt64(mark)), segmentBytes: 4096) { _, p in replayed.append(Array(p)) }
            #expect(replayed == Array(payloads[mark...]), "\(context), torn again \(tornAgain): old and new frames replay in order")
            // Everything folded: the old segments go, the log goes on.
            try log!.sync()
            log!.dropFolded(through: LogSequence(UInt64(payloads.count)))
            #expect(legacy.allSatisfy { access($0, F_OK) != 0 }, "\(context): the .log segments are gone once folded")
            #expect(try log!.append([7]) == LogSequence(UInt64(payloads.count + 1)), "\(context)")
        }
    }
}

// MARK: the model namespace

/// An operation on a small key-value namespace: enough to tell a lost, repeated or
/// reordered frame from a right one (rename and remove depend on what came before).
private enum Op: CustomStringConvertible {
    case set(String, String)
    case remove(String)
    case rename(String, String)

    static let keys = ["a", "b", "c", "d/e", "f", "g", "h"]

    static func random(_ rng: inout SplitMix64) -> Op {
        let key = keys[rng.int(0..<keys.count)]
        switch rng.int(0..<10) {
        case 0..<6:
            let size = rng.int(0..<10) == 0 ? rng.int(1_000..<6_000) : rng.int(0..<40)
            return .set(key, String((0..<size).map { _ in Character(Unicode.Scalar(UInt8(rng.int(97..<123)))) }))
        case 6..<8: return .remove(key)
        default: return .rename(key, keys[rng.int(0..<keys.count)])
        }
    }

    func apply(_ state: inout [String: String]) {
        switch self {
        case .set(let key, let value): state[key] = value
        case .remove(let key): state[key] = nil
        case .rename(let from, let to):
            guard from != to, let value = state[from] else { return }
            state[to] = value
            state[from] = nil
        }
    }

    var encoded: [UInt8] {
        func field(_ text: String) -> [UInt8] { let b = Array(text.utf8); return [UInt8(b.count & 0xff), UInt8(b.count >> 8)] + b }
        switch self {
        case .set(let key, let value): return [1] + field(key) + field(value)
        case .remove(let key): return [2] + field(key)
        case .rename(let from, let to): return [3] + field(from) + field(to)
        }
    }

    init?(_ bytes: ArraySlice<UInt8>) {
        var at = bytes.startIndex
        func field() -> String? {
            guard bytes.endIndex - at >= 2 else { return nil }
            let n = Int(bytes[at]) | Int(bytes[at + 1]) << 8
            at += 2
            guard bytes.endIndex - at >= n else { return nil }
            defer { at += n }
            return String(decoding: bytes[at..<at + n], as: UTF8.self)
        }
        guard let kind = bytes.first else { return nil }
        at += 1
        switch kind {
        case 1: guard let k = field(), let v = field() else { return nil }; self = .set(k, v)
        case 2: guard let k = field() else { return nil }; self = .remove(k)
        case 3: guard let a = field(), let b = field() else { return nil }; self = .rename(a, b)
        default: return nil
        }
        guard at == bytes.endIndex else { return nil }
    }

    var description: String {
        switch self {
        case .set(let k, let v): "set \(k) (\(v.count) bytes)"
        case .remove(let k): "remove \(k)"
        case .rename(let a, let b): "rename \(a) \(b)"
        }
    }
}

/// Memory plus the log, folded into a SQLite index: the shape of the namespace engine.
private final class Engine {
    let index: SQLiteDatabase
    let log: OperationLog
    var memory: [String: String]
    /// Appended, not folded yet, in order.
    var unfolded: [(LogSequence, Op)]
    private(set) var mark: LogSequence

    init(directory: String) throws {
        index = try SQLiteDatabase(path: directory + "/index.sqlite")
        // Every fold is on the disk when its transaction commits: the log may then drop it.
        try index.execute("PRAGMA synchronous=FULL")
        try index.execute("CREATE TABLE IF NOT EXISTS kv(key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        try index.execute("CREATE TABLE IF NOT EXISTS mark(one INTEGER PRIMARY KEY, sequence INTEGER NOT NULL)")
        let mark = LogSequence(UInt64(try index.rows("SELECT sequence FROM mark WHERE one = 1") { $0.int(0) }.first ?? 0))
        var memory = Dictionary(uniqueKeysWithValues: try index.rows("SELECT key, value FROM kv") { ($0.text(0), $0.text(1)) })
        var unfolded: [(LogSequence, Op)] = []
        log = try OperationLog(directory: directory + "/oplog", after: mark, segmentBytes: 4096) { sequence, payload throws(StoreError) in
            guard let op = Op(payload) else { throw .database("frame \(sequence) is not an operation") }
            op.apply(&memory)
            unfolded.append((sequence, op))
        }
        self.mark = mark
        self.memory = memory
        self.unfolded = unfolded
    }

    func perform(_ op: Op) throws -> LogSequence {
        let sequence = try log.append(op.encoded)
        op.apply(&memory)
        unfolded.append((sequence, op))
        return sequence
    }

    /// Applies the first `count` unfolded operations to the index, with the new mark, in
    /// one transaction.
    func fold(_ count: Int) throws {
        guard count > 0 else { return }
        let batch = unfolded.prefix(count)
        try index.transaction { () throws(StoreError) in
            for (_, op) in batch {
                switch op {
                case .set(let key, let value):
                    try index.query("INSERT OR REPLACE INTO kv(key, value) VALUES(?, ?)", [.text(key), .text(value)])
                case .remove(let key):
                    try index.query("DELETE FROM kv WHERE key = ?", [.text(key)])
                case .rename(let from, let to):
                    guard from != to, let value = try index.rows("SELECT value FROM kv WHERE key = ?", [.text(from)], { $0.text(0) }).first ?? nil else { continue }
                    try index.query("INSERT OR REPLACE INTO kv(key, value) VALUES(?, ?)", [.text(to), .text(value)])
                    try index.query("DELETE FROM kv WHERE key = ?", [.text(from)])
                }
            }
            try index.query("INSERT OR REPLACE INTO mark(one, sequence) VALUES(1, ?)", [.int(Int64(batch.last!.0.value))])
        }
        mark = batch.last!.0
        unfolded.removeFirst(count)
    }

    func indexContents() throws -> [String: String] {
        Dictionary(uniqueKeysWithValues: try index.rows("SELECT key, value FROM kv") { ($0.text(0), $0.text(1)) })
    }

    /// The bytes of a frame the next append would write, cut somewhere inside.
    func tornFrame(_ rng: inout SplitMix64) -> [UInt8] {
        var frame = OperationLog.encode(Op.random(&rng).encoded)
        OperationLog.stamp(&frame, log.nextSequence)
        return Array(frame.prefix(rng.int(1..<frame.count)))
    }
}

private func fileSize(_ path: String) -> Int64 {
    var st = stat()
    return stat(path, &st) == 0 ? Int64(st.st_size) : -1
}

private func appendRaw(_ bytes: [UInt8], toLastSegmentIn directory: String) throws {
    guard let last = try OperationLog.segmentFiles(directory).last else { return }
    let fd = open(last.path, O_WRONLY | O_APPEND)
    guard fd >= 0 else { return }
    defer { close(fd) }
    try writeAll(fd, bytes, path: last.path)
}

/// The log directory's files as of a sync: what a power loss cannot take.
private struct DiskImage {
    var files: [String: [UInt8]] = [:]

    init(directory: String) {
        for name in (try? directoryEntries(directory)) ?? [] {
            files[name] = (try? readFile(directory + "/" + name, limit: 1 << 30)) ?? nil
        }
    }

    /// Puts the directory back as a power loss could leave it: each file synced keeps its
    /// synced bytes and a random prefix of those written since; a file made since the sync
    /// keeps a random prefix or is gone; a file deleted since may come back.
    func losePower(keepingSomeOf directory: String, _ rng: inout SplitMix64) throws {
        var now: [String: [UInt8]] = [:]
        for name in (try? directoryEntries(directory)) ?? [] { now[name] = (try? readFile(directory + "/" + name, limit: 1 << 30)) ?? nil }
        for name in Set(now.keys).union(files.keys) {
            let path = directory + "/" + name
            switch (files[name], now[name]) {
            case let (synced?, current?) where current.count >= synced.count && current.starts(with: synced):
                let kept = synced.count + rng.int(0..<current.count - synced.count + 1)
                try writeFileAtomically(path, Array(current.prefix(kept)), tempPrefix: ".power")
            case let (nil, current?):
                if rng.int(0..<3) == 0 { unlink(path) } else {
                    try writeFileAtomically(path, Array(current.prefix(rng.int(0..<current.count + 1))), tempPrefix: ".power")
                }
            case let (synced?, nil):
                if rng.int(0..<2) == 0 { try writeFileAtomically(path, synced, tempPrefix: ".power") }
            default:
                // Changed in place other than by appending: the log never does that.
                Issue.record("\(name) was rewritten, not appended to")
            }
        }
    }
}
