import Glibc
import Testing
import TestSupport
import UbiquitySystem
@testable import UbiquityStore

/// The in-memory namespace against the kernel, and its operation log against replay:
/// seeded random creates, mkdirs, symlinks, links, unlinks, renames (exchanges, over
/// files and directories, into subtrees) and setattrs are checked by `Namespace.apply`
/// and done on a real directory with the same system calls; both must accept or refuse
/// each one alike (the same errno), and end with the same tree. Every accepted operation
/// is appended to an operation log; at random points the process "dies" and a namespace
/// rebuilt from the log must equal the live one.
///
/// Replay: `UBQ_NAMESPACE_SEED=1234 swift test --filter NamespaceModelTests`.
@Suite struct NamespaceModelTests {
    @Test(arguments: [1, 2, UInt64.random(in: 3...UInt64.max)])
    func namespaceAgreesWithTheKernelAndWithReplay(seed: UInt64) throws {
        let seed = replayableSeed(seed, variable: "UBQ_NAMESPACE_SEED", test: "NamespaceModelTests", filter: "NamespaceModelTests")
        var rng = SplitMix64(seed: seed)
        let temp = TempDirectory(prefix: "ubiquity-namespace")
        defer { temp.cleanup() }
        let disk = temp.path + "/tree"
        try makeDirectory(disk)
        let root = Inode(id: Store.rootInode, kind: .directory, mode: 0o755, uid: 0, gid: 0, time: 0)
        var ns = Namespace(root: root)
        var log: OperationLog? = try OperationLog(directory: temp.path + "/oplog", after: .none, segmentBytes: 4096) { _, _ in }
        var nextInode: UInt64 = 2, clock: Int64 = 0, accepted = 0, refused = 0
        var trace: [String] = []
        let names = ["a", "b", "c", "d"]

        /// The path of a directory on disk, from the namespace's parents.
        func path(ofDirectory inode: InodeNumber) -> String {
            var parts: [String] = [], at = inode
            while at != Store.rootInode, let up = ns.parents[at] {
                parts.append(ns.entries[up]!.first { $0.value == at }!.key)
                at = up
            }
            return ([disk] + parts.reversed()).joined(separator: "/")
        }
        func directories() -> [InodeNumber] { ns.entries.keys.sorted() }
        func anyDirectory() -> InodeNumber { let all = directories(); return all[rng.int(0..<all.count)] }

        for step in 0..<1_500 {
            clock += 1
            let parent = anyDirectory(), name = names[rng.int(0..<names.count)]
            let at = path(ofDirectory: parent) + "/" + name
            let op: NamespaceOperation
            let system: () -> Int32 // 0, or the errno of the system call
            func result(_ rc: Int32) -> Int32 { rc == 0 ? 0 : errno }
            let roll = rng.int(0..<100)
            switch roll {
            case 0..<20:
                let inode = InodeNumber(rawValue: nextInode)
                op = .create(NodeRecord(inode: inode, parent: parent, name: name, kind: .file, mode: 0o644, uid: 0, gid: 0, time: clock))
                // Modes set with chmod afterwards, whatever the umask.
                system = { let fd = open(at, O_CREAT | O_EXCL | O_WRONLY, 0o644); if fd >= 0 { close(fd); return result(chmod(at, 0o644)) }; return errno }
            case 20..<35:
                op = .create(NodeRecord(inode: InodeNumber(rawValue: nextInode), parent: parent, name: name, kind: .directory,
                                        mode: 0o755, uid: 0, gid: 0, time: clock))
                system = { mkdir(at, 0o755) == 0 ? result(chmod(at, 0o755)) : errno }
            case 35..<40:
                op = .create(NodeRecord(inode: InodeNumber(rawValue: nextInode), parent: parent, name: name, kind: .symlink,
                                        mode: 0o777, uid: 0, gid: 0, target: "target-\(step)", time: clock))
                system = { result(symlink("target-\(step)", at)) }
            case 40..<48:
                // A hard link to some name in some directory (a directory too: EPERM).
                let from = anyDirectory(), fromName = names[rng.int(0..<names.count)]
                guard let inode = ns.lookup(from, fromName) else { continue }
                let source = path(ofDirectory: from) + "/" + fromName
                op = .link(inode, parent: parent, name: name, time: clock)
                system = { result(link(source, at)) }
            case 48..<65:
                // unlink for a name the namespace holds as a non-directory, rmdir for a
                // directory (the request layer picks the call; the log has one operation).
                let isDirectory = ns.lookup(parent, name).map { ns.nodes[$0]!.kind == .directory } ?? (rng.int(0..<2) == 0)
                op = .unlink(parent: parent, name: name, time: clock)
                system = { result(isDirectory ? rmdir(at) : unlink(at)) }
            case 65..<92:
                let to = anyDirectory(), toName = names[rng.int(0..<names.count)]
                let target = path(ofDirectory: to) + "/" + toName
                let exchange = rng.int(0..<5) == 0
                op = .rename(from: parent, fromName: name, to: to, toName: toName, exchange: exchange, time: clock)
                system = {
                    if exchange {
                        do throws(SystemError) { try exchangePaths(at, target); return 0 } catch { return error.code }
                    }
                    return result(rename(at, target))
                }
            default:
                guard let inode = ns.lookup(parent, name), ns.nodes[inode]!.kind != .symlink else { continue }
                if rng.int(0..<2) == 0 {
                    // The owner keeps full access, so a test run without root can go on.
                    let mode = UInt32(rng.int(0..<0o1000)) | 0o700
                    op = .setAttributes(inode, AttributeChange(mode: mode, ctime: clock))
                    system = { result(chmod(at, mode_t(mode))) }
                } else {
                    let size = Int64(rng.int(0..<5000))
                    op = .setAttributes(inode, AttributeChange(size: size, mtime: clock, ctime: clock))
                    system = { result(truncate(at, off_t(size))) }
                }
            }
            var refusal: Namespace.Refusal?
            do { try ns.apply(op) } catch { refusal = error }
            let code = system()
            trace.append("\(step) \(op) -> \(refusal.map { "\($0)" } ?? "ok") / errno \(code)")
            #expect(Self.errnoOf(refusal) == code, "step \(step): namespace says \(refusal.map { "\($0)" } ?? "ok"), the kernel \(code) (seed \(seed)); last steps: \(trace.suffix(8))")
            guard refusal == nil else {
                refused += 1
                continue
            }
            accepted += 1
            if case .create = op { nextInode += 1 }
            let payload = op.encoded
            #expect(NamespaceOperation(decoding: payload) == op, "step \(step): the payload decodes to the operation")
            _ = try log!.append(payload)
            if rng.int(0..<40) == 0 {
                // The daemon dies; a namespace built from the log alone equals the live one.
                log = nil
                var rebuilt = Namespace(root: root)
                var replayError: String?
                log = try OperationLog(directory: temp.path + "/oplog", after: .none, segmentBytes: 4096) { sequence, payload in
                    guard let op = NamespaceOperation(decoding: payload) else { replayError = "frame \(sequence) is not an operation"; return }
                    do { try rebuilt.apply(op) } catch { replayError = "frame \(sequence) refused: \(error)" }
                }
                #expect(replayError == nil && rebuilt == ns, "step \(step): replay \(replayError ?? "differs") (seed \(seed))")
            }
        }
        #expect(Self.tree(disk) == Self.tree(ns, Store.rootInode), "the namespace's tree and the disk's (seed \(seed))")
        #expect(accepted > 300 && refused > 100, "the walk exercises both sides: \(accepted) accepted, \(refused) refused")
        print("NamespaceModelTests seed \(seed): \(accepted) operations accepted, \(refused) refused alike")
    }

    @Test func operationsRoundTripAndDamagedPayloadsDecodeToNothingOrOneSpelling() {
        var rng = SplitMix64(seed: 11)
        let samples: [NamespaceOperation] = [
            .create(NodeRecord(inode: InodeNumber(rawValue: 9), parent: Store.rootInode, name: "é \u{10FF90}", kind: .symlink,
                               mode: 0o777, uid: 1000, gid: 1000, rdev: 0, target: "../x", time: -5)),
            .create(NodeRecord(inode: InodeNumber(rawValue: .max), parent: InodeNumber(rawValue: 3), name: "dev", kind: .characterDevice,
                               mode: 0o600, uid: 0, gid: 0, rdev: 0x0103, time: .max)),
            .link(InodeNumber(rawValue: 4), parent: Store.rootInode, name: "again", time: 7),
            .unlink(parent: Store.rootInode, name: "gone", time: 8),
            .rename(from: Store.rootInode, fromName: "a", to: InodeNumber(rawValue: 12), toName: "b", exchange: true, time: 9),
            .setAttributes(InodeNumber(rawValue: 4), AttributeChange(mode: 0o4755, size: 1 << 40, mtime: .min, ctime: 10)),
            .setAttributes(InodeNumber(rawValue: 4), AttributeChange(ctime: 11)),
            .setXattr(InodeNumber(rawValue: 4), name: "user.x", value: [0, 1, 255], time: 12),
            .removeXattr(InodeNumber(rawValue: 4), name: "user.x", time: 13),
        ]
        for op in samples {
            let bytes = op.encoded
            #expect(NamespaceOperation(decoding: bytes) == op)
            #expect(NamespaceOperation(decoding: bytes.dropLast()) == nil, "a payload cut short: \(op)")
            #expect(NamespaceOperation(decoding: bytes + [0]) == nil, "a byte too many: \(op)")
            for _ in 0..<2_000 {
                var damaged = bytes
                for _ in 0..<rng.int(1..<4) { damaged[rng.int(0..<damaged.count)] = UInt8(rng.int(0..<256)) }
                if let decoded = NamespaceOperation(decoding: damaged) {
                    #expect(decoded.encoded == damaged, "one spelling per operation")
                }
            }
        }
        for _ in 0..<5_000 {
            let noise = (0..<rng.int(0..<80)).map { _ in UInt8(rng.int(0..<256)) }
            if let decoded = NamespaceOperation(decoding: noise) { #expect(decoded.encoded == noise) }
        }
        // A length that claims 4 GiB is refused, not allocated.
        #expect(NamespaceOperation(decoding: [3, 1, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]) == nil)
    }

    // MARK: helpers

    /// The errno the kernel gives for a refusal (0: accepted).
    static func errnoOf(_ refusal: Namespace.Refusal?) -> Int32 {
        switch refusal {
        case nil: 0
        case .notFound: ENOENT
        case .exists: EEXIST
        case .notDirectory: ENOTDIR
        case .isDirectory: EISDIR
        case .notEmpty: ENOTEMPTY
        case .notPermitted: EPERM
        case .invalid: EINVAL
        case .noAttribute: ENODATA
        }
    }

    /// Every path below `root` with what the test compares: kind, permission bits,
    /// size of files, link count of files, symlink targets.
    static func tree(_ root: String) -> [String: String] {
        var out: [String: String] = [:]
        func walk(_ dir: String, _ prefix: String) {
            for name in ((try? directoryEntries(dir)) ?? []).sorted() {
                var st = stat()
                let full = dir + "/" + name
                guard lstat(full, &st) == 0 else { continue }
                let path = prefix + name
                switch st.st_mode & S_IFMT {
                case S_IFDIR:
                    out[path] = "dir \(String(st.st_mode & 0o7777, radix: 8))"
                    walk(full, path + "/")
                case S_IFLNK:
                    var buffer = [CChar](repeating: 0, count: 4096)
                    let n = readlink(full, &buffer, buffer.count)
                    out[path] = "link " + String(decoding: buffer[0..<max(n, 0)].map { UInt8(bitPattern: $0) }, as: UTF8.self)
                default:
                    out[path] = "file \(String(st.st_mode & 0o7777, radix: 8)) \(st.st_size) \(st.st_nlink)"
                }
            }
        }
        walk(root, "")
        return out
    }

    static func tree(_ ns: Namespace, _ root: InodeNumber) -> [String: String] {
        var out: [String: String] = [:]
        func walk(_ dir: InodeNumber, _ prefix: String) {
            for (name, inode) in ns.entries[dir] ?? [:] {
                let node = ns.nodes[inode]!, path = prefix + name
                switch node.kind {
                case .directory:
                    out[path] = "dir \(String(node.mode, radix: 8))"
                    walk(inode, path + "/")
                case .symlink: out[path] = "link " + (node.target ?? "")
                default: out[path] = "file \(String(node.mode, radix: 8)) \(node.size) \(node.nlink)"
                }
            }
        }
        walk(root, "")
        return out
    }
}
