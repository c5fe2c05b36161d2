import Glibc
import Synchronization
import UbiquitySystem

/// The index's lock (`Index`): who uses its SQLite connection. The store's lock holder
/// uses it whenever no other thread holds this lock; the group commit's folder (and a
/// durability barrier's commit) holds it from the step under the store's lock that lends
/// it (`Index.lend`) until it is done with the connection, without the store's lock
/// (Store+BackgroundFold). Thread-safe: any thread may ask whether the lock is held
/// elsewhere and wait until it is not.
final class IndexLock: @unchecked Sendable {
    /// The thread holding the lock (0: none, or the store's holder).
    private let holder = Atomic<UInt>(0)
    /// Held by the holder for as long as it has the connection: a wait for the connection
    /// waits on it (rank `index` in the lock order).
    private let mutex: UnsafeMutablePointer<pthread_mutex_t> = {
        let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
        pthread_mutex_init(mutex, nil)
        return mutex
    }()

    deinit {
        pthread_mutex_destroy(mutex)
        mutex.deallocate()
    }

    private static var thisThread: UInt { UInt(pthread_self()) }

    /// Takes the lock for the calling thread until `giveBack` (the folder, under the
    /// store's lock: no one else uses the connection then).
    func lend() {
        LockRank.index.acquiring()
        pthread_mutex_lock(mutex)
        holder.store(Self.thisThread, ordering: .releasing)
    }

    /// Lets the lock go (its holder, when it is done with the connection).
    func giveBack() {
        holder.store(0, ordering: .releasing)
        pthread_mutex_unlock(mutex)
        LockRank.index.released()
    }

    /// Whether another thread than the caller holds the lock.
    var isLentElsewhere: Bool {
        let holder = holder.load(ordering: .acquiring)
        return holder != 0 && holder != Self.thisThread
    }

    /// Whether the calling thread holds the lock.
    var isBorrowedHere: Bool { holder.load(ordering: .acquiring) == Self.thisThread }

    /// Whether any thread holds the lock.
    var isLent: Bool { holder.load(ordering: .acquiring) != 0 }

    /// Waits until another thread that holds the lock, if any, lets it go: the store's
    /// holder that needs the connection (`SQLiteDatabase.claim`).
    func awaitEnd() {
        guard isLentElsewhere else { return }
        LockRank.index.checkMayWait()
        pthread_mutex_lock(mutex)
        pthread_mutex_unlock(mutex)
    }
}
