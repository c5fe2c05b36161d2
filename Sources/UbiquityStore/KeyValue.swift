/// The container's key-value store (iCloud's NSUbiquitousKeyValueStore): small shared
/// state such as TinyPix's `selectedColorIndex`. Keys map to property-list values; each
/// key is a last-writer-wins register (`KVStamp`), so every device that has seen the same
/// writes shows the same value. The rules here (types, their text, limits) are the one
/// place both doors (the mount's `.kv/` and `ubiquity kv`) go through.
public enum KVType: Int, CaseIterable, Sendable {
    case string = 1, integer, double, bool, data, date, array, dictionary

    public var name: String {
        switch self {
        case .string: "string"
        case .integer: "integer"
        case .double: "double"
        case .bool: "bool"
        case .data: "data"
        case .date: "date"
        case .array: "array"
        case .dictionary: "dictionary"
        }
    }

    public init?(name: String) {
        guard let type = Self.allCases.first(where: { $0.name == name }) else { return nil }
        self = type
    }
}

/// Limits of one container's store (iCloud's, by default; `kv-*` in the container config).
public struct KVLimits: Equatable, Sendable {
    public var maxKeys = 1024
    /// Keys' and values' bytes together.
    public var maxTotalBytes = 1 << 20
    public var maxValueBytes = 1 << 20
    public var maxKeyBytes = 64
    public init() {}

    /// Sets one limit by its name in configuration: `keys`, `bytes`, `value` or `key`.
    /// Bounded so that a device's published file stays one that others read (16 MiB).
    public mutating func set(_ name: String, _ text: String) throws(StoreError) {
        let bounds: [String: ClosedRange<Int>] = ["keys": 1...100_000, "bytes": 1...(4 << 20), "value": 1...(4 << 20), "key": 1...255]
        guard let range = bounds[name] else {
            throw .invalidConfiguration("unknown key-value limit \(name): keys, bytes, value or key")
        }
        guard let n = Int(text.trimmingASCIISpace), range.contains(n) else {
            throw .invalidConfiguration("key-value limit \(name)=\(text): expected a whole number from \(range.lowerBound) to \(range.upperBound)")
        }
        switch name {
        case "keys": maxKeys = n
        case "bytes": maxTotalBytes = n
        case "value": maxValueBytes = n
        default: maxKeyBytes = n
        }
    }

    /// Limits from a configuration text (`configurationSettings`): `keys = 2048` lines.
    public init(configuration: String) throws(StoreError) {
        for setting in try configurationSettings(configuration) {
            do { try set(setting.key, setting.value) } catch { throw .invalidConfiguration("line \(setting.line): \(error)") }
        }
    }
}

public enum KVError: Error, Equatable, CustomStringConvertible {
    case tooManyKeys(limit: Int)
    case totalTooLarge(limit: Int, used: Int, needed: Int)
    case valueTooLarge(limit: Int, size: Int)
    case keyTooLong(limit: Int, bytes: Int)
    case badKey(String)
    case badValue(KVType, String)

    public var description: String {
        switch self {
        case .tooManyKeys(let limit): "the store has its limit of \(limit) keys"
        case let .totalTooLarge(limit, used, needed):
            "the store would hold \(needed) bytes, over its limit of \(limit) (\(used) used now)"
        case let .valueTooLarge(limit, size): "a value of \(size) bytes is over the limit of \(limit) per value"
        case let .keyTooLong(limit, bytes): "a key of \(bytes) bytes is over the limit of \(limit)"
        case .badKey(let why): why
        case let .badValue(type, why): "not a valid \(type.name): \(why)"
        }
    }
}

/// One key's state: its value and type, or a tombstone (deleted), and who wrote it when.
public struct KVEntry: Equatable, Sendable {
    public var key: String
    public var type: KVType
    /// The canonical content (`KeyValues.canonical`); empty for a tombstone.
    public var value: [UInt8]
    public var stamp: KVStamp
    public var isTombstone: Bool

    public init(key: String, type: KVType, value: [UInt8], stamp: KVStamp, isTombstone: Bool) {
        self.key = key
        self.type = type
        self.value = value
        self.stamp = stamp
        self.isTombstone = isTombstone
    }
}

/// A write's place in the last-writer-wins order: a hybrid logical clock (nanoseconds
/// of wall time, pushed past every stamp the device has seen, so a write made after
/// seeing another always wins over it, whatever the clocks say), then the device id.
public struct KVStamp: Comparable, Hashable, Sendable {
    public var time: Int64
    public var device: DeviceID
    /// The device's human name when it wrote (shown to watchers; not part of the order).
    public var deviceName: String

    public init(time: Int64, device: DeviceID, deviceName: String = "") {
        self.time = time
        self.device = device
        self.deviceName = deviceName
    }

    public static func == (a: KVStamp, b: KVStamp) -> Bool { a.time == b.time && a.device == b.device }
    public func hash(into h: inout Hasher) { h.combine(time); h.combine(device) }

    public static func < (a: KVStamp, b: KVStamp) -> Bool {
        if a.time != b.time { return a.time < b.time }
        return a.device < b.device
    }
}

/// A change of a key as a watcher sees it.
public struct KVChange: Equatable, Sendable {
    public var key: String
    public var old: KVEntry?
    public var new: KVEntry
}

public enum KeyValues {
    /// Whether `key` can name an entry: not empty, UTF-8, no `/` or NUL, not `.` or `..`.
    public static func check(key: String, limits: KVLimits) throws(KVError) {
        let bytes = key.utf8.count
        if bytes > limits.maxKeyBytes { throw .keyTooLong(limit: limits.maxKeyBytes, bytes: bytes) }
        if key.isEmpty || key == "." || key == ".." { throw .badKey("a key cannot be empty, \".\" or \"..\"") }
        if key.utf8.contains(UInt8(ascii: "/")) || key.utf8.contains(0) { throw .badKey("a key cannot contain \"/\" or NUL") }
    }

    /// The canonical content of `bytes` read as `type`, or why it is not one: strings and
    /// data are kept as written (strings must be UTF-8); integers, doubles, booleans and
    /// dates are text (surrounding whitespace ignored) kept with one `\n`; arrays and
    /// dictionaries are JSON (see `PropertyList`), kept compact with one `\n`.
    public static func canonical(_ bytes: [UInt8], as type: KVType) throws(KVError) -> [UInt8] {
        switch type {
        case .data: return bytes
        case .string:
            guard String(validating: bytes, as: UTF8.self) != nil else { throw .badValue(type, "not UTF-8") }
            return bytes
        default: break
        }
        guard let raw = String(validating: bytes, as: UTF8.self) else { throw .badValue(type, "not UTF-8 text") }
        let text = raw.trimmingASCIISpace
        let line: String
        switch type {
        case .integer:
            guard let value = Int64(text) else { throw .badValue(type, "expected a whole number from -2^63 to 2^63-1") }
            line = String(value)
        case .double:
            guard let value = Double(text), value.isFinite else { throw .badValue(type, "expected a finite number") }
            line = PropertyList.spell(value)
        case .bool:
            switch text.lowercased() {
            case "true", "yes", "1": line = "true"
            case "false", "no", "0": line = "false"
            default: throw .badValue(type, "expected true or false")
            }
        case .date:
            guard let millis = ISODate.parse(text) else { throw .badValue(type, "expected an ISO 8601 time such as 2026-11-24T08:00:00Z") }
            line = ISODate.format(millis: millis)
        case .array, .dictionary:
            let value: PropertyList
            do { value = try PropertyList.parseJSON(Array(text.utf8)) } catch { throw .badValue(type, error.description) }
            switch (type, value) {
            case (.array, .array), (.dictionary, .dictionary): break
            default: throw .badValue(type, "the JSON text is not \(type == .array ? "an array" : "an object")")
            }
            line = value.json
        case .string, .data: line = text // handled above
        }
        return Array((line + "\n").utf8)
    }

    /// A stored (canonical) value as a property list; nil if it is not one of `type`.
    public static func propertyList(_ content: [UInt8], as type: KVType) -> PropertyList? {
        switch type {
        case .data: return .data(content)
        case .string: return String(validating: content, as: UTF8.self).map { .string($0) }
        default: break
        }
        guard let text = String(validating: content, as: UTF8.self)?.trimmingASCIISpace else { return nil }
        switch type {
        case .integer: return Int64(text).map { .integer($0) }
        case .double: return Double(text).map { .double($0) }
        case .bool: return text == "true" ? .bool(true) : text == "false" ? .bool(false) : nil
        case .date: return ISODate.parse(text).map { .date($0) }
        default: return try? PropertyList.parseJSON(Array(text.utf8))
        }
    }

    /// The type a value written without one gets: the key's current type, else string.
    public static func defaultType(current: KVType?) -> KVType { current ?? .string }
}
