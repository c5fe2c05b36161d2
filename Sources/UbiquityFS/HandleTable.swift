import UbiquitySystem

/// The open handles (files, views, directories, key files) by the number the kernel
/// holds, under a lock of their own: a leaf, so a read's or write's lookup never waits for
/// the filesystem's lock (`state`), which a metadata operation holds across SQLite work and
/// while it waits for the store's lock behind a sync step.
final class HandleTable: Sendable {
    private struct Table {
        var next: UInt64 = 1
        var handles: [UInt64: Handle] = [:]
    }
    private let table = Locked(Table())

    /// Adds `handle` under a new number.
    func register(_ handle: Handle) -> UInt64 {
        table.withLock { t in
            let id = t.next
            t.next += 1
            t.handles[id] = handle
            return id
        }
    }

    subscript(id: UInt64) -> Handle? {
        get { table.withLock { $0.handles[id] } }
        set { table.withLock { $0.handles[id] = newValue } }
    }

    func removeValue(forKey id: UInt64) -> Handle? { table.withLock { $0.handles.removeValue(forKey: id) } }

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
