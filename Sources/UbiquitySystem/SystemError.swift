import Glibc

/// A failed system call: its errno and what was being done ("open /x/y"). Every layer
/// wraps it in its own error type (StoreError.io, the CLI's messages).
public struct SystemError: Error, Equatable, CustomStringConvertible {
    public let code: Int32
    public let context: String

    public init(_ code: Int32, _ context: String = "") {
        self.code = code
        self.context = context
    }

    /// The current errno, with what failed.
    public static func last(_ context: String) -> SystemError { SystemError(errno, context) }

    /// strerror(code), e.g. "Input/output error".
    public var reason: String { errnoText(code) }
    public var description: String { context.isEmpty ? reason : "\(context): \(reason)" }
}

/// strerror(code) as a Swift string.
public func errnoText(_ code: Int32) -> String {
    guard let text = strerror(code) else { return "error \(code)" }
    return String(cString: text)
}

/// Runs a system call again while it fails with EINTR; returns its last result.
@inline(__always)
public func retryingEINTR<R: BinaryInteger>(_ call: () -> R) -> R {
    while true {
        let result = call()
        if result >= 0 || errno != EINTR { return result }
    }
}
