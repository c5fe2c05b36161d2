/// Everything the store can fail with. The filesystem layer maps these to errno in exactly
/// one place (`StoreError.errno`, UbiquityFS/Errno.swift); the CLI prints `description`.
public enum StoreError: Error, Equatable, CustomStringConvertible {
    /// A chunk's bytes do not hash to its name: disk corruption or tampering. Never served.
    case corruptChunk(ChunkID)
    /// A version names a chunk the store does not have.
    case missingChunk(ChunkID)
    /// A chunk that is not here (files on demand) could not be fetched: why.
    case notLocal(ChunkID, String)
    /// A system call failed; `errno` is the C error code.
    case io(errno: Int32, String)
    /// SQLite reported an error.
    case database(String)
    /// The store directory is in use by another process (it holds the lock).
    case locked(String)
    /// A version or file the caller named does not exist.
    case noSuchVersion(String)
    /// The store on disk is newer than this program understands.
    case unsupportedFormat(String)
    /// Written content a file type cannot store (an invalid TinyPix grid); nothing changed.
    case invalidContent(String)
    /// A setting (retention file, option) the store cannot use; the message names it.
    case invalidConfiguration(String)
    /// A key-value write the store's rules or limits refuse; the old value stays.
    case keyValue(KVError)

    public var description: String {
        switch self {
        case .corruptChunk(let id): return "chunk \(id) is corrupt (its content does not match its hash)"
        case .missingChunk(let id): return "chunk \(id) is missing from the store"
        case .notLocal(let id, let why): return "chunk \(id) is not on this device and could not be fetched: \(why)"
        case .io(let code, let what): return "\(what): \(errnoText(code))"
        case .database(let message): return "database error: \(message)"
        case .locked(let message): return message
        case .noSuchVersion(let what): return "no such version: \(what)"
        case .unsupportedFormat(let message): return message
        case .invalidContent(let message): return message
        case .invalidConfiguration(let message): return message
        case .keyValue(let error): return error.description
        }
    }
}

import Glibc
import UbiquitySystem

extension StoreError {
    /// Runs shared system helpers, their failures as `.io`.
    static func wrap<T>(_ body: () throws(SystemError) -> T) throws(StoreError) -> T {
        do { return try body() } catch { throw .io(errno: error.code, error.context) }
    }
}

/// Throws `.io` with the current errno when a system call returns -1.
@discardableResult
func check(_ result: Int, _ what: @autoclosure () -> String) throws(StoreError) -> Int {
    if result < 0 { throw .io(errno: errno, what()) }
    return result
}

@discardableResult
func check(_ result: Int32, _ what: @autoclosure () -> String) throws(StoreError) -> Int32 {
    if result < 0 { throw .io(errno: errno, what()) }
    return result
}
