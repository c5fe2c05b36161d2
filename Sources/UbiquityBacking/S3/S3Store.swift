import AsyncHTTPClient
import Dispatch
import Glibc
import NIOCore
import NIOHTTP1
import NIOSSL
import Synchronization

/// A backing store in an S3 bucket (AWS, Backblaze B2, Wasabi, Cloudflare R2, MinIO, Ceph
/// RGW, Garage): each key is an object under the settings' prefix. HTTP goes through
/// async-http-client (connection reuse, at most `maxConnections` at once, timeouts),
/// signed with SigV4 over the payload's SHA-256 so a body damaged in transit is refused by
/// the server. Calls block their thread (the sync engine's, never the filesystem's).
///
/// Every answer is checked before use: statuses outside what a call expects, lengths that
/// disagree, XML that does not parse become `.garbage`; bodies are bounded
/// (`maxObjectSize`, 16 MiB for XML), so no server can make the daemon allocate without
/// limit. Messages name the method, the key and S3's error code, never a secret.
public final class S3Store: BackingStore {
    public let settings: S3Settings
    public let maxObjectSize: Int
    let minimumDeadline: Int64
    private let client: HTTPClient
    private let signer: SigV4
    /// Seconds to add to the local clock: set from the server's `Date` when it answers
    /// RequestTimeTooSkewed.
    private let skew = Mutex<Int64>(0)
    private let counters = Mutex(Stats())

    /// What this store did in this session (`ubiquity status`).
    public struct Stats: Sendable, Equatable {
        public var requests = 0
        public var bytesUp: Int64 = 0
        public var bytesDown: Int64 = 0
        /// Body bytes hashed for the signature (none over TLS: `SigV4.payloadHash`).
        public var bytesHashed: Int64 = 0
        public var lastError: String?
    }

    public var stats: Stats { counters.withLock { $0 } }

    /// `readTimeout`: seconds a connection may stay silent, or refuse the body, before the
    /// request fails (a stalled server must not stall the sync engine for long; it retries).
    /// `minimumDeadline`: seconds any one request may take at most, plus a second per MiB
    /// it may carry.
    public init(settings: S3Settings, maxConnections: Int = 8, maxObjectSize: Int = 1 << 30, readTimeout: Int64 = 30,
                minimumDeadline: Int64 = 60) throws(BackingError) {
        self.settings = settings
        self.maxObjectSize = maxObjectSize
        self.minimumDeadline = max(1, minimumDeadline)
        signer = SigV4(credentials: settings.credentials, region: settings.region)
        var tls = TLSConfiguration.makeClientConfiguration()
        if let bundle = settings.caBundle {
            guard access(bundle, R_OK) == 0 else { throw .permanent("the CA bundle \(bundle) (AWS_CA_BUNDLE) cannot be read") }
            tls.trustRoots = .file(bundle)
        }
        var configuration = HTTPClient.Configuration(
            tlsConfiguration: tls, redirectConfiguration: .disallow,
            // A server that stops reading a body stalls a PUT as surely as one that never
            // answers: both sides are bounded (else a stalled PUT whose body the socket
            // buffers cannot hold waits out its whole deadline).
            timeout: .init(connect: .seconds(10), read: .seconds(max(1, readTimeout)), write: .seconds(max(1, readTimeout))),
            connectionPool: .init(idleTimeout: .seconds(60)))
        configuration.connectionPool.concurrentHTTP1ConnectionsPerHostSoftLimit = max(1, maxConnections)
        configuration.httpVersion = .http1Only
        client = HTTPClient(eventLoopGroupProvider: .singleton, configuration: configuration)
    }

    deinit { try? client.syncShutdown() }

    public var location: String { "s3://\(settings.bucket)\(settings.prefix.isEmpty ? "" : "/" + settings.prefix)" }

    // MARK: the protocol

    public func put(_ key: BackingKey, _ bytes: [UInt8], ifAbsent: Bool) throws(BackingError) {
        guard bytes.count <= maxObjectSize else { throw .permanent("\(key): \(bytes.count) bytes is more than one PUT may carry here") }
        let answer = try send("PUT", key: key, headers: ifAbsent ? [("If-None-Match", "*")] : [], body: bytes, maxBody: 1 << 16)
        switch answer.status {
        case 200: return
        case 412: throw .exists(key.path)
        default: throw classify(answer, "PUT", key)
        }
    }

    public func get(_ key: BackingKey, range: Range<Int64>?) throws(BackingError) -> [UInt8] {
        if let range, range.lowerBound >= range.upperBound || range.lowerBound < 0 {
            // Nothing to read, but the object must exist to say so.
            guard try stat(key) != nil else { throw .notFound(key.path) }
            return []
        }
        let wanted = range.map { Int($0.upperBound - $0.lowerBound) } ?? maxObjectSize
        let headers = range.map { [("Range", "bytes=\($0.lowerBound)-\($0.upperBound - 1)")] } ?? []
        // Room for the bytes, or for an error document (416 past the end, 404, 5xx).
        let answer = try send("GET", key: key, headers: headers, body: [], maxBody: max(min(wanted, maxObjectSize), 1 << 16))
        switch answer.status {
        case 200:
            // A server may ignore the range and send everything: cut it here.
            if let range {
                let size = answer.body.count
                let lower = Int(min(range.lowerBound, Int64(size))), upper = Int(min(range.upperBound, Int64(size)))
                return Array(answer.body[lower..<upper])
            }
            return answer.body
        case 206:
            // The bytes must be the ones asked for: Content-Range "bytes <first>-<last>/<size>".
            guard let range, let text = answer.headers.first(name: "content-range"), text.hasPrefix("bytes "),
                  case let parts = text.dropFirst(6).split(separator: "/"), parts.count == 2,
                  case let bounds = parts[0].split(separator: "-"), bounds.count == 2,
                  let first = Int64(bounds[0]), let last = Int64(bounds[1]), first == range.lowerBound, last >= first,
                  last - first + 1 == Int64(answer.body.count), answer.body.count <= wanted else {
                throw .garbage("GET \(key): a partial answer that is not the range asked for")
            }
            return answer.body
        case 416: return [] // the range starts at or past the end
        default: throw classify(answer, "GET", key)
        }
    }

    public func stat(_ key: BackingKey) throws(BackingError) -> ObjectInfo? {
        let answer = try send("HEAD", key: key, headers: [], body: [], maxBody: 1 << 16)
        switch answer.status {
        case 200:
            guard let text = answer.headers.first(name: "content-length"), let size = Int64(text), size >= 0, size <= 5 << 40 else {
                throw .garbage("HEAD \(key): no usable Content-Length")
            }
            return ObjectInfo(key: key, size: size)
        case 404 where answer.errorCode != "NoSuchBucket": return nil
        default: throw classify(answer, "HEAD", key)
        }
    }

    public func list(prefix: String, after: BackingKey?, limit: Int) throws(BackingError) -> ObjectListing {
        let base = settings.prefix.isEmpty ? "" : settings.prefix + "/"
        var query = [("list-type", "2"), ("prefix", base + prefix), ("max-keys", String(max(1, min(limit, 1000))))]
        if let after { query.append(("start-after", base + after.path)) }
        let answer = try send("GET", key: nil, query: query, headers: [], body: [], maxBody: 16 << 20)
        guard answer.status == 200 else { throw classify(answer, "LIST", nil) }
        let text = String(decoding: answer.body, as: UTF8.self)
        guard let listing = S3XML.listing(text[...]) else { throw .garbage("LIST \(prefix): an answer that is not a ListBucketResult") }
        var objects: [ObjectInfo] = []
        for (name, size) in listing.objects {
            // Keys outside our prefix, or that are no valid key, are not ours: skipped.
            guard name.hasPrefix(base), let key = BackingKey(String(name.dropFirst(base.count))), key.path.hasPrefix(prefix) else { continue }
            if let after, key <= after { throw .garbage("LIST \(prefix): \(key) is not after \(after)") }
            objects.append(ObjectInfo(key: key, size: size))
        }
        // A truncated page must give a key to go on from: one whose keys were all skipped
        // would end the listing early without a word.
        if listing.truncated && objects.isEmpty { throw .garbage("LIST \(prefix): a truncated page with no key of ours to go on from") }
        return ObjectListing(objects: objects, more: listing.truncated)
    }

    public func delete(_ key: BackingKey) throws(BackingError) {
        let answer = try send("DELETE", key: key, headers: [], body: [], maxBody: 1 << 16)
        guard answer.status == 204 || answer.status == 200 || (answer.status == 404 && answer.errorCode != "NoSuchBucket") else {
            throw classify(answer, "DELETE", key)
        }
    }

    /// Checks the bucket is there and the credentials work (a first mount's check): a
    /// listing of one key, whose failure says what to fix.
    public func checkAccess() throws(BackingError) {
        _ = try list(prefix: "", after: nil, limit: 1)
    }

    // MARK: HTTP

    struct Answer {
        var status: Int
        var headers: HTTPHeaders
        var body: [UInt8]
        /// The code of an error answer's XML document. Only an error carries one: a 2xx
        /// body is data (megabytes of a segment or a pack, random bytes when sealed) and
        /// is never decoded as text (that would cost an encrypted join much of its CPU).
        var errorCode: String? {
            guard status >= 300, !body.isEmpty else { return nil }
            return S3XML.error(String(decoding: body, as: UTF8.self)[...])?.code
        }
    }

    /// One signed request; a RequestTimeTooSkewed answer corrects the clock from the
    /// server's Date header and is sent again once.
    private func send(_ method: String, key: BackingKey?, query: [(String, String)] = [], headers: [(String, String)],
                      body: [UInt8], maxBody: Int) throws(BackingError) -> Answer {
        var answer = try sendOnce(method, key: key, query: query, headers: headers, body: body, maxBody: maxBody)
        // A HEAD answer has no body to name the error: a 403 with the server's clock more
        // than 5 minutes from ours is taken as the skew error it most likely is.
        guard answer.status == 403 else { return answer }
        let code = answer.errorCode
        let skewed = code == "RequestTimeTooSkewed" || code == "RequestExpired"
            || (method == "HEAD" && answer.body.isEmpty && answer.headers.first(name: "date").flatMap(UTCTime.init(httpDate:))
                .map { abs($0.seconds - Int64(time(nil)) - skew.withLock { $0 }) > 300 } == true)
        if skewed, let date = answer.headers.first(name: "date"), let server = UTCTime(httpDate: date) {
            skew.withLock { $0 = server.seconds - Int64(time(nil)) }
            answer = try sendOnce(method, key: key, query: query, headers: headers, body: body, maxBody: maxBody)
        }
        return answer
    }

    private func sendOnce(_ method: String, key: BackingKey?, query: [(String, String)], headers: [(String, String)],
                          body: [UInt8], maxBody: Int) throws(BackingError) -> Answer {
        let endpoint = settings.endpoint
        let host = settings.pathStyle ? endpoint.hostHeader : "\(settings.bucket).\(endpoint.hostHeader)"
        let objectPath = key.map { settings.prefix.isEmpty ? $0.path : settings.prefix + "/" + $0.path }
        var path = settings.pathStyle ? "/" + settings.bucket : ""
        if let objectPath { path += "/" + SigV4.encode(objectPath, slash: false) }
        if path.isEmpty { path = "/" }
        let now = UTCTime(seconds: Int64(time(nil)) + skew.withLock { $0 })
        var all = headers + [("Host", host)]
        let payloadHash = SigV4.payloadHash(body, overTLS: endpoint.secure)
        if payloadHash != SigV4.unsignedPayload { counters.withLock { $0.bytesHashed += Int64(body.count) } }
        all += signer.sign(method: method, path: path, query: query, headers: all, payloadHash: payloadHash, time: now)
        let queryString = query.map { "\(SigV4.encode($0.0, slash: true))=\(SigV4.encode($0.1, slash: true))" }.joined(separator: "&")
        let url = "\(endpoint.secure ? "https" : "http")://\(host)\(path)\(queryString.isEmpty ? "" : "?" + queryString)"
        let what = "\(method) \(key.map { $0.path } ?? location)"
        let request: HTTPClient.Request
        do {
            request = try HTTPClient.Request(url: url, method: HTTPMethod(rawValue: method), headers: HTTPHeaders(all),
                                             body: body.isEmpty && method != "PUT" ? nil : .bytes(body))
        } catch {
            throw .permanent("\(what): cannot build the request: \(error)")
        }
        counters.withLock { $0.requests += 1; $0.bytesUp += Int64(body.count) }
        // Long enough for the body at a slow 1 MiB/s, never less than the minimum (a minute).
        let seconds = minimumDeadline + Int64(max(body.count, method == "GET" ? min(maxBody, 1 << 30) : 0) >> 20)
        do {
            let task = client.execute(request: request, delegate: ResponseAccumulator(request: request, maxBodySize: max(1, maxBody)),
                                      deadline: .now() + .seconds(seconds))
            let response = try Self.wait(for: task, seconds: seconds + 5, what: what)
            let bytes = response.body.map { Array($0.readableBytesView) } ?? []
            counters.withLock { $0.bytesDown += Int64(bytes.count) }
            if method != "HEAD", let text = response.headers.first(name: "content-length"), let length = Int(text), length != bytes.count {
                throw BackingError.garbage("\(what): Content-Length \(length) but \(bytes.count) bytes came")
            }
            return Answer(status: Int(response.status.code), headers: response.headers, body: bytes)
        } catch let error as BackingError {
            note(error)
            throw error
        } catch {
            let classified = transportError(error, what)
            note(classified)
            throw classified
        }
    }

    /// Waits for a request at most `seconds`, then cancels it: every call ends, whatever
    /// the HTTP client's own timers do (behind a proxy that stalls or sends garbage, a
    /// request can wait minutes past its read timeout and deadline).
    private static func wait(for task: HTTPClient.Task<HTTPClient.Response>, seconds: Int64, what: String) throws -> HTTPClient.Response {
        let done = DispatchSemaphore(value: 0)
        let result = Mutex<Result<HTTPClient.Response, any Error>?>(nil)
        task.futureResult.whenComplete { outcome in
            result.withLock { $0 = outcome }
            done.signal()
        }
        if done.wait(timeout: .now() + .seconds(Int(seconds))) == .timedOut {
            task.cancel()
            throw BackingError.transient("s3: \(what): no answer within \(seconds) s")
        }
        return try result.withLock { $0! }.get()
    }

    private func note(_ error: BackingError) { counters.withLock { $0.lastError = "s3: \(error)" } }

    /// Connection failures, timeouts and resets may pass; TLS failures (an unknown CA, a
    /// wrong name) need a person.
    private func transportError(_ error: any Error, _ what: String) -> BackingError {
        if error is NIOSSLError || String(describing: type(of: error)).contains("SSL") {
            return .permanent("s3: \(what): TLS: \(error) (AWS_CA_BUNDLE names a CA bundle)")
        }
        if String(describing: error).contains("ResponseTooBig") { return .garbage("s3: \(what): an answer larger than expected (\(error))") }
        return .transient("s3: \(what) at \(settings.endpoint.base): \(error)")
    }

    /// A status the call did not expect, as the protocol's error kinds.
    private func classify(_ answer: Answer, _ method: String, _ key: BackingKey?) -> BackingError {
        let code = answer.errorCode ?? ""
        let what = "s3: \(answer.status) \(code.isEmpty ? "" : code + " ")on \(method) \(key.map { $0.path } ?? location)"
        let error: BackingError
        switch (answer.status, code) {
        case (404, "NoSuchBucket"):
            error = .permanent("\(what): there is no bucket \(settings.bucket) at \(settings.endpoint.base) (create it, or fix the name or AWS_ENDPOINT_URL)")
        case (404, _): error = .notFound(key?.path ?? location)
        case (301, _), (307, _), (400, "AuthorizationHeaderMalformed"), (400, "IllegalLocationConstraintException"):
            let region = answer.headers.first(name: "x-amz-bucket-region").map { " (the bucket is in \($0): set AWS_REGION)" } ?? " (check AWS_REGION)"
            error = .permanent(what + region)
        case (403, "InvalidAccessKeyId"), (403, "SignatureDoesNotMatch"):
            error = .permanent("\(what): the access key or secret is wrong (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY or ~/.aws/credentials)")
        case (403, _): error = .permanent("\(what): access denied to \(location) for key \(settings.credentials.accessKey.prefix(4))…")
        case (400, "RequestTimeout"), (400, "ExpiredToken"), (409, _), (429, _), (500...599, _): error = .transient(what)
        case (400...499, _): error = .permanent(what)
        default: error = .garbage(what)
        }
        if case .notFound = error {} else { note(error) } // a missing object is an answer, not a fault
        return error
    }
}
