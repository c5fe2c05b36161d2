import Glibc
import Testing
@testable import UbiquityFS
@testable import UbiquityStore

/// The rules the daemon checks in place of the kernel's `default_permissions`. Through a
/// real mount, `t-differential.py --user` compares them with ext4's.
@Suite struct PermissionsTests {
    func node(_ mode: UInt32, uid: UInt32 = 1000, gid: UInt32 = 100, directory: Bool = false) -> Attributes {
        var a = Attributes(virtual: InodeNumber(rawValue: 2), directory: directory, size: 0, time: 0, uid: uid, gid: gid)
        a.mode = (directory ? UInt32(S_IFDIR) : UInt32(S_IFREG)) | mode
        return a
    }

    func user(_ uid: UInt32, _ gid: UInt32 = 100, groups: [UInt32] = [], asked: Counter? = nil) -> Requester {
        Requester(uid: uid, gid: gid) {
            asked?.count += 1
            return groups
        }
    }

    final class Counter { var count = 0 }

    @Test func theFirstClassThatMatchesDecides() {
        // The owner is held to the owner's bits even where group and others have more.
        #expect(!Permissions.allows(node(0o077), .read, by: user(1000)))
        #expect(Permissions.allows(node(0o600), [.read, .write], by: user(1000)))
        #expect(!Permissions.allows(node(0o600), .execute, by: user(1000)))
        // A member of the file's group, by primary group or a supplementary one.
        #expect(Permissions.allows(node(0o640), .read, by: user(1001, 100)))
        #expect(!Permissions.allows(node(0o640), .write, by: user(1001, 100)))
        #expect(Permissions.allows(node(0o640, gid: 7), .read, by: user(1001, 100, groups: [7])))
        #expect(!Permissions.allows(node(0o604, gid: 7), .read, by: user(1001, 100, groups: [7])))
        // Everyone else.
        #expect(Permissions.allows(node(0o604, gid: 7), .read, by: user(1001)))
        #expect(!Permissions.allows(node(0o660, gid: 7), .read, by: user(1001)))
    }

    @Test func supplementaryGroupsAreReadOnlyWhenARuleNeedsThem() {
        let asked = Counter()
        _ = Permissions.allows(node(0o600), .read, by: user(1000, asked: asked))      // the owner
        _ = Permissions.allows(node(0o060), .read, by: user(1001, 100, asked: asked)) // primary group
        #expect(asked.count == 0)
        _ = Permissions.allows(node(0o060, gid: 7), .read, by: user(1001, 100, asked: asked))
        #expect(asked.count == 1)
        // One request asks /proc once, however many rules need its groups.
        let who = user(1001, 100, groups: [7], asked: asked)
        _ = try? Permissions.checked({ var c = FileSystem.AttributeChanges(); c.gid = 8; return c }(),
                                     of: node(0o2660, uid: 1001, gid: 9), throughHandle: false, by: who)
        _ = Permissions.allows(node(0o060, gid: 7), .read, by: who)
        #expect(asked.count == 2)
    }

    @Test func rootPassesExceptToExecuteAFileWithNoExecuteBit() {
        #expect(Permissions.allows(node(0o000), [.read, .write], by: user(0, 0)))
        #expect(Permissions.allows(node(0o000, directory: true), [.read, .write, .execute], by: user(0, 0)))
        #expect(!Permissions.allows(node(0o666), .execute, by: user(0, 0)))
        #expect(Permissions.allows(node(0o001), .execute, by: user(0, 0)))
    }

    @Test func openNeedsItsAccessModeWriteForTruncationAndExecuteAloneForExec() {
        #expect(Permissions.needed(forOpen: O_RDONLY) == .read)
        #expect(Permissions.needed(forOpen: O_WRONLY) == .write)
        #expect(Permissions.needed(forOpen: O_RDWR | O_APPEND) == [.read, .write])
        #expect(Permissions.needed(forOpen: O_RDONLY | O_TRUNC) == [.read, .write])
        #expect(Permissions.needed(forOpen: O_RDONLY | Permissions.fmodeExec) == .execute)
    }

    @Test func setattrRulesForOwnersGroupsModesAndTimes() throws {
        let file = node(0o2664, uid: 1000, gid: 100)
        func changes(_ edit: (inout FileSystem.AttributeChanges) -> Void) -> FileSystem.AttributeChanges {
            var c = FileSystem.AttributeChanges()
            edit(&c)
            return c
        }
        func outcome(_ c: FileSystem.AttributeChanges, by who: Requester, handle: Bool = false) -> Int32 {
            do { _ = try Permissions.checked(c, of: file, throughHandle: handle, by: who); return 0 } catch { return error.code }
        }
        let owner = user(1000, 100, groups: [7]), member = user(1001, 100), other = user(1002, 200)
        // chmod: the owner only; outside the file's group, set-group-ID goes.
        #expect(outcome(changes { $0.mode = 0o600 }, by: member) == EPERM)
        #expect(try Permissions.checked(changes { $0.mode = 0o2755 }, of: file, throughHandle: false, by: owner).mode == 0o2755)
        #expect(try Permissions.checked(changes { $0.mode = 0o2755 }, of: node(0o644, gid: 9), throughHandle: false, by: owner).mode == 0o755)
        // chown: to someone else, root only; to oneself, the owner may. chgrp: the owner, to
        // a group of theirs.
        #expect(outcome(changes { $0.uid = 1001 }, by: owner) == EPERM)
        #expect(outcome(changes { $0.uid = 1000 }, by: owner) == 0)
        #expect(outcome(changes { $0.gid = 7 }, by: owner) == 0)
        #expect(outcome(changes { $0.gid = 8 }, by: owner) == EPERM)
        #expect(outcome(changes { $0.gid = 100 }, by: member) == EPERM)
        #expect(outcome(changes { $0.uid = 5; $0.gid = 5; $0.mode = 0o7777 }, by: user(0, 0)) == 0)
        // Truncation by path needs write; through a handle, the open checked it.
        #expect(outcome(changes { $0.size = 0 }, by: member) == 0)
        #expect(outcome(changes { $0.size = 0 }, by: other) == EACCES)
        #expect(outcome(changes { $0.size = 0 }, by: other, handle: true) == 0)
        // Touch: the owner or a writer. A time given explicitly: the owner only.
        #expect(outcome(changes { $0.atime = .now; $0.mtime = .now }, by: member) == 0)
        #expect(outcome(changes { $0.atime = .now; $0.mtime = .now }, by: other) == EACCES)
        #expect(outcome(changes { $0.mtime = .at(5) }, by: member) == EPERM)
        #expect(outcome(changes { $0.mtime = .at(5) }, by: owner) == 0)
        // chown(f, -1, -1) sets nothing and needs nothing.
        #expect(outcome(FileSystem.AttributeChanges(), by: other) == 0)
    }

    @Test func aStickyDirectoryKeepsEntriesToTheirOwnersAndItsOwn() {
        let sticky = node(0o1777, uid: 1000, directory: true), open = node(0o777, uid: 1000, directory: true)
        let theirs = node(0o644, uid: 1001)
        #expect(!Permissions.mayRemove(theirs, from: sticky, by: user(1002)))
        #expect(Permissions.mayRemove(theirs, from: sticky, by: user(1001)))  // the entry's owner
        #expect(Permissions.mayRemove(theirs, from: sticky, by: user(1000)))  // the directory's
        #expect(Permissions.mayRemove(theirs, from: sticky, by: user(0, 0)))
        #expect(Permissions.mayRemove(theirs, from: open, by: user(1002)))
    }

    @Test func theDaemonChecksOnlyOnAMountOfItsOwnerOnAKernelThatCanExpireNames() {
        #expect(Permissions.daemonChecks(mountOptions: [], kernelRelease: "6.18.44-fc-v782"))
        #expect(Permissions.daemonChecks(mountOptions: ["allow_root"], kernelRelease: "6.16.0"))
        #expect(Permissions.daemonChecks(mountOptions: [], kernelRelease: "7.0-rc1"))
        #expect(!Permissions.daemonChecks(mountOptions: [], kernelRelease: "6.15.9"))
        #expect(!Permissions.daemonChecks(mountOptions: [], kernelRelease: "6.1.0-28-amd64"))
        #expect(!Permissions.daemonChecks(mountOptions: ["allow_other"], kernelRelease: "6.18.1"))
        #expect(!Permissions.daemonChecks(mountOptions: ["default_permissions"], kernelRelease: "6.18.1"))
        #expect(!Permissions.daemonChecks(mountOptions: [], kernelRelease: "weird"))
    }
}
