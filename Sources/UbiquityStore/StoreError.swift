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
    /// The backing store refused or failed a request: what was asked, and whether
    /// asking again can help (the sync engine retries by itself; the status says which).
    case backing(BackingFailure)

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
        case .backing(let failure): return failure.description
        }
    }

    /// Whether trying again later can succeed without anyone changing anything.
    public var isRetryable: Bool {
        if case .backing(let failure) = self { return failure.kind == .retryable }
        return false
    }
}

/// A failed request to the backing store, as the layers above the backing seam see it:
/// the store layer knows no backing store, so the kind travels here, not the type.
public struct BackingFailure: Error, Equatable, Sendable, CustomStringConvertible {
    public enum Kind: String, Sendable {
        /// No object under the key.
        case notFound = "not-found"
        /// A put that must not overwrite found an object there.
        case exists
        /// A timeout, a reset or refused connection, a 5xx, an answer that made no sense:
        /// the same request may succeed later.
        case retryable
        /// Access denied, no such bucket, a bad key or region, a read-only directory:
        /// nothing changes until someone changes the settings or the store.
        case permanent
    }

    public let kind: Kind
    /// The request, e.g. "list log/" or "put packs/3f/3f9a...".
    public let request: String
    /// The store's answer.
    public let answer: String

    public init(_ kind: Kind, request: String, answer: String) {
        self.kind = kind
        self.request = request
        self.answer = answer
    }

    /// What a person can do about it.
    public var advice: String {
        switch kind {
        case .retryable: return "sync retries by itself; the mount keeps working offline meanwhile"
        case .permanent: return "check the backing store's address, credentials and permissions, then `ubiquity sync`"
        case .notFound, .exists: return "another device changed the backing store meanwhile; sync tries again by itself"
        }
    }

    public var description: String { "\(request): \(answer)" }
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
