import Glibc
import Synchronization
import UbiquitySystem

/// The hand-off of the store's SQLite connection (`SQLiteDatabase.loan`) to the group
/// commit's folder, which writes a fold with it outside the store's lock
/// (Store+BackgroundFold), and back. Thread-safe: any thread may ask whether the
/// connection is lent and wait until it is back.
final class ConnectionLoan: @unchecked Sendable {
    /// The thread the connection is lent to (0: none).
    private let borrower = Atomic<UInt>(0)
    /// Held by the borrower for as long as the loan lasts: a wait for the connection waits
    /// on it (rank `connection` in the lock order).
    private let handOff: UnsafeMutablePointer<pthread_mutex_t> = {
        let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
        pthread_mutex_init(mutex, nil)
        return mutex
    }()

    deinit {
        pthread_mutex_destroy(handOff)
        handOff.deallocate()
    }

    private static var thisThread: UInt { UInt(pthread_self()) }

    /// Lends the connection to the calling thread until `giveBack` (the folder, under the
    /// store's lock: no one else uses the connection then).
    func lend() {
        LockRank.connection.acquiredHeld()
        pthread_mutex_lock(handOff)
        borrower.store(Self.thisThread, ordering: .releasing)
    }

    /// Ends the loan (the borrower, when it is done with the connection).
    func giveBack() {
        borrower.store(0, ordering: .releasing)
        pthread_mutex_unlock(handOff)
        LockRank.connection.releasedHeld()
    }

    /// Whether the connection is lent to another thread than the caller.
    var isLentElsewhere: Bool {
        let holder = borrower.load(ordering: .acquiring)
        return holder != 0 && holder != Self.thisThread
    }

    /// Whether the calling thread is the borrower.
    var isBorrowedHere: Bool { borrower.load(ordering: .acquiring) == Self.thisThread }

    /// Waits until a loan to another thread, if any, ends: from any thread, with or
    /// without the store's lock (one about to take the lock and use the connection waits
    /// here, so as not to hold the lock against requests while it waits).
    func awaitEnd() {
        guard isLentElsewhere else { return }
        LockRank.connection.checkMayWait()
        pthread_mutex_lock(handOff)
        pthread_mutex_unlock(handOff)
    }
}
