import ArgumentParser
import Glibc
import UbiquityDaemon
import UbiquityStore
import UbiquitySystem

/// `ubiquity kv`: the container's key-value store from the shell, through the mount's
/// `.kv/` directory (one file per key; the type in `user.ubiquity.kv.type`), so the
/// command and the files always show the same state.
struct KeyValueCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "kv",
        abstract: "Read and change the container's synced key-value store.",
        discussion: """
        Small shared settings that sync on their own, as an app's iCloud key-value store \
        (TinyPix keeps its tint, selectedColorIndex, there). Values are property-list \
        values: string, integer, double, bool, data, date (ISO 8601), array and \
        dictionary (JSON). Each key keeps the last write made anywhere. Limits (by \
        default): 1,024 keys, 1 MiB in all, 1 MiB per value, keys of up to 64 bytes.

        The same store is the directory .kv/ in the mount: `ls ~/Cloud/.kv`, \
        `cat ~/Cloud/.kv/KEY`, `echo 2 > ~/Cloud/.kv/KEY`, `rm ~/Cloud/.kv/KEY`.

        Exit status: 0 done; 1 no such key; 2 the value or key was refused (its type, \
        or a limit: the message says which and the current use); 3 no mount or another \
        failure.

          ubiquity kv set selectedColorIndex 2 --type integer
          ubiquity kv get selectedColorIndex
          ubiquity kv get missing --type integer     # prints 0: a missing integer is 0
          ubiquity kv list --json
          ubiquity kv rm selectedColorIndex
          ubiquity kv watch                          # other devices' changes as they arrive
        """,
        subcommands: [KVGet.self, KVSet.self, KVRemove.self, KVList.self, KVWatch.self])
}

/// Where a mount's key-value store is, and the failures every subcommand reports alike.
struct KVMount: ParsableArguments {
    @Option(name: .customLong("mount"), help: ArgumentHelp("The mount (or a path inside it). Default: the only ubiquity mount.",
                                                           valueName: "dir"))
    var mount: String?

    @Flag(name: .long, help: "Print JSON (one object per key) for scripts.")
    var json = false

    static let noSuchKey: Int32 = 1
    static let refused: Int32 = 2
    static let otherFailure: Int32 = 3

    func directory(_ command: String) throws -> String {
        try mountpoint(command) + "/.kv"
    }

    func mountpoint(_ command: String) throws -> String {
        let mounts = ubiquityMounts()
        if mount == nil && mounts.count > 1 {
            throw Self.failure(command, "\(mounts.count) ubiquity mounts; name one, e.g. `ubiquity \(command) --mount \(mounts[0].mountpoint)`. "
                + "Mounted:\n" + mounts.map { "  \($0.mountpoint)" }.joined(separator: "\n"), code: Self.otherFailure)
        }
        do {
            let (entry, _) = try selectMount(mount, command: command)
            return entry.mountpoint
        } catch {
            throw ExitCode(Self.otherFailure)
        }
    }

    /// Prints `ubiquity COMMAND: message` and returns the exit status for `code`.
    static func failure(_ command: String, _ message: String, code: Int32) -> ExitCode {
        _ = fail(command, message)
        return ExitCode(code)
    }

    /// A failed system call on a key file, as the user's message and exit status.
    static func failure(_ command: String, key: String, dir: String, _ code: Int32) -> ExitCode {
        switch code {
        case ENOENT: return failure(command, "no such key: \(key)", code: noSuchKey)
        case EDQUOT:
            return failure(command, "refused: the store is full (\(limitsText(dir))): \(key) not set", code: refused)
        case EFBIG:
            return failure(command, "refused: the value is over the limit per value (\(limitsText(dir)))", code: refused)
        case ENAMETOOLONG:
            return failure(command, "refused: the key is over the limit of \(limit("key", dir) ?? "64") bytes", code: refused)
        case EINVAL:
            return failure(command, "refused: \(key) is not a valid key, or the value is not of its type (the old value stays)",
                           code: refused)
        default: return failure(command, "\(key): \(errnoText(code))", code: otherFailure)
        }
    }

    static func limit(_ name: String, _ dir: String) -> String? {
        let text = (try? readXattr(dir, "user.ubiquity.kv.limits")) ?? ""
        return text.split(separator: " ").first { $0.hasPrefix(name + "=") }.map { String($0.dropFirst(name.count + 1)) }
    }

    /// "3 of 1024 keys, 120 of 1048576 bytes used, at most 1048576 bytes per value".
    static func limitsText(_ dir: String) -> String {
        let usage = ((try? readXattr(dir, "user.ubiquity.kv.usage")) ?? "").split(separator: " ")
        func used(_ name: String) -> String {
            usage.first { $0.hasPrefix(name + "=") }.map { String($0.dropFirst(name.count + 1)) } ?? "?"
        }
        return "\(used("keys")) of \(limit("keys", dir) ?? "?") keys, \(used("bytes")) of \(limit("bytes", dir) ?? "?") bytes used, "
            + "at most \(limit("value", dir) ?? "?") bytes per value"
    }
}

/// One key as read from its file.
struct KVItem {
    let key: String
    let type: KVType
    let content: [UInt8]
    let device: String
    let time: String

    static func read(_ dir: String, _ key: String) throws(SystemError) -> KVItem? {
        let path = dir + "/" + key
        guard let content = try readFile(path, limit: 64 << 20) else { return nil }
        let typeName = try readXattr(path, "user.ubiquity.kv.type")
        return KVItem(key: key, type: KVType(name: typeName) ?? .string, content: content,
                      device: (try? readXattr(path, "user.ubiquity.kv.device")) ?? "",
                      time: (try? readXattr(path, "user.ubiquity.kv.time")) ?? "")
    }

    var value: PropertyList { KeyValues.propertyList(content, as: type) ?? .data(content) }

    var json: KVJSON { KVJSON(key: key, type: type.name, value: AnyPropertyList(value), device: device, time: time) }
}

/// One key in `--json` output: `{"device":...,"key":...,"time":...,"type":...,"value":...}`
/// (`kv get --type` leaves out device and time). The value as a property list in JSON
/// (AnyPropertyList: data and dates as `{"$data":...}` / `{"$date":...}`).
struct KVJSON: Encodable {
    var key: String
    var type: String
    var value: AnyPropertyList
    var device: String?
    var time: String?
}

struct KVGet: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "get",
        abstract: "Print a key's value (as stored; exit status 1 if there is none).",
        discussion: "With --type integer (or double, bool), the value read as that type: a missing key prints 0 (false).")

    @Argument(help: "The key.") var key: String
    @Option(name: .long, help: ArgumentHelp("Read the value as this type: integer, double or bool.", valueName: "type"))
    var type: String?
    @OptionGroup var mount: KVMount

    func run() throws {
        let dir = try mount.directory("kv get")
        let item: KVItem?
        do { item = try KVItem.read(dir, key) } catch {
            throw KVMount.failure("kv get", key: key, dir: dir, error.code)
        }
        if let type {
            guard let wanted = KVType(name: type), [.integer, .double, .bool].contains(wanted) else {
                throw ValidationError("--type takes integer, double or bool")
            }
            // NSUbiquitousKeyValueStore's longLong(forKey:) and friends: a missing key is 0.
            let value: PropertyList
            switch (wanted, item?.value) {
            case (.integer, .integer(let i)?): value = .integer(i)
            case (.integer, .double(let d)?) where d.isFinite && abs(d) < 9.2e18: value = .integer(Int64(d))
            case (.double, .double(let d)?): value = .double(d)
            case (.double, .integer(let i)?): value = .double(Double(i))
            case (.bool, .bool(let b)?): value = .bool(b)
            case (.bool, .integer(let i)?): value = .bool(i != 0)
            case (_, nil): value = wanted == .integer ? .integer(0) : wanted == .double ? .double(0) : .bool(false)
            case (_, let other?):
                throw KVMount.failure("kv get", "\(key) is a \(item?.type.name ?? "?"), not a number: \(other.json)",
                                      code: KVMount.refused)
            }
            if mount.json {
                try printJSON(KVJSON(key: key, type: wanted.name, value: AnyPropertyList(value)))
            } else {
                print(value.json)
            }
            return
        }
        guard let item else { throw KVMount.failure("kv get", "no such key: \(key)", code: KVMount.noSuchKey) }
        if mount.json {
            try printJSON(item.json)
        } else {
            try? writeAll(STDOUT_FILENO, item.content, path: "standard output")
        }
    }
}

struct KVSet: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "set",
        abstract: "Set a key (VALUE '-' reads standard input).",
        discussion: """
        The value is checked against its type before anything changes: `kv set n abc \
        --type integer` fails (exit status 2) and n keeps its old value. Without --type \
        a key keeps its type, and a new key is a string.
          ubiquity kv set name "Ada"
          ubiquity kv set count 3 --type integer
          ubiquity kv set tags '["a","b"]' --type array
          ubiquity kv set when 2026-11-24T08:00:00Z --type date
          ubiquity kv set icon - --type data < icon.png
        """)

    @Argument(help: "The key (at most 64 bytes of UTF-8, no '/').") var key: String
    @Argument(help: "The value as text, or '-' for standard input.") var value: String
    @Option(name: .long, help: ArgumentHelp("string, integer, double, bool, data, date, array or dictionary.", valueName: "type"))
    var type: String?
    @OptionGroup var mount: KVMount

    func validate() throws {
        if let type, KVType(name: type) == nil {
            throw ValidationError("unknown type \(type): string, integer, double, bool, data, date, array or dictionary")
        }
    }

    func run() throws {
        let dir = try mount.directory("kv set")
        var bytes = Array(value.utf8)
        if value == "-" {
            bytes = []
            var buffer = [UInt8](repeating: 0, count: 65536)
            while true {
                let n = buffer.withUnsafeMutableBytes { read(STDIN_FILENO, $0.baseAddress, $0.count) }
                if n < 0 && errno == EINTR { continue }
                guard n > 0 else { break }
                bytes += buffer[0..<n]
                if bytes.count > 64 << 20 { throw KVMount.failure("kv set", "standard input is over 64 MiB", code: KVMount.refused) }
            }
        }
        let path = dir + "/" + key
        let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
        guard fd >= 0 else { throw KVMount.failure("kv set", key: key, dir: dir, errno) }
        var failed: Int32 = 0
        if let type {
            do { try setXattr(fd: fd, "user.ubiquity.kv.type", Array(type.utf8)) } catch { failed = error.code }
        }
        if failed == 0 {
            do { try writeAll(fd, bytes, path: path) } catch { failed = error.code }
        }
        // The value is checked and applied at close: close() says whether it was taken.
        if close(fd) != 0 && failed == 0 { failed = errno }
        if failed != 0 { throw KVMount.failure("kv set", key: key, dir: dir, failed) }
    }
}

struct KVRemove: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "rm", abstract: "Delete a key (exit status 1 if there is none).")

    @Argument(help: "The key.") var key: String
    @OptionGroup var mount: KVMount

    func run() throws {
        let dir = try mount.directory("kv rm")
        if unlink(dir + "/" + key) != 0 { throw KVMount.failure("kv rm", key: key, dir: dir, errno) }
    }
}

struct KVList: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "list",
        abstract: "List the keys with their types and values.",
        discussion: "One line per key: KEY, TYPE and the value (JSON; long ones shortened). --json: one object per line.")

    @OptionGroup var mount: KVMount

    func run() throws {
        let dir = try mount.directory("kv list")
        let keys: [String]
        do { keys = try directoryEntries(dir).sorted { $0.utf8.lexicographicallyPrecedes($1.utf8) } } catch {
            throw KVMount.failure("kv list", "\(error)", code: KVMount.otherFailure)
        }
        for key in keys {
            // A key deleted between the listing and the read is skipped.
            guard let item = try? KVItem.read(dir, key) else { continue }
            if mount.json {
                try printJSON(item.json)
            } else {
                var text = item.value.json
                if text.count > 60 { text = String(text.prefix(57)) + "..." }
                print("\(key)\t\(item.type.name)\t\(text)")
            }
        }
    }
}

struct KVWatch: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "watch",
        abstract: "Print other devices' changes to the store as they arrive (until interrupted).",
        discussion: """
        One line per change another device made: KEY: OLD -> NEW (DEVICE). Changes made \
        on this device are not announced (as with iCloud's key-value store). With --json, \
        a first line {"event":"watching"} once the watch is live, then one object per \
        change (keys in sorted order): {"deleted":false,"device":...,"event":"changed", \
        "key":...,"name":...,"new":...,"old":...,"time":...,"type":...}; "old" is left out \
        for a new key and "new" for a deleted one. \
        A line {"event":"overflow"} means changes came faster than they were read and \
        some were skipped: read the store again with `ubiquity kv list`.
        """)

    @OptionGroup var mount: KVMount

    func run() throws {
        let mp = try mount.mountpoint("kv watch")
        let client: ControlConnection
        do { client = try connectToDaemon(mountpoint: mp, request: .watchKeyValues) } catch {
            throw KVMount.failure("kv watch", "\(error)", code: KVMount.otherFailure)
        }
        defer { client.close() }
        var failure: String?
        try client.lines { line, reply in
            switch reply {
            case .error(let message)?:
                failure = message
                return false
            case .watching?:
                // Scripts learn that the watch is live (changes from now on are reported).
                if mount.json { emitLine(line) } else { printNote("watching \(mp)/.kv for other devices' changes (^C ends)") }
                return true
            default:
                // --json: the daemon's lines as they are (JSONLines already).
                emitLine(mount.json ? line : reply.flatMap(Self.describe) ?? line)
                return true
            }
        }
        if let failure { throw KVMount.failure("kv watch", failure, code: KVMount.otherFailure) }
    }

    /// "KEY: OLD -> NEW (DEVICE NAME)" for a change; nil for a reply a watch does not send
    /// (its line is shown as it is).
    static func describe(_ reply: ControlReply) -> String? {
        switch reply {
        case .overflow: return "(some changes were skipped: run `ubiquity kv list`)"
        case .keyValueChanged(let change):
            func text(_ value: AnyPropertyList?) -> String {
                switch value?.value {
                case .string(let s)?: s
                case let other?: other.json
                case nil: "(none)"
                }
            }
            let device = change.name.isEmpty ? change.device.hex : change.name
            return "\(change.key): \(text(change.old)) -> \(change.deleted ? "(deleted)" : text(change.new)) (\(device))"
        default: return nil
        }
    }
}

/// A note for a person on standard error (not part of the output a script reads).
func printNote(_ text: String) {
    try? writeAll(STDERR_FILENO, Array((text + "\n").utf8), path: "standard error")
}
