import CUbiquity
import Glibc

// File and directory helpers with the EINTR and short-read/short-write loops every caller
// needs, so no layer writes them again.

/// Writes all of `bytes` to `fd` (at its offset, or at `offset` with pwrite).
public func writeAll(_ fd: Int32, _ bytes: UnsafeRawBufferPointer, at offset: Int64? = nil, path: String) throws(SystemError) {
    var done = 0
    while done < bytes.count {
        let n = retryingEINTR {
            if let offset { pwrite(fd, bytes.baseAddress! + done, bytes.count - done, off_t(offset) + off_t(done)) }
            else { write(fd, bytes.baseAddress! + done, bytes.count - done) }
        }
        if n < 0 { throw .last("write \(path)") }
        done += n
    }
}

/// Writes `first`, then `second` right after it, at `offset`: one pwritev for both
/// unless the kernel takes less.
public func writeAll(_ fd: Int32, _ first: UnsafeRawBufferPointer, _ second: UnsafeRawBufferPointer, at offset: Int64,
                     path: String) throws(SystemError) {
    guard !first.isEmpty, !second.isEmpty else {
        try writeAll(fd, first.isEmpty ? second : first, at: offset, path: path)
        return
    }
    var done = 0
    while done < first.count {
        var iov = [iovec(iov_base: UnsafeMutableRawPointer(mutating: first.baseAddress! + done), iov_len: first.count - done),
                   iovec(iov_base: UnsafeMutableRawPointer(mutating: second.baseAddress!), iov_len: second.count)]
        let n = retryingEINTR { pwritev(fd, &iov, 2, off_t(offset) + off_t(done)) }
        if n < 0 { throw .last("write \(path)") }
        done += n
    }
    let rest = done - first.count
    if rest < second.count {
        try writeAll(fd, UnsafeRawBufferPointer(rebasing: second[rest...]), at: offset + Int64(done), path: path)
    }
}

public func writeAll(_ fd: Int32, _ bytes: [UInt8], at offset: Int64? = nil, path: String) throws(SystemError) {
    var result: Result<Void, SystemError> = .success(())
    bytes.withUnsafeBytes { raw in
        do throws(SystemError) { try writeAll(fd, raw, at: offset, path: path) } catch { result = .failure(error) }
    }
    try result.get()
}

/// Reads up to `count` bytes at `offset` into `buffer`, stopping early only at end of file.
/// Returns the number read.
public func readFully(_ fd: Int32, into buffer: UnsafeMutableRawBufferPointer, at offset: Int64, path: String) throws(SystemError) -> Int {
    var done = 0
    while done < buffer.count {
        let n = retryingEINTR { pread(fd, buffer.baseAddress! + done, buffer.count - done, off_t(offset) + off_t(done)) }
        if n < 0 { throw .last("read \(path)") }
        if n == 0 { break }
        done += n
    }
    return done
}

/// Fills the buffers of `iov` in order from `offset` (one `preadv`, unless the kernel
/// gives less), stopping early only at end of file. Returns the number of bytes read.
public func readFully(_ fd: Int32, _ iov: [iovec], at offset: Int64, path: String) throws(SystemError) -> Int {
    var rest = iov
    var done = 0, first = 0
    while first < rest.count {
        let n = rest.withUnsafeBufferPointer { v in
            // At most 1024 buffers a call (Linux's UIO_MAXIOV).
            retryingEINTR { preadv(fd, v.baseAddress! + first, Int32(min(v.count - first, 1024)), off_t(offset) + off_t(done)) }
        }
        if n < 0 { throw .last("read \(path)") }
        if n == 0 { break }
        done += n
        // Past the buffers filled; into the one filled in part.
        var left = n
        while first < rest.count, left >= rest[first].iov_len {
            left -= rest[first].iov_len
            first += 1
        }
        if left > 0 {
            rest[first].iov_base = rest[first].iov_base! + left
            rest[first].iov_len -= left
        }
    }
    return done
}

/// Up to `count` bytes at `offset` (fewer only at end of file). The caller bounds `count`.
/// Not zeroed first: what the read does not fill is never part of the array (zeroing the
/// bytes the read then fills would write them twice, a cost a cold read feels).
public func readBytes(_ fd: Int32, count: Int, at offset: Int64, path: String) throws(SystemError) -> [UInt8] {
    var failure: SystemError?
    let bytes = [UInt8](unsafeUninitializedCapacity: count) { buffer, initialized in
        do throws(SystemError) {
            initialized = try readFully(fd, into: UnsafeMutableRawBufferPointer(buffer), at: offset, path: path)
        } catch {
            failure = error
            initialized = 0
        }
    }
    if let failure { throw failure }
    return bytes
}

/// The whole file, or nil when it does not exist. A file larger than `limit` is refused
/// (EFBIG) before anything is allocated: callers read files others may have written.
public func readFile(_ path: String, limit: Int) throws(SystemError) -> [UInt8]? {
    let fd = open(path, O_RDONLY | O_CLOEXEC)
    if fd < 0 {
        if errno == ENOENT { return nil }
        throw .last("open \(path)")
    }
    defer { close(fd) }
    var st = stat()
    guard fstat(fd, &st) == 0 else { throw .last("stat \(path)") }
    guard st.st_size >= 0, st.st_size <= limit else { throw SystemError(EFBIG, "\(path) is \(st.st_size) bytes, more than \(limit)") }
    // A file that shrank meanwhile gives what it still had; one that grew, its first bytes.
    return try readBytes(fd, count: Int(st.st_size), at: 0, path: path)
}

/// Temp name in the same directory, write, fsync, rename: a reader sees the whole file or
/// none. `tempPrefix` names the temp file so readers and cleanups can recognise it.
/// `noReplace`: an existing file stays and the call fails with EEXIST (an atomic
/// create-if-absent): renameat2(RENAME_NOREPLACE) where the filesystem has it (vfat and
/// exfat USB disks have no link), else link(2) (NFS); an EEXIST from link whose temp file
/// gained the link anyway is a retransmitted request that had succeeded (the NFS idiom).
/// `durable`: fsync the directory too, so the name survives a power loss when this
/// returns (restic's save does the same, and as restic ignores the filesystems that
/// refuse a directory fsync: EINVAL, ENOTSUP, ENOSYS; the file itself was fsynced).
public func writeFileAtomically(_ path: String, _ bytes: [UInt8], tempPrefix: String, mode: mode_t = 0o644,
                                noReplace: Bool = false, durable: Bool = false) throws(SystemError) {
    let slash = path.lastIndex(of: "/")!
    let directory = slash == path.startIndex ? "/" : String(path[..<slash])
    let tempPath = "\(path[..<slash])/\(tempPrefix)\(randomHex(bytes: 6))"
    let fd = open(tempPath, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode)
    if fd < 0 { throw .last("create \(tempPath)") }
    var isOpen = true
    do throws(SystemError) {
        try writeAll(fd, bytes, path: tempPath)
        guard fsync(fd) == 0 else { throw .last("fsync \(tempPath)") }
        // close can report a late write error (NFS, quota): never publish such a file. The
        // descriptor is gone whatever close returns, so it is never closed twice.
        isOpen = false
        guard close(fd) == 0 else { throw .last("close \(tempPath)") }
    } catch {
        if isOpen { close(fd) }
        unlink(tempPath)
        throw error
    }
    if noReplace {
        if ubq_rename_noreplace(tempPath, path) != 0 {
            let renameError = SystemError.last("rename \(tempPath) to \(path)")
            guard renameError.code == EINVAL || renameError.code == ENOSYS else { unlink(tempPath); throw renameError }
            var linked = link(tempPath, path) == 0
            let error = SystemError.last("link \(tempPath) to \(path)")
            var st = stat()
            if !linked && error.code == EEXIST && stat(tempPath, &st) == 0 && st.st_nlink == 2 { linked = true }
            unlink(tempPath)
            guard linked else { throw error }
        }
    } else if rename(tempPath, path) != 0 {
        let error = SystemError.last("rename \(tempPath)")
        unlink(tempPath)
        throw error
    }
    if durable {
        do { try fsyncPath(directory, directory: true) } catch {
            guard error.code != EINVAL && error.code != ENOTSUP && error.code != ENOSYS else { return }
            throw error
        }
    }
}

/// fsync of a file or directory by path.
public func fsyncPath(_ path: String, directory: Bool = false) throws(SystemError) {
    let fd = open(path, (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC)
    if fd < 0 { throw .last("open \(path) to fsync") }
    defer { close(fd) }
    guard fsync(fd) == 0 else { throw .last("fsync \(path)") }
}

/// Starts writing `fd`'s dirty pages to disk and returns (a later fsync or syncfs then
/// has less to wait for). Best effort: a filesystem that cannot is no error.
public func startWriteback(_ fd: Int32) { _ = ubq_start_writeback(fd) }

/// `startWriteback` of `count` bytes at `offset` only.
public func startWriteback(_ fd: Int32, offset: Int64, count: Int64) { _ = ubq_start_writeback_range(fd, offset, count) }

/// syncfs(2): everything written to the filesystem holding `fd` reaches the disk.
public func syncFilesystem(_ fd: Int32, path: String) throws(SystemError) {
    guard ubq_syncfs(fd) == 0 else { throw .last("syncfs \(path)") }
}

/// An unnamed file in `directory` (O_TMPFILE), or a created-and-unlinked one where the
/// filesystem has no O_TMPFILE (some network filesystems).
public func makeAnonymousFile(in directory: String) throws(SystemError) -> Int32 {
    let fd = ubq_open_tmpfile(directory, O_RDWR | O_CLOEXEC, 0o600)
    if fd >= 0 { return fd }
    let path = directory + "/" + randomHex(bytes: 8)
    let named = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
    if named < 0 { throw .last("create a temporary file in \(directory)") }
    unlink(path)
    return named
}

/// The names in directory `path` except `.` and `..`, unsorted.
public func directoryEntries(_ path: String) throws(SystemError) -> [String] {
    guard let dir = opendir(path) else { throw .last("list \(path)") }
    defer { closedir(dir) }
    return names(in: dir)
}

private func names(in dir: OpaquePointer) -> [String] {
    var names: [String] = []
    while let entry = readdir(dir) {
        let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
        if name != "." && name != ".." { names.append(name) }
    }
    return names
}

/// mkdir that accepts an existing directory.
public func makeDirectory(_ path: String, mode: mode_t = 0o755) throws(SystemError) {
    if mkdir(path, mode) != 0 && errno != EEXIST { throw .last("mkdir \(path)") }
}

/// mkdir -p.
public func makeDirectories(_ path: String, mode: mode_t = 0o755) throws(SystemError) {
    var prefix = ""
    for component in path.split(separator: "/", omittingEmptySubsequences: true) {
        prefix += "/" + component
        try makeDirectory(prefix, mode: mode)
    }
}

/// Whether the directory open as `fd` is on a filesystem whose every change is made
/// through this machine's kernel (ext4, XFS, Btrfs, tmpfs, F2FS, ZFS), so that inotify
/// sees them all. Not NFS, SMB, FUSE (sshfs), overlayfs or anything unknown: there another
/// machine (or a lower layer) changes files without an event. Not FAT, exFAT or NTFS
/// either: names there match in any case, and an event may spell one as its caller did.
public func changesAreAllLocal(fd: Int32) -> Bool {
    let local: Set<Int64> = [
        0xEF53,     // ext2/3/4
        0x5846_5342, // XFS
        0x9123_683E, // Btrfs
        0x0102_1994, // tmpfs
        0xF2F5_2010, // F2FS
        0x2FC1_2FC1, // ZFS
    ]
    return local.contains(Int64(ubq_filesystem_type(fd)))
}

/// The names in the directory open as `fd` (no `.` and `..`); `fd` stays open.
public func directoryEntries(fd: Int32) throws(SystemError) -> [String] {
    let copy = dup(fd)
    guard copy >= 0 else { throw .last("dup") }
    guard let dir = fdopendir(copy) else {
        let error = SystemError.last("fdopendir")
        close(copy)
        throw error
    }
    defer { closedir(dir) }
    return names(in: dir)
}

/// renameat2(RENAME_EXCHANGE): `a` and `b` swap places.
public func exchangePaths(_ a: String, _ b: String) throws(SystemError) {
    guard ubq_rename_exchange(a, b) == 0 else { throw .last("exchange \(a) and \(b)") }
}
