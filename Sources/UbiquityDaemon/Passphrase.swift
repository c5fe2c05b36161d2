import Glibc
import UbiquitySystem

/// Where an encrypted container's passphrase comes from, never from argv:
/// `--password-file` (a file, a FIFO or `/dev/fd/N`), `--password-command` (its standard
/// output, as restic's), systemd's credentials (`LoadCredential=ubiquity-passphrase:…` or
/// `LoadCredentialEncrypted=`, read from `$CREDENTIALS_DIRECTORY`), or a prompt on the
/// terminal, in that order. A passphrase is the first line of what a source gives.
public struct PassphraseSource: Sendable {
    public var file: String?
    public var command: String?
    /// The name of the systemd credential.
    public static let credentialName = "ubiquity-passphrase"
    /// Longer passphrases are refused (a file named by mistake, a command that never stops).
    public static let maxLength = 4096

    public init(file: String? = nil, command: String? = nil) {
        self.file = file
        self.command = command
    }

    /// What a user can give, for messages.
    public static let choices = "--password-file FILE, --password-command CMD, a systemd credential named \(credentialName), or a terminal to type it on"

    /// The passphrase; `confirm`: a new one, typed twice on a terminal.
    public func read(purpose: String, confirm: Bool = false) throws -> Passphrase {
        let raw: [UInt8]
        if let file {
            raw = try Self.readStream(path: file, what: "--password-file \(file)")
        } else if let command {
            raw = try Self.run(command)
        } else if let directory = Paths.env("CREDENTIALS_DIRECTORY"), !directory.isEmpty,
                  access(directory + "/" + Self.credentialName, R_OK) == 0 {
            raw = try Self.readStream(path: directory + "/" + Self.credentialName, what: "the credential \(Self.credentialName)")
        } else if let tty = Terminal.open() {
            defer { tty.close() }
            let first = try tty.prompt("\(purpose): ")
            if confirm {
                let again = try tty.prompt("Again, to be sure: ")
                guard first == again else { throw DaemonError.passphrase("the two passphrases differ: nothing was changed") }
            }
            raw = first
        } else {
            throw NoPassphrase()
        }
        var bytes = Array(raw.prefix { $0 != UInt8(ascii: "\n") })
        if bytes.last == UInt8(ascii: "\r") { bytes.removeLast() }
        guard !bytes.isEmpty else { throw DaemonError.passphrase("\(purpose): an empty passphrase") }
        return Passphrase(bytes: bytes)
    }

    /// Reads to the end (a FIFO has no size), at most `maxLength` bytes.
    static func readStream(path: String, what: String) throws -> [UInt8] {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw DaemonError.system(what, errno: errno) }
        defer { close(fd) }
        return try readToEnd(fd, what: what)
    }

    static func readToEnd(_ fd: Int32, what: String) throws -> [UInt8] {
        var out: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 1024)
        while true {
            let n = Glibc.read(fd, &buffer, buffer.count)
            if n < 0 && errno == EINTR { continue }
            guard n >= 0 else { throw DaemonError.system(what, errno: errno) }
            if n == 0 { return out }
            out += buffer[0..<n]
            guard out.count <= maxLength else { throw DaemonError.passphrase("\(what): more than \(maxLength) bytes: not a passphrase") }
        }
    }

    /// `sh -c command`, its standard output (its input and errors are the user's: a
    /// command may ask on the terminal itself).
    static func run(_ command: String) throws -> [UInt8] {
        var fds: [Int32] = [0, 0]
        guard pipe(&fds) == 0 else { throw DaemonError.system("pipe", errno: errno) }
        _ = fcntl(fds[0], F_SETFD, FD_CLOEXEC)
        _ = fcntl(fds[1], F_SETFD, FD_CLOEXEC) // dup2 into 1 clears it there
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        posix_spawn_file_actions_adddup2(&actions, fds[1], 1)
        let words: [String] = ["/bin/sh", "-c", command]
        var args: [UnsafeMutablePointer<CChar>?] = words.map { strdup($0) } + [nil]
        var pid: pid_t = 0
        let rc = posix_spawn(&pid, "/bin/sh", &actions, nil, &args, environ)
        args.forEach { free($0) }
        posix_spawn_file_actions_destroy(&actions)
        close(fds[1])
        defer { close(fds[0]) }
        guard rc == 0 else { throw DaemonError.system("--password-command: cannot start /bin/sh", errno: rc) }
        let output = Result { try readToEnd(fds[0], what: "--password-command") }
        if case .failure = output { kill(pid, SIGTERM) }
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
        let bytes = try output.get()
        guard status == 0 else { throw DaemonError.passphrase("--password-command exited with status \((status >> 8) & 0xff)") }
        return bytes
    }
}

/// No source gave a passphrase (no option, no credential, no terminal).
public struct NoPassphrase: Error, CustomStringConvertible {
    public var description: String { "no passphrase: give \(PassphraseSource.choices)" }
}

/// A passphrase in memory; it never prints.
public struct Passphrase: Sendable, CustomStringConvertible {
    public let bytes: [UInt8]
    public var description: String { "Passphrase(…)" }
}

/// The controlling terminal, for a prompt without echo.
struct Terminal {
    let fd: Int32

    static func open() -> Terminal? {
        if isatty(0) == 1 { return Terminal(fd: dup(0)) }
        let fd = Glibc.open("/dev/tty", O_RDWR | O_CLOEXEC | O_NOCTTY)
        return fd >= 0 ? Terminal(fd: fd) : nil
    }

    func close() { _ = Glibc.close(fd) }

    /// Asks on standard error, reads one line with echo off, restores the terminal.
    func prompt(_ text: String) throws -> [UInt8] {
        _ = text.withCString { write(2, $0, strlen($0)) }
        var saved = termios()
        let haveTerm = tcgetattr(fd, &saved) == 0
        if haveTerm {
            var quiet = saved
            quiet.c_lflag &= ~tcflag_t(ECHO)
            quiet.c_lflag |= tcflag_t(ECHONL)
            _ = tcsetattr(fd, TCSAFLUSH, &quiet)
        }
        defer { if haveTerm { _ = tcsetattr(fd, TCSAFLUSH, &saved) } }
        var line: [UInt8] = []
        var byte: UInt8 = 0
        while true {
            let n = Glibc.read(fd, &byte, 1)
            if n < 0 && errno == EINTR { continue }
            if n <= 0 || byte == UInt8(ascii: "\n") { break }
            line.append(byte)
            guard line.count <= PassphraseSource.maxLength else { throw DaemonError.passphrase("more than \(PassphraseSource.maxLength) bytes: not a passphrase") }
        }
        return line
    }
}
