import Glibc
import UbiquitySystem

/// The disk space fallocate promised (`STORE/reservation`): one file, grown with
/// fallocate by what each reservation adds and shrunk as the reserved holes are
/// written, truncated, punched or unlinked. While the space is in this file nobody else
/// can take it, so a write into a reserved range finds it free: its share is given back
/// (`settle`) before its bytes land. `df` shows the file's blocks as used, as it shows
/// ext4's unwritten extents.
///
/// What is promised is each file's reserved holes (`FileContent.reservedHoleBytes`),
/// counted per inode here. The file itself is not trusted after a crash: the mount
/// counts the promise again from the `reserves` table and sizes the file to it (`start`).
///
/// A file's holes are not all it needs: its chunks land in packs with a header each, and
/// its save writes metadata (an operation log frame, SQLite pages, an intent record). So
/// each file with a promise holds `need(level)`: its holes, 1/256 more, and 64 KiB.
///
/// A write's share is not given back at once: the file keeps it until the writes since
/// owe `slack` (1 MiB), so writes into a reserved range truncate it once per MiB, not
/// once per write; a write the disk refuses (ENOSPC) pays what is owed and is tried
/// again (`payDebt`), so on a full disk the bytes come from the promise. Truncate,
/// punch, unlink and the end of a file's promise give back at once.
///
/// Only holes are promised: a write over bytes written before needs new space in any
/// case, as every save is kept as a version (copy-on-write filesystems promise no more).
public final class SpaceReservation: Sendable {
    public let path: String
    static let slack: Int64 = 1 << 20

    /// What a file whose reserved holes are `level` bytes holds.
    static func need(_ level: Int64) -> Int64 {
        level <= 0 ? 0 : level.addingClamped(level / 256).addingClamped(64 << 10)
    }

    private struct State {
        var fd: Int32 = -1
        /// Reserved holes per inode, and the sum of their `need`.
        var levels: [InodeNumber: Int64] = [:]
        var promised: Int64 = 0
        /// The file's size: the bytes it holds on disk.
        var held: Int64 = 0
        /// Whether a failed growth was logged (once until one succeeds).
        var shortLogged = false
    }
    private let state: Locked<State>

    init(directory: String) {
        path = directory + "/reservation"
        state = Locked(State(), rank: .leaf)
    }

    deinit { state.withLock { if $0.fd >= 0 { close($0.fd) } } }

    /// The bytes promised (counted in the store's size, as the file is in it).
    public var bytes: Int64 { state.withLock { $0.promised } }
    /// `id`'s reserved holes as last told.
    public func level(_ id: InodeNumber) -> Int64 { state.withLock { $0.levels[id] ?? 0 } }
    /// The bytes the file holds now (tests; at most `slack` more than `bytes`).
    public var heldBytes: Int64 { state.withLock { $0.held } }

    /// At mount: the promise is `levels` (per inode, counted from the store); the file is
    /// cut or grown to it. A growth that does not fit (the disk filled while the promise
    /// was not held: a crash after a write drew bytes it never wrote) is logged, and the
    /// promise stands: the next writes draw from what the file holds.
    public func start(levels: [InodeNumber: Int64]) throws(StoreError) {
        try state.withLock { (s) throws(StoreError) in
            try open(&s)
            s.levels = levels.filter { $0.value > 0 }
            s.promised = s.levels.values.reduce(0) { $0.addingClamped(Self.need($1)) }
            var st = stat()
            s.held = fstat(s.fd, &st) == 0 ? max(Int64(st.st_size), 0) : 0
            if s.held > s.promised { cut(&s, to: s.promised) }
            grow(&s)
        }
    }

    /// fallocate promises `bytes` more for `id`: the file grows by them now, or the call
    /// fails with ENOSPC and nothing is promised.
    public func setAside(_ id: InodeNumber, _ bytes: Int64) throws(StoreError) {
        guard bytes > 0 else { return }
        try state.withLock { (s) throws(StoreError) in
            try open(&s)
            let old = s.levels[id] ?? 0
            let added = Self.need(old.addingClamped(bytes)) - Self.need(old)
            let need = s.promised.addingClamped(added) - s.held
            if need > 0 {
                // posix_fallocate: where the filesystem cannot reserve, glibc writes zeros.
                let code = posix_fallocate(s.fd, off_t(s.held), off_t(need))
                guard code == 0 else {
                    // A failed call may have allocated part of the range past the size.
                    _ = ftruncate(s.fd, off_t(s.held))
                    throw .io(errno: code, "setting aside \(bytes) bytes in \(path)")
                }
                s.held += need
            }
            s.levels[id] = old.addingClamped(bytes)
            s.promised += added
        }
    }

    /// `id`'s reserved holes are `level` now. Less: its share is given back, at once unless
    /// `drawn` (a write filled them: see above). More (changes discarded, a failed write):
    /// the file grows back if the disk has room, and the shortfall is logged otherwise.
    public func settle(_ id: InodeNumber, level: Int64, drawn: Bool = false) {
        state.withLock { s in
            let old = s.levels[id] ?? 0
            let new = max(level, 0)
            guard new != old else { return }
            s.levels[id] = new == 0 ? nil : new
            s.promised += Self.need(new) - Self.need(old)
            guard s.fd >= 0 else { return } // not started: `start` counts it all
            if new < old {
                if s.held > s.promised && (!drawn || new == 0 || s.held - s.promised >= Self.slack) { cut(&s, to: s.promised) }
            } else {
                grow(&s)
            }
        }
    }

    /// `id` is gone, or its reserved ranges are: nothing is promised for it.
    public func release(_ id: InodeNumber) { settle(id, level: 0) }

    /// Gives back what writes drew and the file still holds; whether there was any (a
    /// write that met a full disk is worth trying again then).
    public func payDebt() -> Bool {
        state.withLock { s in
            guard s.fd >= 0, s.held > s.promised else { return false }
            cut(&s, to: s.promised)
            return true
        }
    }

    /// One file's part of the promise, as its content reports it.
    public struct Account: Sendable {
        let reservation: SpaceReservation
        let id: InodeNumber
        func settle(_ level: Int64, drawn: Bool = false) { reservation.settle(id, level: level, drawn: drawn) }
        func payDebt() -> Bool { reservation.payDebt() }
    }

    public func account(for id: InodeNumber) -> Account { Account(reservation: self, id: id) }

    private func open(_ s: inout State) throws(StoreError) {
        guard s.fd < 0 else { return }
        let fd = Glibc.open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw .io(errno: errno, "opening \(path)") }
        s.fd = fd
    }

    private func cut(_ s: inout State, to size: Int64) {
        if ftruncate(s.fd, off_t(size)) == 0 {
            s.held = size
        } else {
            log("ubiquity: could not give back reserved space (\(path)): \(String(cString: strerror(errno)))")
        }
    }

    /// Grows the file to the promise, if the disk has room.
    private func grow(_ s: inout State) {
        guard s.promised > s.held else { return }
        let code = posix_fallocate(s.fd, off_t(s.held), off_t(s.promised - s.held))
        if code == 0 {
            s.held = s.promised
            s.shortLogged = false
        } else {
            let reason = String(cString: strerror(code))
            _ = ftruncate(s.fd, off_t(s.held))
            if !s.shortLogged {
                log("ubiquity: fallocate promised \(byteText(s.promised)) but only \(byteText(s.held)) could be set aside (\(reason)): "
                    + "writes into reserved ranges may meet a full disk")
                s.shortLogged = true
            }
        }
    }
}
