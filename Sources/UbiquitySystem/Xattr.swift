import CUbiquity
import Glibc

// Extended attributes by path (<sys/xattr.h> is not in Swift's Glibc module). The CLI
// talks to a running daemon through these on the mount.

/// The value of attribute `name` of `path`. `noFollow` reads a symlink itself (lgetxattr)
/// rather than what it points to.
public func getXattr(_ path: String, _ name: String, noFollow: Bool = false) throws(SystemError) -> [UInt8] {
    var capacity = 4096
    while true {
        var buffer = [UInt8](repeating: 0, count: capacity)
        let n = buffer.withUnsafeMutableBytes { raw -> Int in
            noFollow ? lgetxattr(path, name, raw.baseAddress, raw.count) : getxattr(path, name, raw.baseAddress, raw.count)
        }
        if n >= 0 { return Array(buffer[0..<n]) }
        let code = errno
        if code == EINTR { continue }
        guard code == ERANGE, capacity < XATTR_SIZE_MAX else { throw SystemError(code, "getxattr \(name)") }
        // The value grew between calls: ask for its size and try again.
        let size = noFollow ? lgetxattr(path, name, nil, 0) : getxattr(path, name, nil, 0)
        guard size >= 0 else { throw .last("getxattr \(name)") }
        capacity = min(max(size, capacity * 2), Int(XATTR_SIZE_MAX))
    }
}

/// Sets attribute `name` of `path`. Not retried on EINTR: on `user.ubiquity.control` this
/// is the call that waits for the daemon, and its answer, whatever it is, is the result.
public func setXattr(_ path: String, _ name: String, _ value: [UInt8]) throws(SystemError) {
    let result = value.withUnsafeBytes { raw in setxattr(path, name, raw.baseAddress, raw.count, 0) }
    guard result == 0 else { throw .last("setxattr \(name)") }
}

/// Sets attribute `name` of the open file `fd`.
public func setXattr(fd: Int32, _ name: String, _ value: [UInt8]) throws(SystemError) {
    let result = value.withUnsafeBytes { raw in fsetxattr(fd, name, raw.baseAddress, raw.count, 0) }
    guard result == 0 else { throw .last("fsetxattr \(name)") }
}

/// The names of `path`'s attributes.
public func listXattrs(_ path: String) throws(SystemError) -> [String] {
    while true {
        let size = listxattr(path, nil, 0)
        guard size >= 0 else { throw .last("listxattr \(path)") }
        var buffer = [CChar](repeating: 0, count: size + 1)
        let n = listxattr(path, &buffer, buffer.count)
        if n < 0 && errno == ERANGE { continue } // grew meanwhile
        guard n >= 0 else { throw .last("listxattr \(path)") }
        return buffer[0..<n].split(separator: 0).map { String(decoding: $0.map { UInt8(bitPattern: $0) }, as: UTF8.self) }
    }
}

/// XATTR_SIZE_MAX from <linux/limits.h>: the largest value Linux passes.
public let XATTR_SIZE_MAX = 65536
