import Glibc
import UbiquitySystem
import UbiquityStore

/// Tells whoever started us that the mount is live: the background parent (through a
/// pipe) and systemd (READY=1 on $NOTIFY_SOCKET, a datagram: no libsystemd needed).
struct Readiness {
    let pipeFD: Int32?

    init(pipeFD: Int32?) {
        self.pipeFD = pipeFD
        // Helpers we start (fusermount3 for auto_unmount) must not inherit it.
        if let pipeFD { _ = fcntl(pipeFD, F_SETFD, FD_CLOEXEC) }
    }

    func succeeded() {
        send(pipe: "OK\n")
        notifySystemd("READY=1\nSTATUS=Mounted")
    }

    func failed(_ message: String) {
        send(pipe: "ERR " + message + "\n")
    }

    private func send(pipe message: String) {
        guard let fd = pipeFD else { return }
        _ = message.withCString { write(fd, $0, strlen($0)) }
        close(fd)
    }
}

func notifySystemd(_ message: String) {
    guard var path = Paths.env("NOTIFY_SOCKET") else { return }
    if path.hasPrefix("@") { path = "\0" + path.dropFirst() } // abstract socket
    let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
    guard fd >= 0 else { return }
    defer { close(fd) }
    var addr = sockaddr_un()
    addr.sun_family = sa_family_t(AF_UNIX)
    let bytes = Array(path.utf8)
    guard bytes.count < MemoryLayout.size(ofValue: addr.sun_path) else { return }
    withUnsafeMutableBytes(of: &addr.sun_path) { raw in
        for (i, b) in bytes.enumerated() { raw[i] = b }
    }
    let length = socklen_t(MemoryLayout<sa_family_t>.size + bytes.count + (path.hasPrefix("\0") ? 0 : 1))
    _ = message.withCString { msg in
        withUnsafePointer(to: &addr) { ptr in
            ptr.withMemoryRebound(to: sockaddr.self, capacity: 1) { sa in
                sendto(fd, msg, strlen(msg), 0, sa, length)
            }
        }
    }
}

/// Background mode without fork (forking a process that has threads is unsafe): start
/// this same binary again with --foreground in a new session, its output in a log file,
/// and wait for it to report over a pipe that the mount is live.
enum Daemon {
    static func spawnAndWait(arguments: [String], logPath: String, mountpoint: String) throws {
        var fds: [Int32] = [0, 0]
        guard pipe(&fds) == 0 else { throw CLIError("pipe: \(errnoText(errno))") }
        let (readFD, writeFD) = (fds[0], fds[1])
        _ = fcntl(readFD, F_SETFD, FD_CLOEXEC)
        try makeDirectoriesForCLI(String(logPath[..<logPath.lastIndex(of: "/")!]))
        let logFD = open(logPath, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o644)
        guard logFD >= 0 else { throw CLIError("cannot open log \(logPath): \(errnoText(errno))") }
        let nullFD = open("/dev/null", O_RDONLY | O_CLOEXEC)

        let exe = (try? readLink("/proc/self/exe")) ?? arguments[0]
        let args = [exe] + Array(arguments.dropFirst()) + ["--foreground", "--ready-fd", String(writeFD)]
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        posix_spawn_file_actions_adddup2(&actions, nullFD, 0)
        posix_spawn_file_actions_adddup2(&actions, logFD, 1)
        posix_spawn_file_actions_adddup2(&actions, logFD, 2)
        var attr = posix_spawnattr_t()
        posix_spawnattr_init(&attr)
        let setsid: Int32 = 0x80 // POSIX_SPAWN_SETSID (glibc): survive the terminal closing
        posix_spawnattr_setflags(&attr, Int16(setsid))
        var cargs = args.map { strdup($0) } + [nil]
        var pid: pid_t = 0
        let rc = posix_spawn(&pid, exe, &actions, &attr, &cargs, environ)
        cargs.forEach { free($0) }
        posix_spawn_file_actions_destroy(&actions)
        posix_spawnattr_destroy(&attr)
        close(writeFD); close(logFD); close(nullFD)
        guard rc == 0 else { throw CLIError("cannot start the mount daemon: \(errnoText(rc))") }

        var reply: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = read(readFD, &buffer, buffer.count)
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { break }
            reply += buffer[0..<n]
            if reply.last == UInt8(ascii: "\n") { break } // one line: "OK" or "ERR message"
        }
        close(readFD)
        let text = String(decoding: reply, as: UTF8.self).trimmingTrailingNewlines()
        if text == "OK" {
            print("Mounted \(mountpoint) (daemon pid \(pid), log \(logPath))")
            return
        }
        var status: Int32 = 0
        waitpid(pid, &status, 0)
        if text.hasPrefix("ERR ") { throw CLIError(String(text.dropFirst(4))) }
        throw CLIError("the mount daemon exited before mounting; see \(logPath)")
    }
}

func readLink(_ path: String) throws -> String {
    var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
    let n = readlink(path, &buffer, buffer.count - 1)
    guard n > 0 else { throw CLIError("readlink \(path)") }
    return String(decoding: buffer[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
}

extension String {
    func trimmingTrailingNewlines() -> String {
        var s = self
        while s.hasSuffix("\n") { s.removeLast() }
        return s
    }
}
