import UbiquitySystem

/// The number of an open handle: what the kernel keeps in `fuse_file_info.fh` and hands
/// back with every read, write and release. A type of its own, so that it cannot be
/// passed for an inode number, a size or an offset. Made by the table's counter;
/// `rawValue` is read only where the FUSE layer hands the number to the kernel.
public struct HandleID: Hashable, Sendable {
    public let rawValue: UInt64
    public init(rawValue: UInt64) { self.rawValue = rawValue }
}

/// The open handles (files, views, directories, key files) by the number the kernel
/// holds, under a lock of their own: a leaf, so a read's or write's lookup never waits for
/// the filesystem's lock (`state`), which a metadata operation holds across SQLite work and
/// while it waits for the store's lock behind a sync step.
final class HandleTable: Sendable {
    private struct Table {
        var next: UInt64 = 1
        var handles: [HandleID: Handle] = [:]
    }
    private let table = Locked(Table(), rank: .leaf)

    /// Adds `handle` under a new number.
    func register(_ handle: Handle) -> HandleID {
        table.withLock { t in
            let id = HandleID(rawValue: t.next)
            t.next += 1
            t.handles[id] = handle
            return id
        }
    }

    subscript(id: HandleID) -> Handle? {
        get { table.withLock { $0.handles[id] } }
        set { table.withLock { $0.handles[id] = newValue } }
    }

    func removeValue(forKey id: HandleID) -> Handle? { table.withLock { $0.handles.removeValue(forKey: id) } }

    /// Every handle now (a snapshot: the scans of open key files and contents).
    var values: [Handle] { table.withLock { Array($0.handles.values) } }

    /// Points every handle of the open file `old` at `fresh` (sync replaced its version).
    func replace(_ old: OpenFile, with fresh: OpenFile) {
        table.withLock { t in
            for (id, handle) in t.handles {
                if case .file(let ino, let open, let writable) = handle, open === old {
                    t.handles[id] = .file(ino: ino, open: fresh, writable: writable)
                }
            }
        }
    }
}
