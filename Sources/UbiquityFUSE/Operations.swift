import CFuse
import Glibc
import UbiquityFS
import UbiquityStore
import UbiquitySystem

// FUSE_SET_ATTR_* and UTIME_* are not all imported (macros); values from fuse_lowlevel.h.
private let setMode: Int32 = 1 << 0, setUID: Int32 = 1 << 1, setGID: Int32 = 1 << 2, setSize: Int32 = 1 << 3
private let setAtime: Int32 = 1 << 4, setMtime: Int32 = 1 << 5, setAtimeNow: Int32 = 1 << 7, setMtimeNow: Int32 = 1 << 8
/// FATTR_KILL_SUIDGID (libfuse's FUSE_SET_ATTR_KILL_SUID): with FUSE_HANDLE_KILLPRIV_V2
/// (`KernelChannel`), a chown, or a truncation by a caller without CAP_FSETID.
private let setDropSetID: Int32 = 1 << 11
/// renameat2's RENAME_EXCHANGE (linux/fs.h, not imported).
private let renameExchange: UInt32 = 1 << 1

/// The low-level operations table: one call into `FileSystem` per operation.
func makeOperations() -> fuse_lowlevel_ops {
    var ops = fuse_lowlevel_ops()

    ops.`init` = { userdata, conn in
        guard let conn else { return }
        // Let the kernel send O_TRUNC with open (one request instead of setattr + open).
        if conn.pointee.capable & UInt32(FUSE_CAP_ATOMIC_O_TRUNC) != 0 { conn.pointee.want |= UInt32(FUSE_CAP_ATOMIC_O_TRUNC) }
        // No asynchronous direct I/O: an AIO O_DIRECT write that the kernel completes
        // asynchronously skips the page-cache invalidation that follows a direct write
        // (generic_file_direct_write invalidates only when the write returns done), so
        // pages a concurrent buffered reader brought in during the write stay cached with
        // the bytes it replaced (IntegrationTests/mount/direct-io-check.c).
        // Done synchronously, the kernel drops those pages before the write completes.
        conn.pointee.want &= ~UInt32(FUSE_CAP_ASYNC_DIO)
        // Read ahead up to 1 MiB per request once the mount's read_ahead_kb allows it
        // (FUSESession.raiseReadahead); the kernel keeps whichever is smaller.
        conn.pointee.max_readahead = UInt32(FUSESession.readaheadKiB << 10)
    }

    ops.lookup = { req, parent, cname in
        reply(req) { () throws(Errno) in
            try require(req, parent, .execute, directory: true)
            if let found = try context(req).fs.lookupOrAbsence(parent: inode(parent), name: try name(cname)) {
                replyEntry(req, found)
            } else {
                // The kernel keeps the name's absence (a negative dentry) as long as it
                // would keep an entry: sync invalidates names it adds (`invalidate`).
                replyNoEntry(req)
            }
        }
    }

    ops.forget = { req, ino, count in
        context(req).fs.forget(inode(ino), count: count)
        fuse_reply_none(req)
    }

    ops.forget_multi = { req, count, forgets in
        let fs = context(req).fs
        for i in 0..<count { fs.forget(inode(forgets![i].ino), count: forgets![i].nlookup) }
        fuse_reply_none(req)
    }

    ops.getattr = { req, ino, _ in
        reply(req) { () throws(Errno) in replyAttr(req, try context(req).fs.getattr(inode(ino))) }
    }

    ops.setattr = { req, ino, attr, toSet, fi in
        reply(req) { () throws(Errno) in
            let st = attr!.pointee
            var changes = FileSystem.AttributeChanges()
            if toSet & setMode != 0 { changes.mode = UInt32(st.st_mode) }
            if toSet & setUID != 0 { changes.uid = st.st_uid }
            if toSet & setGID != 0 { changes.gid = st.st_gid }
            if toSet & setSize != 0 { changes.size = Int64(st.st_size) }
            changes.dropsSetID = toSet & setDropSetID != 0
            if toSet & setAtimeNow != 0 { changes.atime = .now } else if toSet & setAtime != 0 { changes.atime = .at(st.st_atim.nanos) }
            if toSet & setMtimeNow != 0 { changes.mtime = .now } else if toSet & setMtime != 0 { changes.mtime = .at(st.st_mtim.nanos) }
            let mount = context(req)
            guard mount.checksPermissions else { return replyAttr(req, try mount.fs.setattr(inode(ino), changes)) }
            let before = try mount.fs.getattr(inode(ino))
            changes = try Permissions.checked(changes, of: before, throughHandle: fi != nil, by: requester(req))
            let after = try mount.fs.setattr(inode(ino), changes)
            // The kernel walks the names it keeps under a directory without asking: they
            // must expire when someone may no longer search it. Before the reply, so no
            // walk sees the new mode with the old names.
            if before.isDirectory,
               TreeChanges.narrowsSearch(from: before.mode, to: after.mode) || before.uid != after.uid || before.gid != after.gid {
                KernelChannel.expireNames(mount)
            }
            replyAttr(req, after)
        }
    }

    ops.readlink = { req, ino in
        reply(req) { () throws(Errno) in
            let target = try context(req).fs.readlink(inode(ino))
            _ = withCName(target) { c, _ in fuse_reply_readlink(req, c) }
        }
    }

    ops.mknod = { req, parent, cname, mode, rdev in
        reply(req) { () throws(Errno) in
            try require(req, parent, [.write, .execute], directory: true)
            replyEntry(req, try context(req).fs.mknod(parent: inode(parent), name: try name(cname), mode: UInt32(mode), rdev: UInt64(rdev), caller: caller(req)))
        }
    }

    ops.mkdir = { req, parent, cname, mode in
        reply(req) { () throws(Errno) in
            try require(req, parent, [.write, .execute], directory: true)
            replyEntry(req, try context(req).fs.mkdir(parent: inode(parent), name: try name(cname), mode: UInt32(mode), caller: caller(req)))
        }
    }

    ops.unlink = { req, parent, cname in
        reply(req) { () throws(Errno) in
            try require(req, parent, [.write, .execute], directory: true)
            try requireRemovable(req, parent, try name(cname))
            try context(req).fs.unlink(parent: inode(parent), name: try name(cname))
            fuse_reply_err(req, 0)
        }
    }

    ops.rmdir = { req, parent, cname in
        reply(req) { () throws(Errno) in
            try require(req, parent, [.write, .execute], directory: true)
            try requireRemovable(req, parent, try name(cname))
            try context(req).fs.rmdir(parent: inode(parent), name: try name(cname))
            fuse_reply_err(req, 0)
        }
    }

    ops.symlink = { req, target, parent, cname in
        reply(req) { () throws(Errno) in
            try require(req, parent, [.write, .execute], directory: true)
            replyEntry(req, try context(req).fs.symlink(target: try UbiquityFUSE.target(target), parent: inode(parent), name: try name(cname), caller: caller(req)))
        }
    }

    ops.rename = { req, parent, cname, newParent, newName, flags in
        reply(req) { () throws(Errno) in
            try requireRename(req, parent, try name(cname), newParent, try name(newName), flags: UInt32(flags))
            try context(req).fs.rename(parent: inode(parent), name: try name(cname), newParent: inode(newParent), newName: try name(newName), flags: UInt32(flags))
            fuse_reply_err(req, 0)
        }
    }

    ops.link = { req, ino, newParent, newName in
        reply(req) { () throws(Errno) in
            try require(req, newParent, [.write, .execute], directory: true)
            replyEntry(req, try context(req).fs.link(inode(ino), parent: inode(newParent), name: try name(newName)))
        }
    }

    ops.open = { req, ino, fi in
        reply(req) { () throws(Errno) in
            try require(req, ino, Permissions.needed(forOpen: fi!.pointee.flags))
            var flags = OpenFlags(fi!.pointee.flags)
            flags.dropsSetID = KernelChannel.requestDropsSetID
            let handle = try context(req).fs.open(inode(ino), flags: flags)
            fi!.pointee.fh = handle.rawValue
            // Content changes only through this mount, so the page cache stays valid.
            fi!.pointee.keep_cache = context(req).fs.keepsCache(handle) ? 1 : 0
            fuse_reply_open(req, fi)
        }
    }

    ops.create = { req, parent, cname, mode, fi in
        reply(req) { () throws(Errno) in
            try require(req, parent, [.write, .execute], directory: true)
            let (attributes, handle) = try context(req).fs.create(parent: inode(parent), name: try name(cname), mode: UInt32(mode),
                                                                  flags: OpenFlags(fi!.pointee.flags), caller: caller(req))
            fi!.pointee.fh = handle.rawValue
            fi!.pointee.keep_cache = context(req).fs.keepsCache(handle) ? 1 : 0
            var e = entryParam(attributes)
            fuse_reply_create(req, &e, fi)
        }
    }

    ops.read = { req, _, size, offset, fi in
        reply(req) { () throws(Errno) in
            replyPieces(req, try context(req).fs.readPieces(handle(fi), offset: Int64(offset), count: size))
        }
    }

    ops.write = { req, _, buf, size, offset, fi in
        reply(req) { () throws(Errno) in
            let data = UnsafeRawBufferPointer(start: buf, count: size)
            let written = try context(req).fs.write(handle(fi), offset: Int64(offset), data: data,
                                                   dropsSetID: KernelChannel.requestDropsSetID)
            fuse_reply_write(req, written)
        }
    }

    ops.flush = { req, _, fi in
        reply(req) { () throws(Errno) in
            try context(req).fs.flush(handle(fi))
            fuse_reply_err(req, 0)
        }
    }

    ops.release = { req, _, fi in
        reply(req) { () throws(Errno) in
            try context(req).fs.release(handle(fi))
            fuse_reply_err(req, 0)
        }
    }

    ops.fsync = { req, _, _, fi in
        reply(req) { () throws(Errno) in
            try context(req).fs.fsync(handle(fi))
            fuse_reply_err(req, 0)
        }
    }

    ops.opendir = { req, ino, fi in
        reply(req) { () throws(Errno) in
            try require(req, ino, .read, directory: true)
            fi!.pointee.fh = try context(req).fs.opendir(inode(ino)).rawValue
            fuse_reply_open(req, fi)
        }
    }

    ops.readdir = { req, ino, size, offset, fi in
        reply(req) { () throws(Errno) in try readDirectory(req, inode(ino), size, offset, handle(fi), plus: false) }
    }

    ops.readdirplus = { req, ino, size, offset, fi in
        reply(req) { () throws(Errno) in try readDirectory(req, inode(ino), size, offset, handle(fi), plus: true) }
    }

    ops.releasedir = { req, _, fi in
        context(req).fs.releasedir(handle(fi))
        fuse_reply_err(req, 0)
    }

    ops.fsyncdir = { req, _, _, _ in
        reply(req) { () throws(Errno) in
            try context(req).fs.fsyncDirectory()
            fuse_reply_err(req, 0)
        }
    }

    ops.statfs = { req, _ in
        reply(req) { () throws(Errno) in
            let s = try context(req).fs.statfs()
            var st = statvfs()
            st.f_bsize = UInt(s.blockSize)
            st.f_frsize = UInt(s.blockSize)
            st.f_blocks = fsblkcnt_t(s.blocks)
            st.f_bfree = fsblkcnt_t(s.blocksFree)
            st.f_bavail = fsblkcnt_t(s.blocksAvailable)
            st.f_files = fsfilcnt_t(s.files)
            st.f_ffree = fsfilcnt_t(s.filesFree)
            st.f_favail = fsfilcnt_t(s.filesFree)
            st.f_namemax = UInt(s.nameMax)
            fuse_reply_statfs(req, &st)
        }
    }

    ops.setxattr = { req, ino, cname, value, size, flags in
        reply(req) { () throws(Errno) in
            try requireForXattr(req, ino, cname, .write)
            let bytes = Array(UnsafeRawBufferPointer(start: value, count: size))
            try context(req).fs.setxattr(inode(ino), name: try xattrName(cname), value: bytes, flags: flags)
            fuse_reply_err(req, 0)
        }
    }

    ops.getxattr = { req, ino, cname, size in
        reply(req) { () throws(Errno) in
            try requireForXattr(req, ino, cname, .read)
            let value = try context(req).fs.getxattr(inode(ino), name: try xattrName(cname))
            try replyXattr(req, value, size)
        }
    }

    ops.listxattr = { req, ino, size in
        reply(req) { () throws(Errno) in
            let names = try context(req).fs.listxattr(inode(ino))
            try replyXattr(req, names.flatMap { NameCodec.bytes($0) + [0] }, size)
        }
    }

    ops.removexattr = { req, ino, cname in
        reply(req) { () throws(Errno) in
            try requireForXattr(req, ino, cname, .write)
            try context(req).fs.removexattr(inode(ino), name: try xattrName(cname))
            fuse_reply_err(req, 0)
        }
    }

    // Sent only where the kernel does not check (access(2), faccessat, chdir).
    ops.access = { req, ino, mask in
        reply(req) { () throws(Errno) in
            try require(req, ino, Access(rawValue: UInt32(truncatingIfNeeded: mask) & 7))
            fuse_reply_err(req, 0)
        }
    }

    ops.fallocate = { req, _, mode, offset, length, fi in
        reply(req) { () throws(Errno) in
            try context(req).fs.fallocate(handle(fi), mode: mode, offset: Int64(offset), length: Int64(length))
            fuse_reply_err(req, 0)
        }
    }

    ops.lseek = { req, _, offset, whence, fi in
        reply(req) { () throws(Errno) in
            // The kernel sends only SEEK_DATA and SEEK_HOLE; it handles the others itself.
            guard whence == Linux.seekData || whence == Linux.seekHole else { throw .invalid }
            let result = try context(req).fs.seek(handle(fi), offset: Int64(offset), data: whence == Linux.seekData)
            fuse_reply_lseek(req, off_t(result))
        }
    }

    return ops
}

/// A rename needs write and search on both directories, and, where a directory moves to
/// another parent, write on it (its ".." changes); so does an exchanged directory.
private func requireRename(_ req: fuse_req_t?, _ parent: fuse_ino_t, _ name: String, _ newParent: fuse_ino_t, _ newName: String,
                           flags: UInt32) throws(Errno) {
    try require(req, parent, [.write, .execute], directory: true)
    if newParent != parent { try require(req, newParent, [.write, .execute], directory: true) }
    try requireRemovable(req, parent, name)
    try requireRemovable(req, newParent, newName) // the entry it replaces, if any
    let mount = context(req)
    guard mount.checksPermissions, newParent != parent else { return }
    let who = requester(req)
    guard who.uid != 0 else { return }
    var moved = [(parent, name)]
    if flags & renameExchange != 0 { moved.append((newParent, newName)) }
    for (dir, entry) in moved {
        if let a = try mount.fs.attributes(parent: inode(dir), name: entry), a.isDirectory {
            try Permissions.check(a, .write, by: who)
        }
    }
}

/// An entry of a sticky directory goes (unlink, rmdir, rename from or over it) only by
/// its owner or the directory's (`Permissions.mayRemove`).
private func requireRemovable(_ req: fuse_req_t?, _ parent: fuse_ino_t, _ name: String) throws(Errno) {
    let mount = context(req)
    guard mount.checksPermissions else { return }
    let who = requester(req)
    guard who.uid != 0 else { return }
    let dir = try mount.fs.getattr(inode(parent))
    guard dir.isSticky, let child = try mount.fs.attributes(parent: inode(parent), name: name) else { return }
    if !Permissions.mayRemove(child, from: dir, by: who) { throw .notPermitted }
}

/// `user.*` attributes are read and written as the file is (the kernel checks the other
/// namespaces itself, and which nodes may have `user.*` ones).
private func requireForXattr(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ cname: UnsafePointer<CChar>?, _ want: Access) throws(Errno) {
    guard let cname, strncmp(cname, "user.", 5) == 0 else { return }
    try require(req, ino, want)
}

/// getxattr/listxattr protocol: size 0 asks for the length; too small a buffer is ERANGE.
private func replyXattr(_ req: fuse_req_t?, _ value: [UInt8], _ size: Int) throws(Errno) {
    if size == 0 {
        fuse_reply_xattr(req, value.count)
    } else if value.count > size {
        throw .range
    } else {
        _ = value.withUnsafeBufferPointer { fuse_reply_buf(req, UnsafeRawPointer($0.baseAddress)?.assumingMemoryBound(to: CChar.self), $0.count) }
    }
}

/// Fills one readdir(plus) reply from the listing snapshotted at opendir. Offsets are
/// positions in that snapshot (1-based, after "." and ".."), so they stay valid.
private func readDirectory(_ req: fuse_req_t?, _ ino: InodeNumber, _ size: Int, _ offset: off_t, _ handle: HandleID, plus: Bool) throws(Errno) {
    let fs = context(req).fs
    // The snapshot is shared, not copied: a call costs the entries it returns, so listing
    // a directory of N entries is O(N), not O(N²).
    let entries = try fs.readdir(handle, fromStart: offset == 0)
    // Names with attributes become names the kernel walks without asking: only for a
    // caller who may search the directory (entries with node 0 are names alone).
    let attributesShown = !plus || (try? require(req, ino.rawValue, .execute, directory: true)) != nil
    var own: Attributes?
    var referenced: [InodeNumber] = []
    var buffer = [CChar](repeating: 0, count: size)
    var used = 0
    var index = max(0, Int(offset))
    while index < entries.count + 2 {
        let entryName: String, attributes: Attributes
        if index < 2 {
            if own == nil { own = try fs.getattr(ino) }
            (entryName, attributes) = (index == 0 ? "." : "..", own!)
        } else {
            (entryName, attributes) = (entries[index - 2].name, entries[index - 2].attributes)
        }
        let needed = buffer.withUnsafeMutableBufferPointer { buf -> Int in
            let dest = buf.baseAddress! + used
            if plus {
                var e = entryParam(attributes)
                if !attributesShown { e.ino = 0 }
                return withCName(entryName) { c, _ in fuse_add_direntry_plus(req, dest, size - used, c, &e, off_t(index + 1)) }
            } else {
                var st = statBuffer(attributes)
                return withCName(entryName) { c, _ in fuse_add_direntry(req, dest, size - used, c, &st, off_t(index + 1)) }
            }
        }
        if needed > size - used { break }
        // The kernel takes a reference for each readdirplus entry except "." and "..".
        if plus && attributesShown && index >= 2 { referenced.append(attributes.ino) }
        used += needed
        index += 1
    }
    fs.noteLookups(referenced)
    _ = buffer.withUnsafeBufferPointer { fuse_reply_buf(req, $0.baseAddress, used) }
}
