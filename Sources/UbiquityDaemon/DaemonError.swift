import UbiquityBacking
import UbiquityStore
import UbiquitySystem

/// Why a mount could not start, or why the daemon side of a command failed. The CLI
/// prints `description`; the case keeps what kind of failure it was, so that a caller can
/// tell a backing store that may answer later from a setting that must change first.
public enum DaemonError: Error, CustomStringConvertible {
    /// An option or settings file the daemon cannot use: the message names it and what
    /// it expects.
    case setting(String)
    /// The backing store failed a first request (`--backing` names it): the context, and
    /// its answer with the answer's kind.
    case backing(String, BackingError)
    /// The container's encryption does not match what the command asked for, or the key
    /// handed to the daemon is unusable.
    case encryption(String)
    /// A passphrase could not be read or used.
    case passphrase(String)
    /// A system call failed: what was attempted, and errno.
    case system(String, errno: Int32)
    /// The store refused (in use by another process, a newer format, damaged).
    case store(StoreError)
    /// The daemon started but reported a failure, or exited before mounting.
    case daemon(String)

    public var description: String {
        switch self {
        case .setting(let text), .encryption(let text), .passphrase(let text), .daemon(let text): return text
        case .backing(let context, let error):
            let advice = error.isRetryable
                ? "the server may be down or unreachable: try again later"
                : "check the bucket or path, the region, the endpoint and the credentials"
            return "\(context): \(error) (\(error.isRetryable ? "retryable" : "permanent"): \(advice))"
        case .system(let what, let code): return "\(what): \(errnoText(code))"
        case .store(let error): return "\(error)"
        }
    }

    /// `error` as a DaemonError: itself, the store's error in its case, else its text.
    static func from(_ error: any Error) -> DaemonError {
        switch error {
        case let error as DaemonError: return error
        case let error as StoreError: return .store(error)
        default: return .daemon("\(error)")
        }
    }
}
