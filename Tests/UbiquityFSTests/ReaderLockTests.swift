import Glibc
import Synchronization
import Testing
import TestSupport
import UbiquitySystem
@testable import UbiquityFS
@testable import UbiquityStore

/// Readers never wait for writers: lookup, getattr, opendir, readdir(plus), readlink,
/// forget and statfs of the tree's working set take neither the filesystem's lock nor the
/// store's (`TreeCache`). Counted in lock acquisitions, and shown with the store's lock
/// held by another thread throughout.
@Suite struct ReaderLockTests {
    /// A directory of files looked up once, one of them open with writes not saved yet.
    struct Setup {
        let harness: Harness
        let directory: InodeNumber
        let files: [(name: String, ino: InodeNumber)]
        let open: HandleID
        let openIno: InodeNumber
        let link: InodeNumber
    }

    static func setUp() throws -> Setup {
        let h = try Harness()
        let d = try h.fs.mkdir(parent: Store.rootInode, name: "d", mode: 0o755, caller: h.me).ino
        var files: [(String, InodeNumber)] = []
        for i in 0..<10 { files.append(("f\(i)", try h.save("f\(i)", String(repeating: "x", count: i + 1), in: d))) }
        let openIno = files[3].1
        let link = try h.fs.symlink(target: "f0", parent: d, name: "link", caller: h.me).ino
        let handle = try h.fs.open(openIno, flags: OpenFlags(O_WRONLY))
        _ = try Array("written, not saved".utf8).withUnsafeBytes { try h.fs.write(handle, offset: 0, data: $0) }
        // A remount's first lookups load the directory and its inodes.
        for (name, _) in files { _ = try h.fs.lookup(parent: d, name: name) }
        return Setup(harness: h, directory: d, files: files, open: handle, openIno: openIno, link: link)
    }

    /// What a reader does; checks each answer.
    static func read(_ s: Setup) throws {
        let fs = s.harness.fs!
        for (name, ino) in s.files {
            let looked = try fs.lookup(parent: s.directory, name: name)
            #expect(looked.ino == ino)
            let size = ino == s.openIno ? Int64("written, not saved".utf8.count) : Int64(Int(name.dropFirst())! + 1)
            #expect(looked.size == size, "\(name): the open file's live size, the others' saved")
            #expect(try fs.getattr(ino).size == size)
        }
        #expect(try fs.lookupOrAbsence(parent: s.directory, name: "never-made") == nil, "an absence the kernel may keep")
        let handle = try fs.opendir(s.directory)
        let listed = try fs.readdir(handle)
        fs.releasedir(handle)
        let expected = (s.files + [("link", s.link)]).sorted { $0.0 < $1.0 }
        #expect(listed.map(\.name) == expected.map(\.0))
        #expect(listed.map(\.attributes.ino) == expected.map(\.1))
        #expect(listed.first { $0.name == "f3" }?.attributes.size == Int64("written, not saved".utf8.count))
        fs.noteLookups(listed.map(\.attributes.ino))
        _ = try fs.getattr(s.directory)
        #expect(try fs.readlink(s.link) == "f0")
        _ = try fs.statfs()
    }

    @Test func lookupGetattrReaddirAndStatfsOfTheWorkingSetTakeNeitherLock() throws {
        let s = try Self.setUp()
        let fs = s.harness.fs!
        _ = try fs.statfs() // the first counts the inodes in SQLite
        let (store, state) = (fs.store.acquisitions, fs.state.acquisitionCount)
        for _ in 0..<100 { try Self.read(s) }
        #expect(fs.store.acquisitions == store, "acquisitions of the store's lock by 100 rounds of reads")
        #expect(fs.state.acquisitionCount == state, "acquisitions of the filesystem's lock by 100 rounds of reads")
        // Each lookup gave the kernel a reference: a forget of them all takes no lock either.
        for (_, ino) in s.files { fs.forget(ino, count: 200) }
        #expect(fs.store.acquisitions == store && fs.state.acquisitionCount == state, "forgets")
        try fs.release(s.open)
    }

    /// The store's lock is held by another thread (as a sync slice or a fold's bookkeeping
    /// holds it) until the reads are done, or for a minute: reads that needed it would
    /// wait for the minute, and the holder would find itself let go by the deadline.
    @Test func readsGoOnWhileAnotherThreadHoldsTheStoreLock() throws {
        let s = try Self.setUp()
        let fs = s.harness.fs!
        _ = try fs.statfs()
        let finishedUnderTheLock = try Self.whileAnotherThreadHoldsTheStoresLock(fs) { () throws in try Self.read(s) }
        #expect(finishedUnderTheLock, "the reads finished while the store's lock was held")
        try fs.release(s.open)
    }

    /// Runs `work` while another thread holds the store's lock, until `work` is done or
    /// for a minute; returns whether `work` was done before the holder let go.
    static func whileAnotherThreadHoldsTheStoresLock(_ fs: FileSystem, _ work: () throws -> Void) throws -> Bool {
        let held = Atomic<Bool>(false), done = Atomic<Bool>(false), releasedByWork = Atomic<Bool>(false)
        let holder = JoinableThread {
            fs.store.withLock { _ in
                held.store(true, ordering: .sequentiallyConsistent)
                for _ in 0..<60_000 where !done.load(ordering: .sequentiallyConsistent) { usleep(1000) }
                releasedByWork.store(done.load(ordering: .sequentiallyConsistent), ordering: .sequentiallyConsistent)
            }
        }
        while !held.load(ordering: .sequentiallyConsistent) { usleep(100) }
        var failure: (any Error)?
        do { try work() } catch { failure = error }
        done.store(true, ordering: .sequentiallyConsistent)
        holder.join()
        if let failure { throw failure }
        return releasedByWork.load(ordering: .sequentiallyConsistent)
    }

    /// Readers on other threads while a writer renames one file back and forth and
    /// rewrites another: every answer is a state the tree was in (the one inode under one
    /// of its two names; the other file's size one it had, 0 while a save truncates), and
    /// no lock is taken out of order (debug builds trap).
    @Test func readersDuringRenamesSeeOnlyStatesTheTreeWasIn() throws {
        let s = try Self.setUp()
        let fs = s.harness.fs!
        let (name, ino) = s.files[0]
        let other = s.files[1].ino
        let directory = s.directory
        let stop = Atomic<Bool>(false), wrong = Atomic<Int>(0), found = Atomic<Int>(0)
        let readers = (0..<2).map { _ in
            JoinableThread {
                while !stop.load(ordering: .relaxed) {
                    for candidate in [name, "renamed"] {
                        guard let a = try? fs.lookupOrAbsence(parent: directory, name: candidate) else { continue }
                        found.add(1, ordering: .relaxed)
                        if a.ino != ino { wrong.add(1, ordering: .relaxed) }
                        fs.forget(a.ino, count: 1)
                    }
                    if let size = try? fs.getattr(other).size, ![0, 2, 5].contains(size) { wrong.add(1, ordering: .relaxed) }
                }
            }
        }
        for round in 0..<1_000 {
            try fs.rename(parent: s.directory, name: round % 2 == 0 ? name : "renamed", newParent: s.directory,
                          newName: round % 2 == 0 ? "renamed" : name, flags: 0)
            _ = try s.harness.save(s.files[1].name, round % 2 == 0 ? "fives" : "ff", in: s.directory)
        }
        stop.store(true, ordering: .relaxed)
        for reader in readers { reader.join() }
        #expect(wrong.load(ordering: .relaxed) == 0)
        #expect(found.load(ordering: .relaxed) > 0)
        try fs.release(s.open)
    }

    /// A name sync removes is gone from the working set when the change is: a lookup
    /// after it misses, and a lookup before it counted its reference first, so the inode
    /// stays until the kernel forgets it.
    @Test func aLookupCountedBeforeAnUnlinkKeepsTheInode() throws {
        let s = try Self.setUp()
        let fs = s.harness.fs!
        let (name, ino) = s.files[5]
        _ = try fs.lookup(parent: s.directory, name: name)
        try fs.unlink(parent: s.directory, name: name)
        #expect(try fs.lookupOrAbsence(parent: s.directory, name: name) == nil)
        #expect(try fs.getattr(ino).nlink == 0, "unlinked, still known to the kernel")
        fs.forget(ino, count: 3) // setUp's lookup, save's lookup and this one
        #expect(throws: Errno.notFound) { try fs.getattr(ino) }
        try fs.release(s.open)
    }
}
