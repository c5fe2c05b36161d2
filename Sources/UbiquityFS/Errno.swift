import Glibc
import UbiquitySystem
import UbiquityStore

/// A POSIX error number: what the filesystem layer throws and the FUSE layer replies.
public struct Errno: Error, Equatable, CustomStringConvertible {
    public let code: Int32
    public init(_ code: Int32) { self.code = code }

    public static let notFound = Errno(ENOENT)
    public static let exists = Errno(EEXIST)
    public static let notDirectory = Errno(ENOTDIR)
    public static let isDirectory = Errno(EISDIR)
    public static let notEmpty = Errno(ENOTEMPTY)
    public static let invalid = Errno(EINVAL)
    public static let readOnly = Errno(EROFS)
    public static let notPermitted = Errno(EPERM)
    public static let badHandle = Errno(EBADF)
    public static let noData = Errno(ENODATA)
    public static let notSupported = Errno(EOPNOTSUPP)
    public static let nameTooLong = Errno(ENAMETOOLONG)
    public static let io = Errno(EIO)
    public static let range = Errno(ERANGE)
    public static let illegalSequence = Errno(EILSEQ)
    public static let busy = Errno(EBUSY)
    public static let fileTooBig = Errno(EFBIG)
    public static let noSpace = Errno(ENOSPC)
    public static let noSuchAddress = Errno(ENXIO)

    public var description: String { errnoText(code) }
}

extension StoreError {
    /// The one place store errors become errno. Corruption is EIO: never wrong bytes.
    public var errno: Errno {
        switch self {
        case .corruptChunk, .missingChunk, .notLocal: return .io
        case .io(let code, _): return Errno(code)
        case .database: return .io
        case .locked: return .busy
        case .noSuchVersion: return .notFound
        case .unsupportedFormat: return .io
        case .invalidContent, .invalidConfiguration: return .invalid
        case .keyValue(let error):
            switch error {
            case .tooManyKeys, .totalTooLarge: return Errno(EDQUOT)
            case .valueTooLarge: return .fileTooBig
            case .keyTooLong: return .nameTooLong
            case .badKey, .badValue: return .invalid
            }
        case .backing:
            // A request on a file's behalf (a chunk not here) that the backing store
            // failed, whatever its kind: the file is there, its bytes could not be had.
            return .io
        }
    }
}

/// Logs a store error unless it is the caller's own doing, and returns its errno, so
/// that an EIO or EINVAL always has an explanation in the log.
func storeErrorLogged(_ error: StoreError) -> Errno {
    switch error {
    case .noSuchVersion, .locked, .invalidConfiguration, .keyValue: break
    default: log("ubiquity: \(error)")
    }
    return error.errno
}

/// Runs store code, turning its errors into errno (and logging the ones that are not the
/// caller's fault, so EIO always has an explanation in the log).
func storeCall<T>(_ body: () throws(StoreError) -> T) throws(Errno) -> T {
    do {
        return try body()
    } catch {
        throw storeErrorLogged(error)
    }
}
