import FoundationEssentials
import UbiquityFS
import UbiquityStore

// The control socket's protocol (ControlServer, ControlConnection): one request line per
// connection, then reply lines until the server or the client closes it. Every line is
// one JSON object through Foundation's JSONEncoder and JSONDecoder (JSONLines), keys in
// sorted order; a reader parses the JSON and never relies on the order of the fields.

/// One JSON value per line through Foundation's JSONEncoder / JSONDecoder: the control
/// socket's lines, and the CLI's `--json` output. Compact, so a line holds no raw newline
/// (one in a string is `\n`); keys sorted, so one value has one spelling; `/` left as it
/// is (`"path":"Documents/a.txt"`).
public enum JSONLines {
    private static let encoder: JSONEncoder = {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return encoder
    }()
    private static let decoder = JSONDecoder()

    /// The JSON text of `value`, without a newline.
    public static func encode(_ value: some Encodable) throws(EncodingError) -> String {
        do { return String(decoding: try encoder.encode(value), as: UTF8.self) } catch let error as EncodingError {
            throw error
        } catch {
            throw EncodingError.invalidValue(value, .init(codingPath: [], debugDescription: "\(error)"))
        }
    }

    /// `T` from one line of JSON text; DecodingError for text that is not JSON, or not a `T`.
    public static func decode<T: Decodable>(_ type: T.Type, from line: String) throws(DecodingError) -> T {
        do { return try decoder.decode(type, from: Data(line.utf8)) } catch let error as DecodingError {
            throw error
        } catch {
            throw DecodingError.dataCorrupted(.init(codingPath: [], debugDescription: "\(error)"))
        }
    }
}

/// What a client asks for: `{"request":"watch-kv"}` or
/// `{"hidden":false,"name":"*.txt","request":"query","scope":"all","watch":true}`.
public enum ControlRequest: Codable, Equatable, Sendable {
    /// Remote key-value changes as they arrive.
    case watchKeyValues
    /// A consistent listing, then (with `watch`) file events.
    case query(ControlQuery)
    /// `{"path":"docs","request":"download"}` (or evict, pin, unpin): the files at or
    /// below a path of the container, with progress and a result per file that did not go.
    case files(ControlFilesAction, path: String)

    enum CodingKeys: String, CodingKey { case request, path }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        switch self {
        case .watchKeyValues: try c.encode("watch-kv", forKey: .request)
        case .query(let query):
            try c.encode("query", forKey: .request)
            try query.encode(to: encoder)
        case .files(let action, let path):
            try c.encode(action.rawValue, forKey: .request)
            try c.encode(path, forKey: .path)
        }
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        switch try c.decode(String.self, forKey: .request) {
        case "watch-kv": self = .watchKeyValues
        case "query": self = .query(try ControlQuery(from: decoder))
        case let verb where ControlFilesAction(rawValue: verb) != nil:
            self = .files(ControlFilesAction(rawValue: verb)!, path: try c.decode(String.self, forKey: .path))
        case let other:
            throw DecodingError.dataCorruptedError(forKey: .request, in: c, debugDescription: "unknown request \(other)")
        }
    }

    /// The longest request line the server reads (a name pattern is short).
    public static let maxLineBytes = 4096

    /// A request line: one JSON object. Anything else (the word form daemons before JSON
    /// requests read, `watch-kv` or `query scope=all`, included) is refused.
    public init(line: String) throws(ControlError) {
        guard line.utf8.first(where: { ![0x20, 0x09, 0x0D].contains($0) }) == UInt8(ascii: "{") else {
            throw ControlError(#"bad request: not a JSON object (a request is one JSON object per line, such as {"request":"watch-kv"})"#)
        }
        do { self = try JSONLines.decode(ControlRequest.self, from: line) } catch {
            throw ControlError("bad request: \(Self.describe(error))")
        }
    }

    /// A decoding error in one line: what was wrong, and where.
    static func describe(_ error: DecodingError) -> String {
        func at(_ context: DecodingError.Context) -> String {
            let path = context.codingPath.map(\.stringValue).joined(separator: ".")
            return path.isEmpty ? context.debugDescription : "\(path): \(context.debugDescription)"
        }
        switch error {
        case .typeMismatch(_, let c), .valueNotFound(_, let c), .dataCorrupted(let c): return at(c)
        case .keyNotFound(let key, _): return "no \"\(key.stringValue)\""
        @unknown default: return "\(error)"
        }
    }
}

/// A live query's parameters (`ubiquity query`).
public struct ControlQuery: Codable, Equatable, Sendable {
    /// `documents`, `data` or `all` (QueryFilter.Scope); the server refuses others.
    public var scope: String
    /// A shell pattern the file name must match.
    public var name: String?
    /// Include names starting with '.'.
    public var hidden: Bool
    /// After the listing, report changes until the client goes.
    public var watch: Bool

    public init(scope: String = "all", name: String? = nil, hidden: Bool = false, watch: Bool = false) {
        self.scope = scope
        self.name = name
        self.hidden = hidden
        self.watch = watch
    }

    enum CodingKeys: String, CodingKey { case scope, hidden, watch, name }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        scope = try c.decodeIfPresent(String.self, forKey: .scope) ?? "all"
        name = try c.decodeIfPresent(String.self, forKey: .name)
        hidden = try c.decodeIfPresent(Bool.self, forKey: .hidden) ?? false
        watch = try c.decodeIfPresent(Bool.self, forKey: .watch) ?? false
    }
}

/// A request the server refuses; the client gets `{"error":MESSAGE}`.
public struct ControlError: Error, Equatable, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}

/// One line the server sends.
public enum ControlReply: Codable, Equatable, Sendable {
    /// `{"error":"..."}`: the request failed; nothing follows.
    case error(String)
    /// `{"event":"watching"}`: a key-value watch is live.
    case watching
    /// `{"event":"overflow"}`: events came faster than the client read them; some were skipped.
    case overflow
    /// `{"count":N,"event":"gathered"}`: the end of a query's listing.
    case gathered(count: Int)
    /// `{"created":...,"downloaded":...,"mtime":...,"path":...,"size":...,"state":...}`: a
    /// file of a listing.
    case file(ControlFile)
    /// `{...,"event":"added",...}`: a file changed after the listing; `file` is nil for one
    /// that went (`{"event":"removed","path":...}`).
    case fileEvent(ControlFileEvent, path: String, file: ControlFile?)
    /// `{...,"event":"changed",...,"key":...}`: another device changed a key.
    case keyValueChanged(ControlKeyChange)
    /// `{"bytes":..,"event":"progress","files":3,"of":10,"ofBytes":..}`: how far a files
    /// request is (bytes fetched, or freed by an eviction; `ofBytes` 0 when not known).
    case progress(files: Int, of: Int, bytes: Int64, ofBytes: Int64)
    /// `{"bytes":..,"detail":..,"event":"result","path":..,"result":"done"|"refused"|"failed"}`:
    /// one file of a files request (each one that did not go, and each eviction).
    case result(path: String, result: String, bytes: Int64, detail: String)
    /// `{"bytes":B,"event":"finished","files":N,"problems":K}`: the end of a files request.
    case finished(files: Int, bytes: Int64, problems: Int)

    enum CodingKeys: String, CodingKey { case error, event, count, path, key, state, files, of, bytes, ofBytes, result, detail, problems }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        switch self {
        case .error(let message): try c.encode(message, forKey: .error)
        case .watching: try c.encode("watching", forKey: .event)
        case .overflow: try c.encode("overflow", forKey: .event)
        case .gathered(let count):
            try c.encode("gathered", forKey: .event)
            try c.encode(count, forKey: .count)
        case .file(let file): try file.encode(to: encoder)
        case .fileEvent(let kind, let path, let file):
            try c.encode(kind.rawValue, forKey: .event)
            if let file { try file.encode(to: encoder) } else { try c.encode(path, forKey: .path) }
        case .keyValueChanged(let change):
            try c.encode("changed", forKey: .event)
            try change.encode(to: encoder)
        case .progress(let files, let of, let bytes, let ofBytes):
            try c.encode("progress", forKey: .event)
            try c.encode(files, forKey: .files)
            try c.encode(of, forKey: .of)
            try c.encode(bytes, forKey: .bytes)
            try c.encode(ofBytes, forKey: .ofBytes)
        case .result(let path, let result, let bytes, let detail):
            try c.encode("result", forKey: .event)
            try c.encode(path, forKey: .path)
            try c.encode(result, forKey: .result)
            try c.encode(bytes, forKey: .bytes)
            try c.encode(detail, forKey: .detail)
        case .finished(let files, let bytes, let problems):
            try c.encode("finished", forKey: .event)
            try c.encode(files, forKey: .files)
            try c.encode(bytes, forKey: .bytes)
            try c.encode(problems, forKey: .problems)
        }
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        if let message = try c.decodeIfPresent(String.self, forKey: .error) { self = .error(message); return }
        guard let event = try c.decodeIfPresent(String.self, forKey: .event) else {
            self = .file(try ControlFile(from: decoder))
            return
        }
        switch event {
        case "watching": self = .watching
        case "overflow": self = .overflow
        case "gathered": self = .gathered(count: try c.decode(Int.self, forKey: .count))
        case "changed" where c.contains(.key): self = .keyValueChanged(try ControlKeyChange(from: decoder))
        case "progress":
            self = .progress(files: try c.decode(Int.self, forKey: .files), of: try c.decode(Int.self, forKey: .of),
                             bytes: try c.decode(Int64.self, forKey: .bytes), ofBytes: try c.decode(Int64.self, forKey: .ofBytes))
        case "result":
            self = .result(path: try c.decode(String.self, forKey: .path), result: try c.decode(String.self, forKey: .result),
                           bytes: try c.decode(Int64.self, forKey: .bytes), detail: try c.decode(String.self, forKey: .detail))
        case "finished":
            self = .finished(files: try c.decode(Int.self, forKey: .files), bytes: try c.decode(Int64.self, forKey: .bytes),
                             problems: try c.decode(Int.self, forKey: .problems))
        default:
            guard let kind = ControlFileEvent(rawValue: event) else {
                throw DecodingError.dataCorruptedError(forKey: .event, in: c, debugDescription: "unknown event \(event)")
            }
            let path = try c.decode(String.self, forKey: .path)
            let file = c.contains(.state) ? try ControlFile(from: decoder) : nil
            self = .fileEvent(kind, path: path, file: file)
        }
    }
}

/// What a files request does (`ubiquity download`, `evict`, `pin`, `unpin`).
public enum ControlFilesAction: String, Codable, Sendable, CaseIterable {
    case download, evict, pin, unpin
}

/// What happened to a file (FileEvent.Kind).
public enum ControlFileEvent: String, Codable, Sendable {
    /// `download`: only the file's download state changed (its content arrived or was evicted).
    case added, changed, removed, conflict, download
}

/// A file in a query's answer (QueryItem); times in milliseconds, sent as ISO 8601 text.
public struct ControlFile: Codable, Equatable, Sendable {
    public var path: String
    public var size: Int64
    public var mtimeMillis: Int64
    public var createdMillis: Int64
    /// QueryItem.SyncState: uploaded, pending, remote, conflict, local-only.
    public var state: String
    /// DownloadState: current, partial, not-downloaded (a daemon before files on demand
    /// sends none: current).
    public var downloaded: String

    public init(path: String, size: Int64, mtimeMillis: Int64, createdMillis: Int64, state: String, downloaded: String = "current") {
        self.path = path
        self.size = size
        self.mtimeMillis = mtimeMillis
        self.createdMillis = createdMillis
        self.state = state
        self.downloaded = downloaded
    }

    public init(_ item: QueryItem) {
        self.init(path: item.path, size: item.size, mtimeMillis: item.mtime / 1_000_000,
                  createdMillis: item.created / 1_000_000, state: item.state.rawValue, downloaded: item.downloaded.rawValue)
    }

    enum CodingKeys: String, CodingKey { case path, size, mtime, created, state, downloaded }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(path, forKey: .path)
        try c.encode(size, forKey: .size)
        try c.encode(ISODate.format(millis: mtimeMillis), forKey: .mtime)
        try c.encode(ISODate.format(millis: createdMillis), forKey: .created)
        try c.encode(state, forKey: .state)
        try c.encode(downloaded, forKey: .downloaded)
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        path = try c.decode(String.self, forKey: .path)
        size = try c.decode(Int64.self, forKey: .size)
        mtimeMillis = try c.decodeTime(.mtime)
        createdMillis = try c.decodeTime(.created)
        state = try c.decode(String.self, forKey: .state)
        downloaded = try c.decodeIfPresent(String.self, forKey: .downloaded) ?? "current"
    }
}

/// A key another device changed (KVChange). A value that is not there (no old value, a
/// deletion) is left out.
public struct ControlKeyChange: Codable, Equatable, Sendable {
    public var key: String
    /// KVType's name: string, integer, double, bool, data, date, array, dictionary. The
    /// key's type after the change (a deletion: the deleted value's); `old` is read as one
    /// too (a key's type seldom changes).
    public var type: String
    public var old: AnyPropertyList?
    public var new: AnyPropertyList?
    public var deleted: Bool
    public var device: DeviceID
    public var name: String
    public var timeMillis: Int64

    public init(key: String, type: String, old: AnyPropertyList?, new: AnyPropertyList?, deleted: Bool,
                device: DeviceID, name: String, timeMillis: Int64) {
        self.key = key
        self.type = type
        self.old = old
        self.new = new
        self.deleted = deleted
        self.device = device
        self.name = name
        self.timeMillis = timeMillis
    }

    public init(_ change: KVChange) {
        func value(_ e: KVEntry?) -> AnyPropertyList? {
            guard let e, !e.isTombstone else { return nil }
            return AnyPropertyList(KeyValues.propertyList(e.value, as: e.type) ?? .data(e.value))
        }
        let writer = change.new.stamp
        self.init(key: change.key, type: change.new.type.name, old: value(change.old), new: value(change.new),
                  deleted: change.new.isTombstone, device: writer.device, name: writer.deviceName,
                  timeMillis: writer.time / 1_000_000)
    }

    enum CodingKeys: String, CodingKey { case key, type, old, new, deleted, device, name, time }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(key, forKey: .key)
        try c.encode(type, forKey: .type)
        try c.encodeIfPresent(old, forKey: .old)
        try c.encodeIfPresent(new, forKey: .new)
        try c.encode(deleted, forKey: .deleted)
        try c.encode(device.hex, forKey: .device)
        try c.encode(name, forKey: .name)
        try c.encode(ISODate.format(millis: timeMillis), forKey: .time)
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        key = try c.decode(String.self, forKey: .key)
        type = try c.decode(String.self, forKey: .type)
        // JSON spells a double such as 2.0 as `2`: the type says which it is.
        old = try c.decodeIfPresent(AnyPropertyList.self, forKey: .old)?.read(as: type)
        new = try c.decodeIfPresent(AnyPropertyList.self, forKey: .new)?.read(as: type)
        deleted = try c.decode(Bool.self, forKey: .deleted)
        device = try c.decodeDevice(.device)
        name = try c.decode(String.self, forKey: .name)
        timeMillis = try c.decodeTime(.time)
    }
}

extension KeyedDecodingContainer {
    /// An ISO 8601 time (ISODate), as milliseconds since the epoch.
    func decodeTime(_ key: Key) throws -> Int64 {
        let text = try decode(String.self, forKey: key)
        guard let millis = ISODate.parse(text) else {
            throw DecodingError.dataCorruptedError(forKey: key, in: self, debugDescription: "not an ISO 8601 time: \(text)")
        }
        return millis
    }

    /// A device id: its 16 lowercase hex digits.
    func decodeDevice(_ key: Key) throws -> DeviceID {
        let text = try decode(String.self, forKey: key)
        guard let device = DeviceID(hex: text) else {
            throw DecodingError.dataCorruptedError(forKey: key, in: self, debugDescription: "not a device id: \(text)")
        }
        return device
    }
}

/// A property-list value as a `Codable` value, for fields that hold any value (a key-value
/// store's entries): data and dates as one-key objects (`{"$data":"<base64>"}`,
/// `{"$date":"2026-11-24T08:00:00.000Z"}`), as in the store's text form (PropertyList).
/// Through JSONEncoder a double that is whole loses its `.0` (`2.0` is written `2`) and
/// reads back as an integer: a field that knows its type says so (`read(as:)`).
public struct AnyPropertyList: Codable, Equatable, Sendable {
    public var value: PropertyList
    public init(_ value: PropertyList) { self.value = value }

    /// The value read as a value of the type named `typeName` (KVType's name): an integer
    /// where a double is meant is that double.
    public func read(as typeName: String) -> AnyPropertyList {
        guard typeName == KVType.double.name, case .integer(let i) = value else { return self }
        return AnyPropertyList(.double(Double(i)))
    }

    public func encode(to encoder: any Encoder) throws {
        switch value {
        case .string(let s): var c = encoder.singleValueContainer(); try c.encode(s)
        case .integer(let i): var c = encoder.singleValueContainer(); try c.encode(i)
        case .double(let d): var c = encoder.singleValueContainer(); try c.encode(d)
        case .bool(let b): var c = encoder.singleValueContainer(); try c.encode(b)
        case .data(let bytes):
            var c = encoder.container(keyedBy: AnyKey.self)
            try c.encode(Base64.encode(bytes), forKey: AnyKey("$data"))
        case .date(let millis):
            var c = encoder.container(keyedBy: AnyKey.self)
            try c.encode(ISODate.format(millis: millis), forKey: AnyKey("$date"))
        case .array(let items):
            var c = encoder.unkeyedContainer()
            for item in items { try c.encode(AnyPropertyList(item)) }
        case .dictionary(let pairs):
            var c = encoder.container(keyedBy: AnyKey.self)
            for (key, item) in pairs { try c.encode(AnyPropertyList(item), forKey: AnyKey(key)) }
        }
    }

    public init(from decoder: any Decoder) throws {
        if var c = try? decoder.unkeyedContainer() {
            var items: [PropertyList] = []
            while !c.isAtEnd { items.append(try c.decode(AnyPropertyList.self).value) }
            value = .array(items)
        } else if let c = try? decoder.container(keyedBy: AnyKey.self) {
            let keys = c.allKeys
            if keys.count == 1, let key = keys.first, key.stringValue == "$data" || key.stringValue == "$date",
               let text = try? c.decode(String.self, forKey: key) {
                if key.stringValue == "$data" {
                    guard let bytes = Base64.decode(text) else {
                        throw DecodingError.dataCorruptedError(forKey: key, in: c, debugDescription: "$data is not base64")
                    }
                    value = .data(bytes)
                } else {
                    guard let millis = ISODate.parse(text) else {
                        throw DecodingError.dataCorruptedError(forKey: key, in: c, debugDescription: "$date is not an ISO 8601 time")
                    }
                    value = .date(millis)
                }
                return
            }
            var pairs: [(String, PropertyList)] = []
            for key in keys { pairs.append((key.stringValue, try c.decode(AnyPropertyList.self, forKey: key).value)) }
            // Keys in byte order, as PropertyList keeps them.
            value = .dictionary(pairs.sorted { $0.0.utf8.lexicographicallyPrecedes($1.0.utf8) })
        } else {
            let c = try decoder.singleValueContainer()
            if let b = try? c.decode(Bool.self) { value = .bool(b) }
            else if let i = try? c.decode(Int64.self) { value = .integer(i) }
            else if let d = try? c.decode(Double.self) { value = .double(d) }
            else { value = .string(try c.decode(String.self)) }
        }
    }
}

struct AnyKey: CodingKey {
    var stringValue: String
    var intValue: Int?
    init(_ string: String) { stringValue = string }
    init?(stringValue: String) { self.stringValue = stringValue }
    init(intValue: Int) { stringValue = String(intValue); self.intValue = intValue }
}
