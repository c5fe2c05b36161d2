import Glibc

/// One line of /proc/self/mountinfo.
public struct MountEntry: Sendable {
    /// The mount's device, "major:minor" (its backing device info is /sys/class/bdi/<device>).
    public var device: String
    public var mountpoint: String
    public var fstype: String
    public var source: String
}

/// The mounts this process sees (octal escapes such as \040 decoded).
public func mountEntries() -> [MountEntry] {
    guard let file = fopen("/proc/self/mountinfo", "r") else { return [] }
    defer { fclose(file) }
    var result: [MountEntry] = []
    var line: UnsafeMutablePointer<CChar>?
    var capacity = 0
    while getline(&line, &capacity, file) > 0 {
        let fields = String(cString: line!).split(separator: " ")
        guard let dash = fields.firstIndex(of: "-"), fields.count > dash + 2, fields.count > 4 else { continue }
        result.append(MountEntry(device: String(fields[2]), mountpoint: unescape(fields[4]), fstype: String(fields[dash + 1]), source: unescape(fields[dash + 2])))
    }
    free(line)
    return result
}

/// Whether `path` is a mount point now.
public func isMountpoint(_ path: String) -> Bool {
    mountEntries().contains { $0.mountpoint == path }
}

private func unescape(_ s: Substring) -> String {
    var bytes: [UInt8] = []
    var it = Array(s.utf8)[...]
    while let c = it.popFirst() {
        if c == UInt8(ascii: "\\"), it.count >= 3, let v = UInt8(String(decoding: it.prefix(3), as: UTF8.self), radix: 8) {
            bytes.append(v)
            it = it.dropFirst(3)
        } else {
            bytes.append(c)
        }
    }
    return String(decoding: bytes, as: UTF8.self)
}
