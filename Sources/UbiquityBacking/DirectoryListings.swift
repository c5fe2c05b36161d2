import Glibc
import UbiquitySystem

/// The names in the directories a `DirectoryStore` lists, kept by inotify instead of read
/// again at every LIST. A device polls the log every 0.5 s while anything is active, and
/// `log/` holds every segment of the last day (thousands after a big import): reading and
/// filtering all its names at every poll would take a large share of a mount's CPU. Kept
/// listings cost the names that changed since the last LIST.
///
/// Only for a directory on a filesystem where inotify sees every change
/// (`changesAreAllLocal`, asked of each directory: a local disk, not NFS, SMB or sshfs,
/// where another machine writes without an event); any other is read at every LIST. A
/// listing is the directory read once, through the descriptor its watch was added by;
/// each event since names a name whose presence is then looked up in that directory
/// (fstatat), so the names events touched are as the directory holds them now, whatever
/// order or kind the events were (a rename that exchanges two names sends four moves). A
/// lost event queue (overflow), a directory removed or moved, or another directory found
/// at the path (one above it moved) drops the listings concerned: they are read again.
final class DirectoryListings: @unchecked Sendable {
    /// Directories watched at most; others are read at every LIST.
    static let maxWatched = 64

    private struct Listing {
        let path: String
        /// The directory read, open: events' names are looked up in it, and the path is
        /// checked to still name it at every use.
        let directory: Int32
        let identity: Identity
        /// In byte order (as keys sort).
        var names: [String]

        /// `name` listed when the directory holds it now (any answer but "not there"
        /// counts as there: a name too many is skipped by the LIST's lstat).
        mutating func settle(_ name: String) {
            var st = stat()
            let present = fstatat(directory, name, &st, AT_SYMLINK_NOFOLLOW) == 0 || (errno != ENOENT && errno != ENOTDIR)
            let at = DirectoryListings.firstNotBefore(name.utf8, in: names)
            let found = at < names.count && names[at].utf8.elementsEqual(name.utf8)
            if present && !found { names.insert(name, at: at) }
            if !present && found { names.remove(at: at) }
        }
    }

    struct Identity: Equatable {
        let device: UInt64
        let inode: UInt64

        init?(path: String) {
            var st = stat()
            guard stat(path, &st) == 0 else { return nil }
            self.init(st)
        }

        init?(fd: Int32) {
            var st = stat()
            guard fstat(fd, &st) == 0 else { return nil }
            self.init(st)
        }

        private init?(_ st: stat) {
            guard st.st_mode & S_IFMT == S_IFDIR else { return nil }
            device = UInt64(st.st_dev)
            inode = UInt64(st.st_ino)
        }
    }

    private struct State {
        /// The inotify descriptor: nil until the first LIST, -1 where there is none.
        var fd: Int32?
        var listings: [Int32: Listing] = [:]
        var watches: [String: Int32] = [:]
        /// Directories found on a filesystem whose changes inotify may not see: read at
        /// every LIST without trying again (an NFS poll pays no extra stat, open, fstatfs).
        var unwatchable: Set<String> = []
        /// Directories read whole (for the tests: a kept listing reads none).
        var reads = 0
    }

    private let state = Locked(State())

    init() {}

    deinit {
        state.withLock { s in
            for listing in s.listings.values { close(listing.directory) }
            if let fd = s.fd, fd >= 0 { close(fd) }
        }
    }

    /// Directories read whole so far.
    var reads: Int { state.withLock { $0.reads } }

    /// The index of the first of `names` (in byte order) that does not sort before `key`.
    static func firstNotBefore(_ key: some Collection<UInt8>, in names: [String]) -> Int {
        var low = 0, high = names.count
        while low < high {
            let mid = (low + high) / 2
            if names[mid].utf8.lexicographicallyPrecedes(key) { low = mid + 1 } else { high = mid }
        }
        return low
    }

    /// The names in directory `path` (no `.` and `..`); `sorted` says whether they are in
    /// byte order (a kept listing) or as the directory gave them.
    func names(_ path: String) throws(SystemError) -> (names: [String], sorted: Bool) {
        // What the path names now, before the events are taken in: a listing of another
        // directory is not used.
        if state.withLock({ $0.fd != -1 && !$0.unwatchable.contains(path) }) {
            let here = Identity(path: path)
            if let kept = state.withLock({ s in Self.kept(path, here, &s) }) { return (kept, true) }
        }
        // Not kept: read here, outside the lock (a slow disk holds no other LIST).
        state.withLock { $0.reads += 1 }
        return (try directoryEntries(path), false)
    }

    /// The kept listing of `path`, made now if it can be.
    private static func kept(_ path: String, _ here: Identity?, _ s: inout State) -> [String]? {
        if s.fd == nil { s.fd = max(-1, inotify_init1(Int32(IN_NONBLOCK | IN_CLOEXEC))) }
        guard let fd = s.fd, fd >= 0 else { return nil }
        drain(fd, &s)
        if let wd = s.watches[path] {
            if let listing = s.listings[wd], here != nil, listing.identity == here { return listing.names }
            forget(wd, &s) // another directory at this path now (it, or one above it, moved)
        }
        guard s.watches.count < maxWatched else { return nil }
        // The watch, the identity and the read all through one descriptor: the same
        // directory, whatever happens to the path meanwhile.
        let directory = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard directory >= 0 else { return nil }
        guard let identity = Identity(fd: directory), changesAreAllLocal(fd: directory) else {
            close(directory)
            if s.unwatchable.count < 4 * maxWatched { s.unwatchable.insert(path) }
            return nil
        }
        let mask = UInt32(IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR)
        let wd = inotify_add_watch(fd, "/proc/self/fd/\(directory)", mask)
        guard wd >= 0 else {
            close(directory)
            return nil
        }
        // Read after the watch is there: every change from here on is an event.
        s.reads += 1
        guard let names = try? directoryEntries(fd: directory) else {
            inotify_rm_watch(fd, wd)
            close(directory)
            return nil
        }
        // The same directory reached by another path: one watch, one listing.
        if s.listings[wd] != nil { forget(wd, removingWatch: false, &s) }
        s.watches[path] = wd
        s.listings[wd] = Listing(path: path, directory: directory, identity: identity,
                                 names: names.sorted { $0.utf8.lexicographicallyPrecedes($1.utf8) })
        drain(fd, &s)
        return s.listings[wd]?.names
    }

    /// Drops a listing, its descriptor and its watch.
    private static func forget(_ wd: Int32, removingWatch: Bool = true, _ s: inout State) {
        for (path, w) in s.watches where w == wd { s.watches[path] = nil }
        if removingWatch, let fd = s.fd { inotify_rm_watch(fd, wd) }
        if let listing = s.listings.removeValue(forKey: wd) { close(listing.directory) }
    }

    /// Applies every queued event to the listings.
    private static func drain(_ fd: Int32, _ s: inout State) {
        // On the stack, not zeroed: a poll with no events costs one read(2).
        withUnsafeTemporaryAllocation(byteCount: 16 << 10, alignment: 8) { buffer in
            while true {
                let n = read(fd, buffer.baseAddress, buffer.count)
                if n < 0 && errno == EINTR { continue }
                guard n > 0 else { return } // EAGAIN: nothing more
                apply(UnsafeRawBufferPointer(rebasing: buffer[..<n]), &s)
            }
        }
    }

    /// Events as the kernel writes them: wd, mask, cookie and name length (4 bytes each,
    /// in this machine's byte order), then the name padded with NULs. Every length is
    /// checked against the bytes read.
    static func events(_ raw: UnsafeRawBufferPointer) -> [(wd: Int32, mask: UInt32, name: String)] {
        var result: [(Int32, UInt32, String)] = []
        var at = 0
        while raw.count - at >= 16 {
            let wd = raw.loadUnaligned(fromByteOffset: at, as: Int32.self)
            let mask = raw.loadUnaligned(fromByteOffset: at + 4, as: UInt32.self)
            let length = Int(raw.loadUnaligned(fromByteOffset: at + 12, as: UInt32.self))
            guard length <= raw.count - at - 16 else { break }
            let name = raw[(at + 16)..<(at + 16 + length)].prefix { $0 != 0 }
            result.append((wd, mask, String(decoding: name, as: UTF8.self)))
            at += 16 + length
        }
        return result
    }

    private static func apply(_ bytes: UnsafeRawBufferPointer, _ s: inout State) {
        for event in events(bytes) {
            if event.mask & UInt32(IN_Q_OVERFLOW) != 0 {
                // Events were lost: nothing kept can be trusted.
                for wd in Array(s.listings.keys) { forget(wd, &s) }
                continue
            }
            guard s.listings[event.wd] != nil else { continue }
            if event.mask & UInt32(IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF | IN_UNMOUNT) != 0 {
                forget(event.wd, removingWatch: event.mask & UInt32(IN_IGNORED) == 0, &s)
            } else if event.mask & UInt32(IN_CREATE | IN_MOVED_TO | IN_DELETE | IN_MOVED_FROM) != 0, !event.name.isEmpty {
                s.listings[event.wd]!.settle(event.name)
            }
        }
    }
}
