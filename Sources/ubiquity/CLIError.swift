/// A command's failure, printed as "Error: message" with exit status 1. Only the command
/// line makes these: the layers below throw typed errors (DaemonError, StoreError, Errno)
/// whose text this carries.
struct CLIError: Error, CustomStringConvertible {
    let description: String
    init(_ message: String) { description = message }
}
