import Glibc
import UbiquitySystem

/// The names in the directories a `DirectoryStore` lists, kept by inotify instead of read
/// again at every LIST. A device polls the log every 0.5 s while anything is active, and
/// `log/` holds every segment of the last day (thousands after a big import: 2,051 after
/// a million files went up): reading and filtering all its names was 44 % of a mount's CPU
/// while a file was saved every half second (perf, 1,000,000-file container). Kept
/// listings cost the names that changed since the last LIST.
///
/// Only where inotify sees every change (`changesAreAllLocal`: a local disk, not NFS, SMB
/// or sshfs, where another machine writes without an event): there every LIST reads the
/// directory as before. A listing is the directory read once after its watch was added,
/// with every event since applied in order (create and moved-to add a name, delete and
/// moved-from remove it); applying an event the read already saw changes nothing, so the
/// result is the directory as it is now. A lost event queue (overflow) or a directory
/// removed or moved drops the listings concerned: they are read again.
final class DirectoryListings: @unchecked Sendable {
    /// Directories watched at most; others are read at every LIST.
    static let maxWatched = 64

    private struct Listing {
        let path: String
        /// The directory that was read: the path is checked to still name it at every use
        /// (a directory above it moved or replaced sends no event here).
        let identity: Identity
        /// In byte order (as keys sort); an event inserts or removes one in place.
        var names: [String]

        /// Where `name` is or would go.
        func index(of name: String) -> (at: Int, found: Bool) {
            let at = DirectoryListings.firstNotBefore(name.utf8, in: names)
            return (at, at < names.count && names[at].utf8.elementsEqual(name.utf8))
        }

        mutating func insert(_ name: String) {
            let (at, found) = index(of: name)
            if !found { names.insert(name, at: at) }
        }

        mutating func remove(_ name: String) {
            let (at, found) = index(of: name)
            if found { names.remove(at: at) }
        }
    }

    struct Identity: Equatable {
        let device: UInt64
        let inode: UInt64

        init?(_ path: String) {
            var st = stat()
            guard stat(path, &st) == 0, st.st_mode & S_IFMT == S_IFDIR else { return nil }
            device = UInt64(st.st_dev)
            inode = UInt64(st.st_ino)
        }
    }

    private struct State {
        /// The inotify descriptor: nil until the first LIST, -1 where not used.
        var fd: Int32?
        var listings: [Int32: Listing] = [:]
        var watches: [String: Int32] = [:]
        /// Directories read whole (for the tests: a kept listing reads none).
        var reads = 0
    }

    private let root: String
    private let state = Locked(State())

    init(root: String) { self.root = root }

    /// The index of the first of `names` (in byte order) that does not sort before `key`.
    static func firstNotBefore(_ key: some Collection<UInt8>, in names: [String]) -> Int {
        var low = 0, high = names.count
        while low < high {
            let mid = (low + high) / 2
            if names[mid].utf8.lexicographicallyPrecedes(key) { low = mid + 1 } else { high = mid }
        }
        return low
    }

    /// Directories read whole so far.
    var reads: Int { state.withLock { $0.reads } }

    deinit {
        state.withLock { s in
            if let fd = s.fd, fd >= 0 { close(fd) }
        }
    }

    /// The names in directory `path` (no `.` and `..`); `sorted` says whether they are in
    /// byte order (a kept listing) or as the directory gave them (`read`).
    func names(_ path: String) throws(SystemError) -> (names: [String], sorted: Bool) {
        try state.withLock { (s) throws(SystemError) -> ([String], Bool) in
            func read() throws(SystemError) -> [String] {
                s.reads += 1
                return try directoryEntries(path)
            }
            if s.fd == nil {
                s.fd = changesAreAllLocal(root) ? inotify_init1(Int32(IN_NONBLOCK | IN_CLOEXEC)) : -1
            }
            guard let fd = s.fd, fd >= 0 else { return (try read(), false) }
            Self.drain(fd, &s)
            let here = Identity(path)
            if let wd = s.watches[path] {
                if let listing = s.listings[wd], here != nil, listing.identity == here { return (listing.names, true) }
                // Another directory at this path now (it, or one above it, was moved or replaced).
                Self.forget(wd, &s)
            }
            guard let here, s.watches.count < Self.maxWatched else { return (try read(), false) }
            let mask = UInt32(IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR)
            let wd = inotify_add_watch(fd, path, mask)
            guard wd >= 0 else { return (try read(), false) }
            // Read after the watch is there: every change from here on is an event.
            let names: [String]
            do throws(SystemError) { names = try read() } catch {
                inotify_rm_watch(fd, wd)
                throw error
            }
            // Replaced while it was being watched and read: not kept.
            guard Identity(path) == here else {
                inotify_rm_watch(fd, wd)
                return (names, false)
            }
            s.watches[path] = wd
            s.listings[wd] = Listing(path: path, identity: here, names: names.sorted { $0.utf8.lexicographicallyPrecedes($1.utf8) })
            Self.drain(fd, &s)
            guard let listing = s.listings[wd] else { return (names, false) } // removed meanwhile
            return (listing.names, true)
        }
    }

    /// Drops a listing and its watch.
    private static func forget(_ wd: Int32, removingWatch: Bool = true, _ s: inout State) {
        for (path, w) in s.watches where w == wd { s.watches[path] = nil }
        if removingWatch, let fd = s.fd { inotify_rm_watch(fd, wd) }
        s.listings[wd] = nil
    }

    /// Applies every queued event to the listings.
    private static func drain(_ fd: Int32, _ s: inout State) {
        var buffer = [UInt8](repeating: 0, count: 64 << 10)
        while true {
            let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { return } // EAGAIN: nothing more
            apply(buffer[..<n], &s)
        }
    }

    /// Events as the kernel writes them: wd (4 bytes), mask (4), cookie (4), name length
    /// (4), the name padded with NULs. Every length is checked against the bytes read.
    static func events(_ bytes: ArraySlice<UInt8>) -> [(wd: Int32, mask: UInt32, name: String)] {
        var result: [(Int32, UInt32, String)] = []
        var at = bytes.startIndex
        func word(_ i: Int) -> UInt32 {
            UInt32(bytes[i]) | UInt32(bytes[i + 1]) << 8 | UInt32(bytes[i + 2]) << 16 | UInt32(bytes[i + 3]) << 24
        }
        while bytes.endIndex - at >= 16 {
            let wd = Int32(bitPattern: word(at)), mask = word(at + 4), length = Int(word(at + 12))
            guard length <= bytes.endIndex - at - 16 else { break }
            let nameBytes = bytes[(at + 16)..<(at + 16 + length)].prefix { $0 != 0 }
            result.append((wd, mask, String(decoding: nameBytes, as: UTF8.self)))
            at += 16 + length
        }
        return result
    }

    private static func apply(_ bytes: ArraySlice<UInt8>, _ s: inout State) {
        for event in events(bytes) {
            if event.mask & UInt32(IN_Q_OVERFLOW) != 0 {
                // Events were lost: nothing kept can be trusted.
                if let fd = s.fd { for wd in s.listings.keys { inotify_rm_watch(fd, wd) } }
                s.listings = [:]
                s.watches = [:]
                continue
            }
            guard s.listings[event.wd] != nil else { continue }
            if event.mask & UInt32(IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF | IN_UNMOUNT) != 0 {
                forget(event.wd, removingWatch: event.mask & UInt32(IN_IGNORED) == 0, &s)
            } else if event.mask & UInt32(IN_CREATE | IN_MOVED_TO) != 0 {
                s.listings[event.wd]!.insert(event.name)
            } else if event.mask & UInt32(IN_DELETE | IN_MOVED_FROM) != 0 {
                s.listings[event.wd]!.remove(event.name)
            }
        }
    }
}
