import Glibc

/// What a request needs of a node: the rwx bits of open(2), access(2) and a path walk.
public struct Access: OptionSet, Sendable {
    public let rawValue: UInt32
    public init(rawValue: UInt32) { self.rawValue = rawValue }
    public static let read = Access(rawValue: 4)
    public static let write = Access(rawValue: 2)
    public static let execute = Access(rawValue: 1)
}

/// Who asks, for the permission rules below. The supplementary groups are read only when
/// a rule needs them (a file neither theirs nor of their own group), and once: the FUSE
/// request carries uid, gid and pid, and the groups cost a read of /proc.
public struct Requester {
    public let uid: UInt32
    public let gid: UInt32
    private let groups: Groups

    public init(uid: UInt32, gid: UInt32, groups: @escaping () -> [UInt32]) {
        self.uid = uid
        self.gid = gid
        self.groups = Groups(read: groups)
    }

    /// Root is taken to hold CAP_DAC_OVERRIDE, CAP_FOWNER and CAP_CHOWN, as it does unless
    /// it dropped them.
    var isRoot: Bool { uid == 0 }
    func inGroup(_ group: UInt32) -> Bool { group == gid || groups.list.contains(group) }

    /// One request's groups, read at the first rule that asks.
    private final class Groups {
        let read: () -> [UInt32]
        lazy var list: [UInt32] = read()
        init(read: @escaping () -> [UInt32]) { self.read = read }
    }
}

/// The kernel's permission rules, for a mount on which the daemon checks permissions
/// itself instead of the kernel (`default_permissions` off; `FUSESession` says when).
/// Linux's `generic_permission`, and `setattr_prepare`'s rules for owners, groups, modes
/// and times, and the sticky directory's; everything else the kernel still checks itself
/// (`trusted.*` attributes, file descriptors' modes, exec of a file with no x bit at all).
public enum Permissions {
    /// Who checks permissions: the kernel (`default_permissions`) or this daemon
    /// (`Permissions`, called from the FUSE layer's operations).
    ///
    /// The kernel's check costs a request per change: it drops a directory's cached
    /// attributes after every create, unlink or rename in it, and fetches them again (a
    /// GETATTR) for the next permission check there. `rm -rf` sent an UNLINK and a GETATTR
    /// per file and ran at half passthrough_ll's speed, which does not check.
    ///
    /// The daemon checks when all of these hold:
    /// - no `allow_other`: only the mount's owner (and root, with `allow_root`) can reach the
    ///   mount, so a mistake in a rule could only ever let the owner past their own modes.
    ///   A mount shared between users keeps the kernel's checks.
    /// - no `default_permissions` asked for.
    /// - Linux 6.16 or later: taking away a directory's search permission must expire the
    ///   names the kernel keeps under it, which it walks without asking; only
    ///   FUSE_NOTIFY_INC_EPOCH (6.16) expires them all, names known absent included.
    public static func daemonChecks(mountOptions: [String], kernelRelease: String) -> Bool {
        guard !mountOptions.contains("allow_other"), !mountOptions.contains("default_permissions") else { return false }
        let numbers = kernelRelease.split(whereSeparator: { !$0.isNumber }).prefix(2).compactMap { Int($0) }
        guard numbers.count == 2 else { return false }
        return (numbers[0], numbers[1]) >= (6, 16)
    }

    /// Whether `who` may have `want` of a node with attributes `a`.
    public static func allows(_ a: Attributes, _ want: Access, by who: Requester) -> Bool {
        if who.isRoot {
            // Root reads, writes and searches anything; it executes a file only if some
            // x bit is set.
            return !want.contains(.execute) || a.isDirectory || a.mode & 0o111 != 0
        }
        // The first class that matches decides, even if a later one would grant more.
        let bits: UInt32
        if a.uid == who.uid {
            bits = (a.mode >> 6) & 7
        } else if who.inGroup(a.gid) {
            bits = (a.mode >> 3) & 7
        } else {
            bits = a.mode & 7
        }
        return want.rawValue & ~bits == 0
    }

    /// EACCES unless `allows`.
    public static func check(_ a: Attributes, _ want: Access, by who: Requester) throws(Errno) {
        if !allows(a, want, by: who) { throw Errno(EACCES) }
    }

    /// Whether `who` may remove or rename away an entry of `dir` whose node is `child`:
    /// in a sticky directory, only the entry's owner or the directory's may (Linux's
    /// `check_sticky`; EPERM otherwise). Without `default_permissions` the kernel strips
    /// the sticky bit from its own copy of a mode and leaves this rule to the daemon.
    public static func mayRemove(_ child: Attributes, from dir: Attributes, by who: Requester) -> Bool {
        who.isRoot || !dir.isSticky || child.uid == who.uid || dir.uid == who.uid
    }

    /// What open(2) with `flags` needs: the access mode's bits, write for O_TRUNC, and for
    /// an exec (the kernel's __FMODE_EXEC in the flags) execute only.
    public static func needed(forOpen flags: Int32) -> Access {
        if flags & fmodeExec != 0 { return .execute }
        var want: Access
        switch flags & O_ACCMODE {
        case O_WRONLY: want = .write
        case O_RDWR: want = [.read, .write]
        default: want = .read
        }
        if flags & O_TRUNC != 0 { want.insert(.write) }
        return want
    }

    /// __FMODE_EXEC: set in the open flags of execve's open, which needs execute alone.
    static let fmodeExec: Int32 = 0o40

    /// Checks a setattr as `setattr_prepare` and `may_setattr` would, and returns the
    /// changes to make: a mode set by someone outside the file's group loses set-group-ID.
    /// `throughHandle`: a truncation through an open file (the descriptor's mode was
    /// checked at open), not by path.
    public static func checked(_ changes: FileSystem.AttributeChanges, of a: Attributes, throughHandle: Bool,
                               by who: Requester) throws(Errno) -> FileSystem.AttributeChanges {
        if who.isRoot { return changes }
        let owner = a.uid == who.uid
        if changes.size != nil, !throughHandle { try check(a, .write, by: who) }
        // Touching (both times "now") is for the owner or anyone who may write; any time
        // given explicitly is for the owner only.
        let times = [changes.atime, changes.mtime].compactMap { $0 }
        let explicit = times.contains { if case .at = $0 { return true }; return false }
        if !times.isEmpty, !explicit, !owner { try check(a, .write, by: who) }
        if let uid = changes.uid, !(owner && uid == a.uid) { throw .notPermitted }
        if let gid = changes.gid, !(owner && (gid == a.gid || who.inGroup(gid))) { throw .notPermitted }
        var result = changes
        if let mode = changes.mode {
            if !owner { throw .notPermitted }
            if mode & UInt32(S_ISGID) != 0, !who.inGroup(changes.gid ?? a.gid) { result.mode = mode & ~UInt32(S_ISGID) }
        }
        if explicit, !owner { throw .notPermitted }
        return result
    }
}
