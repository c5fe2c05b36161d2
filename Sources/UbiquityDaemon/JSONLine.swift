import UbiquityStore

/// One JSON value per line through `Codable`, spelled by `PropertyList.json`: the control
/// socket's wire format. Not Foundation's JSONEncoder: the project has no Foundation, and
/// that encoder does not keep the order fields are encoded in, which the wire format does
/// (`{"event":"gathered","count":3}`: scripts match lines like that one as text).
///
/// A property list has no null: an optional that is nil is left out (what synthesized
/// `Codable` does with `encodeIfPresent`), and a `null` in the input is refused.
public enum JSONLine {
    /// The JSON text of `value`, without a newline.
    public static func encode<T: Encodable>(_ value: T) throws(EncodingError) -> String {
        let root = Slot()
        do { try value.encode(to: SlotEncoder(slot: root, codingPath: [])) } catch let error as EncodingError {
            throw error
        } catch {
            throw EncodingError.invalidValue(value, .init(codingPath: [], debugDescription: "\(error)"))
        }
        guard let plist = root.value else {
            throw EncodingError.invalidValue(value, .init(codingPath: [], debugDescription: "encoded nothing"))
        }
        return plist.json
    }

    /// `T` from one line of JSON text; DecodingError for text that is not JSON, or not a `T`.
    public static func decode<T: Decodable>(_ type: T.Type, from line: some Collection<UInt8>) throws(DecodingError) -> T {
        let plist: PropertyList
        do { plist = try PropertyList.parseJSON(Array(line)) } catch {
            throw DecodingError.dataCorrupted(.init(codingPath: [], debugDescription: "not JSON: \(error)"))
        }
        return try decode(type, from: plist)
    }

    /// `T` from an already parsed value.
    public static func decode<T: Decodable>(_ type: T.Type, from plist: PropertyList) throws(DecodingError) -> T {
        do { return try T(from: PlistDecoder(value: plist, codingPath: [])) } catch let error as DecodingError {
            throw error
        } catch {
            throw DecodingError.dataCorrupted(.init(codingPath: [], debugDescription: "\(error)"))
        }
    }
}

/// A property-list value as a `Codable` value, for fields that hold any value (a key-value
/// store's entries): data and dates keep their one-key spellings (`{"$data":...}`).
public struct AnyPropertyList: Codable, Equatable, Sendable {
    public var value: PropertyList
    public init(_ value: PropertyList) { self.value = value }

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
        // Through our own decoder: the value as parsed (data and dates already told apart).
        if let plist = decoder as? PlistDecoder { value = plist.value; return }
        if var c = try? decoder.unkeyedContainer() {
            var items: [PropertyList] = []
            while !c.isAtEnd { items.append(try c.decode(AnyPropertyList.self).value) }
            value = .array(items)
        } else if let c = try? decoder.container(keyedBy: AnyKey.self) {
            var pairs: [(String, PropertyList)] = []
            for key in c.allKeys { pairs.append((key.stringValue, try c.decode(AnyPropertyList.self, forKey: key).value)) }
            value = .dictionary(pairs)
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

// MARK: encoding

/// Where one encoded value goes; containers hand out child slots, read back at the end.
private final class Slot {
    enum Kind { case empty, single, array, object }
    var kind = Kind.empty
    var single = PropertyList.bool(false)
    var items: [Slot] = []
    var pairs: [(key: String, slot: Slot)] = []

    func child(_ key: String) -> Slot {
        let slot = Slot()
        if let i = pairs.firstIndex(where: { $0.key == key }) { pairs[i].slot = slot } else { pairs.append((key, slot)) }
        return slot
    }

    func appended() -> Slot {
        let slot = Slot()
        items.append(slot)
        return slot
    }

    var value: PropertyList? {
        switch kind {
        case .empty: nil
        case .single: single
        case .array: .array(items.compactMap(\.value))
        case .object: .dictionary(pairs.compactMap { p in p.slot.value.map { (p.key, $0) } })
        }
    }
}

private struct SlotEncoder: Encoder {
    let slot: Slot
    let codingPath: [any CodingKey]
    var userInfo: [CodingUserInfoKey: Any] { [:] }

    func container<Key: CodingKey>(keyedBy type: Key.Type) -> KeyedEncodingContainer<Key> {
        slot.kind = .object
        return KeyedEncodingContainer(KeyedSlot<Key>(slot: slot, codingPath: codingPath))
    }

    func unkeyedContainer() -> any UnkeyedEncodingContainer {
        slot.kind = .array
        return UnkeyedSlot(slot: slot, codingPath: codingPath)
    }

    func singleValueContainer() -> any SingleValueEncodingContainer { SingleSlot(slot: slot, codingPath: codingPath) }
}

private struct KeyedSlot<Key: CodingKey>: KeyedEncodingContainerProtocol {
    let slot: Slot
    let codingPath: [any CodingKey]

    mutating func encodeNil(forKey key: Key) throws {
        throw EncodingError.invalidValue(Optional<Int>.none as Any, .init(codingPath: codingPath + [key], debugDescription: "JSON lines have no null"))
    }

    // One generic method stands for every primitive overload: each primitive encodes
    // itself through a single-value container (SingleSlot).
    mutating func encode<T: Encodable>(_ value: T, forKey key: Key) throws {
        try value.encode(to: SlotEncoder(slot: slot.child(key.stringValue), codingPath: codingPath + [key]))
    }

    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy keyType: NestedKey.Type, forKey key: Key) -> KeyedEncodingContainer<NestedKey> {
        SlotEncoder(slot: slot.child(key.stringValue), codingPath: codingPath + [key]).container(keyedBy: keyType)
    }

    mutating func nestedUnkeyedContainer(forKey key: Key) -> any UnkeyedEncodingContainer {
        SlotEncoder(slot: slot.child(key.stringValue), codingPath: codingPath + [key]).unkeyedContainer()
    }

    mutating func superEncoder() -> any Encoder { SlotEncoder(slot: slot.child("super"), codingPath: codingPath) }
    mutating func superEncoder(forKey key: Key) -> any Encoder { SlotEncoder(slot: slot.child(key.stringValue), codingPath: codingPath + [key]) }
}

private struct UnkeyedSlot: UnkeyedEncodingContainer {
    let slot: Slot
    let codingPath: [any CodingKey]
    var count: Int { slot.items.count }

    mutating func encodeNil() throws {
        throw EncodingError.invalidValue(Optional<Int>.none as Any, .init(codingPath: codingPath, debugDescription: "JSON lines have no null"))
    }

    mutating func encode<T: Encodable>(_ value: T) throws {
        try value.encode(to: SlotEncoder(slot: slot.appended(), codingPath: codingPath + [AnyKey(intValue: count)]))
    }

    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy keyType: NestedKey.Type) -> KeyedEncodingContainer<NestedKey> {
        SlotEncoder(slot: slot.appended(), codingPath: codingPath).container(keyedBy: keyType)
    }

    mutating func nestedUnkeyedContainer() -> any UnkeyedEncodingContainer {
        SlotEncoder(slot: slot.appended(), codingPath: codingPath).unkeyedContainer()
    }

    mutating func superEncoder() -> any Encoder { SlotEncoder(slot: slot.appended(), codingPath: codingPath) }
}

private struct SingleSlot: SingleValueEncodingContainer {
    let slot: Slot
    let codingPath: [any CodingKey]

    private func put(_ value: PropertyList) {
        slot.kind = .single
        slot.single = value
    }

    private func integer<T: BinaryInteger>(_ value: T) throws {
        guard let i = Int64(exactly: value) else {
            throw EncodingError.invalidValue(value, .init(codingPath: codingPath, debugDescription: "\(value) is out of range for JSON lines (64-bit integers)"))
        }
        put(.integer(i))
    }

    mutating func encodeNil() throws {
        throw EncodingError.invalidValue(Optional<Int>.none as Any, .init(codingPath: codingPath, debugDescription: "JSON lines have no null"))
    }
    mutating func encode(_ value: Bool) throws { put(.bool(value)) }
    mutating func encode(_ value: String) throws { put(.string(value)) }
    mutating func encode(_ value: Double) throws {
        guard value.isFinite else { throw EncodingError.invalidValue(value, .init(codingPath: codingPath, debugDescription: "JSON has no \(value)")) }
        put(.double(value))
    }
    mutating func encode(_ value: Float) throws { try encode(Double(value)) }
    mutating func encode(_ value: Int) throws { try integer(value) }
    mutating func encode(_ value: Int8) throws { try integer(value) }
    mutating func encode(_ value: Int16) throws { try integer(value) }
    mutating func encode(_ value: Int32) throws { try integer(value) }
    mutating func encode(_ value: Int64) throws { try integer(value) }
    mutating func encode(_ value: UInt) throws { try integer(value) }
    mutating func encode(_ value: UInt8) throws { try integer(value) }
    mutating func encode(_ value: UInt16) throws { try integer(value) }
    mutating func encode(_ value: UInt32) throws { try integer(value) }
    mutating func encode(_ value: UInt64) throws { try integer(value) }
    mutating func encode<T: Encodable>(_ value: T) throws {
        try value.encode(to: SlotEncoder(slot: slot, codingPath: codingPath))
    }
}

// MARK: decoding

struct PlistDecoder: Decoder {
    let value: PropertyList
    let codingPath: [any CodingKey]
    var userInfo: [CodingUserInfoKey: Any] { [:] }

    func mismatch(_ expected: String) -> DecodingError {
        .typeMismatch(PropertyList.self, .init(codingPath: codingPath, debugDescription: "expected \(expected), found \(value.json.prefix(80))"))
    }

    func container<Key: CodingKey>(keyedBy type: Key.Type) throws -> KeyedDecodingContainer<Key> {
        switch value {
        case .dictionary(let pairs): return KeyedDecodingContainer(KeyedPlist<Key>(pairs: pairs, codingPath: codingPath))
        case .data(let bytes): return KeyedDecodingContainer(KeyedPlist<Key>(pairs: [("$data", .string(Base64.encode(bytes)))], codingPath: codingPath))
        case .date(let millis): return KeyedDecodingContainer(KeyedPlist<Key>(pairs: [("$date", .string(ISODate.format(millis: millis)))], codingPath: codingPath))
        default: throw mismatch("an object")
        }
    }

    func unkeyedContainer() throws -> any UnkeyedDecodingContainer {
        guard case .array(let items) = value else { throw mismatch("an array") }
        return UnkeyedPlist(items: items, codingPath: codingPath)
    }

    func singleValueContainer() throws -> any SingleValueDecodingContainer { SinglePlist(decoder: self) }
}

private struct KeyedPlist<Key: CodingKey>: KeyedDecodingContainerProtocol {
    let pairs: [(String, PropertyList)]
    let codingPath: [any CodingKey]

    var allKeys: [Key] { pairs.compactMap { Key(stringValue: $0.0) } }
    func contains(_ key: Key) -> Bool { pairs.contains { $0.0 == key.stringValue } }

    private func child(_ key: Key) throws -> PlistDecoder {
        guard let found = pairs.first(where: { $0.0 == key.stringValue }) else {
            throw DecodingError.keyNotFound(key, .init(codingPath: codingPath, debugDescription: "no \"\(key.stringValue)\""))
        }
        return PlistDecoder(value: found.1, codingPath: codingPath + [key])
    }

    // Never null: a key that is there holds a value (the parser refuses null).
    func decodeNil(forKey key: Key) throws -> Bool { !contains(key) }

    // One generic method stands for every primitive overload (see KeyedSlot).
    func decode<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T { try T(from: child(key)) }

    func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type, forKey key: Key) throws -> KeyedDecodingContainer<NestedKey> {
        try child(key).container(keyedBy: type)
    }
    func nestedUnkeyedContainer(forKey key: Key) throws -> any UnkeyedDecodingContainer { try child(key).unkeyedContainer() }
    func superDecoder() throws -> any Decoder { PlistDecoder(value: .dictionary(pairs), codingPath: codingPath) }
    func superDecoder(forKey key: Key) throws -> any Decoder { try child(key) }
}

private struct UnkeyedPlist: UnkeyedDecodingContainer {
    let items: [PropertyList]
    let codingPath: [any CodingKey]
    var currentIndex = 0
    var count: Int? { items.count }
    var isAtEnd: Bool { currentIndex >= items.count }

    init(items: [PropertyList], codingPath: [any CodingKey]) {
        self.items = items
        self.codingPath = codingPath
    }

    private mutating func next() throws -> PlistDecoder {
        guard !isAtEnd else {
            throw DecodingError.valueNotFound(PropertyList.self, .init(codingPath: codingPath, debugDescription: "the array has \(items.count) items"))
        }
        defer { currentIndex += 1 }
        return PlistDecoder(value: items[currentIndex], codingPath: codingPath + [AnyKey(intValue: currentIndex)])
    }

    mutating func decodeNil() throws -> Bool { false }
    mutating func decode<T: Decodable>(_ type: T.Type) throws -> T { try T(from: next()) }
    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type) throws -> KeyedDecodingContainer<NestedKey> {
        try next().container(keyedBy: type)
    }
    mutating func nestedUnkeyedContainer() throws -> any UnkeyedDecodingContainer { try next().unkeyedContainer() }
    mutating func superDecoder() throws -> any Decoder { try next() }
}

private struct SinglePlist: SingleValueDecodingContainer {
    let decoder: PlistDecoder
    var codingPath: [any CodingKey] { decoder.codingPath }

    private func integer<T: FixedWidthInteger>(_ type: T.Type) throws -> T {
        guard case .integer(let i) = decoder.value else { throw decoder.mismatch("an integer") }
        guard let v = T(exactly: i) else {
            throw DecodingError.dataCorruptedError(in: self, debugDescription: "\(i) is out of range for \(T.self)")
        }
        return v
    }

    func decodeNil() -> Bool { false }
    func decode(_ type: Bool.Type) throws -> Bool {
        guard case .bool(let b) = decoder.value else { throw decoder.mismatch("true or false") }
        return b
    }
    func decode(_ type: String.Type) throws -> String {
        guard case .string(let s) = decoder.value else { throw decoder.mismatch("a string") }
        return s
    }
    func decode(_ type: Double.Type) throws -> Double {
        switch decoder.value {
        case .double(let d): return d
        case .integer(let i): return Double(i)
        default: throw decoder.mismatch("a number")
        }
    }
    func decode(_ type: Float.Type) throws -> Float { Float(try decode(Double.self)) }
    func decode(_ type: Int.Type) throws -> Int { try integer(type) }
    func decode(_ type: Int8.Type) throws -> Int8 { try integer(type) }
    func decode(_ type: Int16.Type) throws -> Int16 { try integer(type) }
    func decode(_ type: Int32.Type) throws -> Int32 { try integer(type) }
    func decode(_ type: Int64.Type) throws -> Int64 { try integer(type) }
    func decode(_ type: UInt.Type) throws -> UInt { try integer(type) }
    func decode(_ type: UInt8.Type) throws -> UInt8 { try integer(type) }
    func decode(_ type: UInt16.Type) throws -> UInt16 { try integer(type) }
    func decode(_ type: UInt32.Type) throws -> UInt32 { try integer(type) }
    func decode(_ type: UInt64.Type) throws -> UInt64 { try integer(type) }
    func decode<T: Decodable>(_ type: T.Type) throws -> T { try T(from: decoder) }
}
