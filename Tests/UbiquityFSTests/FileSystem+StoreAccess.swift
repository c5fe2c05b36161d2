@testable import UbiquityFS
import UbiquityStore

extension FileSystem {
    /// `meta`'s two locks with the store as the `Store` it is: tests look past what the
    /// filesystem may do to it (`FileSystemStore`) at the store's insides.
    func withMetaLock<R, E: Error>(_ body: (inout Meta, Store) throws(E) -> R) throws(E) -> R {
        try meta.withLock { (m, store) throws(E) -> R in try body(&m, store as! Store) }
    }
}
