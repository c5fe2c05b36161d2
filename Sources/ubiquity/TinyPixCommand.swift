import ArgumentParser
import TinyPix
import UbiquityDaemon

#if canImport(Glibc)
import Glibc
import UbiquitySystem
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// `ubiquity tinypix`: show, encode and create TinyPix pictures from the shell.
struct TinyPixCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "tinypix",
        abstract: "Show, encode or create 8x8 TinyPix pictures (.tinypix files).",
        discussion: """
            A TinyPix picture is 8x8 one-bit pixels stored in exactly 8 bytes: byte r \
            is row r, top row first, and each row reads as its byte in binary with the \
            high bit on the left. As a grid, '#' is on and '.' is off:

              ..####..   3C
              .#....#.   42
              #.#..#.#   A5
              #......#   81
              #.#..#.#   A5
              #..##..#   99
              .#....#.   42
              ..####..   3C

            When a grid is read, on cells may also be written X, x, 1 or *, and off \
            cells 0, -, _ or a space. CRLF line ends, a missing final newline, \
            whitespace after the 8 cells and blank lines at the end are accepted. \
            Exactly 8 bytes are always taken as a stored picture, as they are.

            Examples:
              ubiquity tinypix --new smile.tinypix       create a picture (a diagonal)
              ubiquity tinypix smile.tinypix             show it as a grid
              ubiquity tinypix --color smile.tinypix     in the container's tint (see --color)
              ubiquity tinypix smile.tinypix > smile.txt
              ubiquity tinypix --encode smile.txt -o smile.tinypix
              ubiquity tinypix --encode - < smile.txt | od -An -tx1
            """)

    @Argument(help: ArgumentHelp(
        "The picture to read: a stored 8-byte picture or a grid ('-' for standard input).",
        valueName: "file"))
    var file: String?

    @Flag(name: .long, help: "Turn a grid (or 8 raw bytes) into the 8 stored bytes.")
    var encode = false

    @Option(name: [.customShort("o"), .customLong("output")], help: ArgumentHelp(
        "With --encode: write the 8 bytes to this file (atomically) instead of standard output.",
        valueName: "out"))
    var output: String?

    @Option(name: .customLong("new"), help: ArgumentHelp(
        "Create a new picture (the diagonal) at this path.", valueName: "name"))
    var newName: String?

    @Flag(name: .long, help: "With --new: replace the file if it already exists.")
    var force = false

    @Flag(name: .long, help: ArgumentHelp(
        "Draw the grid's on cells in the container's tint, as the TinyPix app does: the key-value store's selectedColorIndex (0 red, 1 green, 2 blue, anything else or none red)."))
    var color = false

    @Option(name: .customLong("mount"), help: ArgumentHelp(
        "With --color: the mount whose selectedColorIndex to use. Default: the mount holding the file, else the only one.",
        valueName: "dir"))
    var mount: String?

    func validate() throws {
        if newName != nil {
            if file != nil { throw ValidationError("--new takes no <file> argument.") }
            if encode { throw ValidationError("--new and --encode cannot be used together.") }
            if output != nil { throw ValidationError("--output goes with --encode, not --new.") }
        } else {
            if file == nil { throw ValidationError("Missing <file> (or use --new <name>).") }
            if output != nil && !encode { throw ValidationError("--output is only used with --encode.") }
            if force { throw ValidationError("--force is only used with --new.") }
        }
        if color && (encode || newName != nil) { throw ValidationError("--color goes with showing a picture, not --encode or --new.") }
        if mount != nil && !color { throw ValidationError("--mount is only used with --color.") }
    }

    func run() throws {
        do {
            if let newName {
                try create(newName)
            } else if let file {
                if encode { try encode(file) } else { try show(file) }
            }
        } catch let failure as TinyPixCommandFailure {
            printToStandardError("ubiquity tinypix: \(failure.message)\n")
            throw ExitCode.failure
        }
    }

    // MARK: - Subcommand actions

    /// Prints the grid of a stored picture, or a grid normalized.
    func show(_ path: String) throws {
        let bytes = try readInput(path)
        let stored: [UInt8]
        switch TinyPix.encode(bytes) {
        case .success(let value):
            stored = value
        case .failure(let error):
            throw TinyPixCommandFailure(
                "\(displayName(path)) is neither a stored picture (it has \(bytes.count) bytes, "
                    + "not 8) nor a valid grid: \(error)")
        }
        guard let grid = TinyPix.render(stored) else {
            throw TinyPixCommandFailure("\(displayName(path)): cannot render")  // unreachable: encode gives 8 bytes
        }
        try writeAll(color ? tinted(grid, path) : grid, to: STDOUT_FILENO, name: "standard output")
    }

    /// The grid with its on cells in the tint (ANSI colours). The plain grid (and `cat`
    /// of the file) stays byte for byte what it was.
    private func tinted(_ grid: [UInt8], _ path: String) -> [UInt8] {
        let index = Self.selectedColorIndex(mount: mount, near: path == "-" ? nil : path)
        let code = index == 1 ? "32" : index == 2 ? "34" : "31"
        var out: [UInt8] = []
        for b in grid {
            if b == UInt8(ascii: "#") { out += Array("\u{1B}[\(code)m#\u{1B}[0m".utf8) } else { out.append(b) }
        }
        return out
    }

    /// The key-value store's selectedColorIndex of the mount named, or holding `path`, or
    /// the only one; 0 when there is none or it is not an integer.
    static func selectedColorIndex(mount: String?, near path: String?) -> Int64 {
        let mountpoint: String?
        if let mount {
            mountpoint = Paths.mount(containing: Paths.absolute(mount))?.entry.mountpoint
        } else if let path, let found = Paths.mount(containing: Paths.absolute(path)) {
            mountpoint = found.entry.mountpoint
        } else {
            let all = ubiquityMounts()
            mountpoint = all.count == 1 ? all[0].mountpoint : nil
        }
        guard let mountpoint, let bytes = try? readFile(mountpoint + "/.kv/selectedColorIndex", limit: 64) else { return 0 }
        return Int64(String(decoding: bytes, as: UTF8.self).filter { !$0.isWhitespace }) ?? 0
    }

    /// Writes the 8 stored bytes for a grid (or 8 raw bytes) to --output or stdout.
    func encode(_ path: String) throws {
        let bytes = try readInput(path)
        let stored: [UInt8]
        switch TinyPix.encode(bytes) {
        case .success(let value): stored = value
        case .failure(let error): throw TinyPixCommandFailure("\(displayName(path)): \(error)")
        }
        if let output, output != "-" {
            try writeAtomically(stored, to: output)
        } else {
            try writeAll(stored, to: STDOUT_FILENO, name: "standard output")
        }
    }

    /// Writes the initial diagonal to a new file.
    func create(_ path: String) throws {
        if force {
            try writeAtomically(TinyPix.newPicture, to: path)
            return
        }
        let fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o666)
        guard fd >= 0 else {
            let code = errno
            if code == EEXIST {
                throw TinyPixCommandFailure("\(path) already exists (use --force to replace it)")
            }
            throw TinyPixCommandFailure("cannot create \(path): \(describe(code))")
        }
        do {
            try writeAll(TinyPix.newPicture, to: fd, name: path)
            guard fsync(fd) == 0 else { throw TinyPixCommandFailure("cannot sync \(path): \(describe(errno))") }
        } catch {
            _ = close(fd)
            _ = unlink(path)
            throw error
        }
        guard close(fd) == 0 else {
            let code = errno
            _ = unlink(path)
            throw TinyPixCommandFailure("cannot write \(path): \(describe(code))")
        }
    }
}

// MARK: - POSIX helpers

private struct TinyPixCommandFailure: Error {
    let message: String
    init(_ message: String) { self.message = message }
}

/// More than this is never a picture (a grid with generous whitespace is far smaller).
private let maximumInputSize = 1 << 20

private func displayName(_ path: String) -> String {
    path == "-" ? "standard input" : path
}

private func describe(_ code: Int32) -> String {
    errnoText(code)
}

private func printToStandardError(_ message: String) {
    var bytes = Array(message.utf8)
    bytes.withUnsafeMutableBytes { buffer in
        var offset = 0
        while offset < buffer.count {
            let n = write(STDERR_FILENO, buffer.baseAddress! + offset, buffer.count - offset)
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { return }
            offset += n
        }
    }
}

/// Reads a whole file, or standard input for "-".
private func readInput(_ path: String) throws -> [UInt8] {
    let name = displayName(path)
    let fd: Int32
    if path == "-" {
        fd = STDIN_FILENO
    } else {
        fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw TinyPixCommandFailure("cannot open \(path): \(describe(errno))") }
    }
    defer { if fd != STDIN_FILENO { _ = close(fd) } }

    var info = stat()
    if fstat(fd, &info) == 0 && (info.st_mode & S_IFMT) == S_IFDIR {
        throw TinyPixCommandFailure("\(name) is a directory")
    }

    var bytes = [UInt8]()
    var chunk = [UInt8](repeating: 0, count: 64 * 1024)
    while true {
        let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress!, $0.count) }
        if n < 0 {
            if errno == EINTR { continue }
            throw TinyPixCommandFailure("cannot read \(name): \(describe(errno))")
        }
        if n == 0 { return bytes }
        bytes.append(contentsOf: chunk[0..<n])
        if bytes.count > maximumInputSize {
            throw TinyPixCommandFailure(
                "\(name) is too large to be a TinyPix picture (more than \(maximumInputSize) bytes)")
        }
    }
}

private func writeAll(_ bytes: [UInt8], to fd: Int32, name: String) throws {
    try bytes.withUnsafeBytes { buffer in
        var offset = 0
        while offset < buffer.count {
            let n = write(fd, buffer.baseAddress! + offset, buffer.count - offset)
            if n < 0 {
                if errno == EINTR { continue }
                throw TinyPixCommandFailure("cannot write \(name): \(describe(errno))")
            }
            offset += n
        }
    }
}

/// Replaces `path` with `bytes` all at once: a temporary file in the same
/// directory is written, synced and renamed over it, then the directory is synced.
private func writeAtomically(_ bytes: [UInt8], to path: String) throws {
    let directory: String
    let base: String
    if let slash = path.lastIndex(of: "/") {
        directory = slash == path.startIndex ? "/" : String(path[..<slash])
        base = String(path[path.index(after: slash)...])
    } else {
        directory = "."
        base = path
    }
    guard !base.isEmpty else { throw TinyPixCommandFailure("\(path) is a directory") }

    // Keep the permissions of a file being replaced; new files get 0666 less the umask.
    let mode: mode_t
    var existing = stat()
    if stat(path, &existing) == 0 {
        if (existing.st_mode & S_IFMT) == S_IFDIR { throw TinyPixCommandFailure("\(path) is a directory") }
        mode = existing.st_mode & 0o7777
    } else {
        let mask = umask(0)
        _ = umask(mask)
        mode = 0o666 & ~mask
    }

    var template = Array((directory + "/." + base + ".tmp-XXXXXX").utf8CString)
    let fd = template.withUnsafeMutableBufferPointer { mkstemp($0.baseAddress!) }
    guard fd >= 0 else {
        throw TinyPixCommandFailure(
            "cannot write \(path): cannot create a temporary file in \(directory): \(describe(errno))")
    }
    let temporary = template.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }
    do {
        try writeAll(bytes, to: fd, name: temporary)
        guard fchmod(fd, mode) == 0 else {
            throw TinyPixCommandFailure("cannot set the mode of \(temporary): \(describe(errno))")
        }
        guard fsync(fd) == 0 else { throw TinyPixCommandFailure("cannot sync \(temporary): \(describe(errno))") }
    } catch {
        _ = close(fd)
        _ = unlink(temporary)
        throw error
    }
    guard close(fd) == 0 else {
        let code = errno
        _ = unlink(temporary)
        throw TinyPixCommandFailure("cannot write \(temporary): \(describe(code))")
    }
    guard rename(temporary, path) == 0 else {
        let code = errno
        _ = unlink(temporary)
        throw TinyPixCommandFailure("cannot replace \(path): \(describe(code))")
    }
    let directoryFD = open(directory, O_RDONLY | O_CLOEXEC)
    if directoryFD >= 0 {
        _ = fsync(directoryFD)  // best effort: some filesystems refuse to sync directories
        _ = close(directoryFD)
    }
}
