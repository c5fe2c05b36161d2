import UbiquityStore
import UbiquitySystem

/// The files some process has open, by inode: one `OpenFile` each. A leaf lock of its own
/// (the entries' other fields stay under the filesystem's lock): getattr and lookup read
/// an open file's live size without the filesystem's lock.
final class OpenFileTable: Sendable {
    private let table = Locked<[InodeNumber: OpenFile]>([:], rank: .leaf)

    subscript(ino: InodeNumber) -> OpenFile? {
        get { table.withLock { $0[ino] } }
        set { table.withLock { $0[ino] = newValue } }
    }

    var all: [(InodeNumber, OpenFile)] { table.withLock { t in t.map { ($0.key, $0.value) } } }
}
