// ubiquity-bench-fill: builds a large container quickly for scripts/bench-scale.sh by
// writing through the store API (the same code a mount runs: inodes, entries, versions,
// histories, the synced view), not through FUSE, which at 1M files would take most of
// an hour. Content comes from a pool of 1,000 small texts (the benchmark measures
// metadata, and a pool keeps the chunk directory small).
//
//   ubiquity-bench-fill STORE FILES [HOT_VERSIONS]
//   ubiquity-bench-fill --small STORE FILES VERSIONS
//
// Makes FILES files d<NNNNN>/f<NNNNNNN>.txt, 100 per directory; every fifth file gets 5
// more versions; `hot.txt` gets HOT_VERSIONS versions (default 100,000) and
// `thousand.txt` 1,000. Versions are committed 1 ms apart (each has its own name).
// With --small (scripts/bench-store.sh), every file gets VERSIONS versions of 20 bytes
// of its own (no pool: each version is a chunk of its own, as a user's small files are).
import Glibc
import UbiquityStore
import UbiquitySystem

func fail(_ message: String) -> Never {
    log("ubiquity-bench-fill: \(message)")
    exit(1)
}

var arguments = CommandLine.arguments
let small = arguments.count > 1 && arguments[1] == "--small"
if small { arguments.remove(at: 1) }
guard arguments.count >= 3, let files = Int(arguments[2]), files >= 0 else {
    fail("usage: ubiquity-bench-fill [--small] STORE FILES [HOT_VERSIONS | VERSIONS]")
}
let hotVersions = arguments.count > 3 ? Int(arguments[3]) ?? 100_000 : 100_000
/// 20 bytes that differ for every (file, version).
func smallContent(_ file: Int, _ version: Int) -> [UInt8] {
    Array("f\(String(file).leftPadded(to: 8)) v\(String(version).leftPadded(to: 8))\n".utf8)
}

do throws(StoreError) {
    let store = try Store(directory: arguments[1], deviceName: "bench")
    // With --small every version is in the past when the fill ends (prune by age works
    // at once); otherwise the clock runs ahead, as fast saves make it.
    let start = nowNanos() - (small ? Int64(files) * Int64(hotVersions + 1) * 1_000_000 + 1_000_000_000 : 0)
    let ticks = Locked<Int64>(0)
    // One millisecond per timestamp: every version gets a name of its own.
    store.clock = { ticks.withLock { $0 += 1; return start + $0 * 1_000_000 } }
    store.startBatching()

    var pool: [ChunkList] = []
    for i in 0..<1000 {
        pool.append(try store.chunks.listOfOneChunk(Array("content \(i)\n".utf8)))
    }
    var operations = 0
    func save(_ id: InodeNumber, _ path: String, _ k: Int, content: ChunkList? = nil) throws(StoreError) {
        _ = try store.commit(id, content: content ?? pool[k % pool.count], path: path, local: false)
        operations += 1
        if operations % 10_000 == 0 { try store.commitBatch() }
    }
    func file(_ parent: InodeNumber, _ name: String) throws(StoreError) -> InodeNumber {
        let inode = try store.create(parent: parent, name: name, kind: .file, mode: 0o644, uid: getuid(), gid: getgid())
        return inode.id
    }

    var directory = Store.rootInode
    for i in 0..<files {
        let dirName = "d" + String(i / 100).leftPadded(to: 5)
        if i % 100 == 0 {
            directory = try store.create(parent: Store.rootInode, name: dirName, kind: .directory, mode: 0o755,
                                         uid: getuid(), gid: getgid()).id
        }
        let name = "f" + String(i).leftPadded(to: 7) + ".txt"
        let id = try file(directory, name)
        if small {
            for v in 0..<hotVersions {
                try save(id, dirName + "/" + name, 0, content: try store.chunks.listOfOneChunk(smallContent(i, v)))
            }
        } else {
            let versions = i % 5 == 0 ? 6 : 1
            for v in 0..<versions { try save(id, dirName + "/" + name, i + v) }
        }
        if i % 100_000 == 99_999 { log("ubiquity-bench-fill: \(i + 1) files") }
    }
    for (name, count) in small ? [] : [("hot.txt", hotVersions), ("thousand.txt", 1000)] {
        let id = try file(Store.rootInode, name)
        for v in 0..<count { try save(id, name, v) }
    }
    // The directories' own records, as the first sync step after a mount would make them.
    try store.recordLocalChanges(busy: [])
    try store.commitBatch()
    try store.markDurable()
    // What the mount's maintenance loop does within 10 s: the change set the step above
    // consumed leaves free pages (`FileSystem.compactIfMuchFree`).
    if try store.hasMuchFreeSpace() { while try store.compactDatabaseStep() {} }
} catch {
    fail("\(error)")
}

extension String {
    func leftPadded(to width: Int) -> String { String(repeating: "0", count: max(0, width - count)) + self }
}
