import Glibc

/// SplitMix64: a small, fast, seedable generator, so every random test can print its seed
/// and replay it. The one generator all test targets use.
public struct SplitMix64: RandomNumberGenerator {
    private var state: UInt64
    public init(seed: UInt64) { state = seed }

    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    /// `count` deterministic bytes.
    public mutating func bytes(_ count: Int) -> [UInt8] {
        var out = [UInt8]()
        out.reserveCapacity(count + 8)
        while out.count < count { withUnsafeBytes(of: next()) { out += $0 } }
        return Array(out.prefix(count))
    }

    /// A number in `range` (not empty).
    public mutating func int(_ range: Range<Int>) -> Int { range.lowerBound + Int(next() % UInt64(range.count)) }
}

/// The value of environment variable `name`, if set and not empty.
public func environment(_ name: String) -> String? {
    guard let value = getenv(name) else { return nil }
    let text = String(cString: value)
    return text.isEmpty ? nil : text
}

/// The seed a random test runs with: environment variable `variable` when set (to replay a
/// failure), else `seed`; printed with the command that replays it.
public func replayableSeed(_ seed: UInt64, variable: String, test: String, filter: String) -> UInt64 {
    let chosen = environment(variable).flatMap(UInt64.init) ?? seed
    print("\(test) seed \(chosen) (replay: \(variable)=\(chosen) swift test --filter \(filter))")
    return chosen
}

/// A fresh temporary directory, removed by `cleanup()` (or when a test drops it).
public struct TempDirectory: Sendable {
    public let path: String

    public init(prefix: String = "ubiquity-unit") {
        var template = Array("/tmp/\(prefix)-XXXXXX".utf8CString)
        path = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
    }

    public func cleanup() { removeTree(path) }
}

/// rm -rf: removes `path` and everything below it, without following symlinks.
public func removeTree(_ path: String) {
    var st = stat()
    guard lstat(path, &st) == 0 else { return }
    if st.st_mode & S_IFMT == S_IFDIR {
        chmod(path, 0o700) // a read-only directory (chunk files are 0444, directories not)
        if let dir = opendir(path) {
            var names: [String] = []
            while let entry = readdir(dir) {
                let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
                if name != "." && name != ".." { names.append(name) }
            }
            closedir(dir)
            for name in names { removeTree(path + "/" + name) }
        }
        rmdir(path)
    } else {
        unlink(path)
    }
}

/// cp -r of regular files and directories, skipping names that end in `-shm` (what a
/// process killed at this moment leaves on disk; SQLite rebuilds its shared index).
public func copyTree(_ from: String, to: String) {
    var st = stat()
    guard lstat(from, &st) == 0 else { return }
    if st.st_mode & S_IFMT == S_IFDIR {
        mkdir(to, 0o755)
        guard let dir = opendir(from) else { return }
        var names: [String] = []
        while let entry = readdir(dir) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            if name != "." && name != ".." && !name.hasSuffix("-shm") { names.append(name) }
        }
        closedir(dir)
        for name in names { copyTree(from + "/" + name, to: to + "/" + name) }
    } else if st.st_mode & S_IFMT == S_IFREG {
        let input = open(from, O_RDONLY), output = open(to, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        defer { close(input); close(output) }
        var buffer = [UInt8](repeating: 0, count: 1 << 16)
        while true {
            let n = read(input, &buffer, buffer.count)
            if n <= 0 { break }
            _ = write(output, buffer, n)
        }
    }
}
