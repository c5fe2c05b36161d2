import Glibc

/// Log lines go to stderr: the journal under systemd, the daemon's log file in the
/// background, the terminal in the foreground.
public func log(_ message: String) {
    let bytes = Array((message + "\n").utf8)
    var done = 0
    while done < bytes.count {
        let n = bytes.withUnsafeBytes { raw in retryingEINTR { write(STDERR_FILENO, raw.baseAddress! + done, raw.count - done) } }
        if n <= 0 { return }
        done += n
    }
}
