import Glibc

/// Names (and symlink targets) are byte strings on Linux: any byte but `/` and NUL. Swift
/// strings hold only valid Unicode, so a name's bytes become a string this way, and back:
///
/// - valid UTF-8 stays as it is (nearly every name);
/// - each byte of an invalid sequence becomes one scalar U+10FF80 + (byte - 0x80), from
///   the end of plane 16's private use area, which no real name uses;
/// - so that the mapping stays one-to-one, a name that really contains such a scalar has
///   its UTF-8 bytes escaped the same way.
///
/// `bytes(decode(b)) == b` for every byte string b. The store, the sync records and the
/// filesystem layer see only strings; only the FUSE boundary converts. Records carry the
/// string (valid UTF-8), so every device gets back the same bytes.
public enum NameCodec {
    static let escapes: ClosedRange<UInt32> = 0x10FF80...0x10FFFF

    public static func string(_ bytes: some Collection<UInt8>) -> String {
        if let text = String(validating: bytes, as: UTF8.self), !mayHoldEscapes(text) { return text }
        let raw = Array(bytes)
        var scalars = String.UnicodeScalarView()
        var parser = Unicode.UTF8.ForwardParser()
        var iterator = raw.makeIterator()
        var position = 0
        func escape(_ range: Range<Int>) {
            for byte in raw[range] { scalars.append(Unicode.Scalar(escapes.lowerBound + UInt32(byte - 0x80))!) }
        }
        loop: while true {
            switch parser.parseScalar(from: &iterator) {
            case .valid(let encoded):
                let scalar = Unicode.UTF8.decode(encoded)
                if escapes.contains(scalar.value) { escape(position..<position + encoded.count) } else { scalars.append(scalar) }
                position += encoded.count
            case .error(let length):
                escape(position..<position + length)
                position += length
            case .emptyInput:
                break loop
            }
        }
        return String(scalars)
    }

    /// `string` of bytes in memory: every name a request carries. Decoding a buffer of
    /// known type is specialized here (the generic form built the decoder's metadata at
    /// every call: 1.5 % of the daemon's CPU in an `rsync -a` of small files); bytes that
    /// come back the same are valid UTF-8.
    public static func string(_ bytes: UnsafeRawBufferPointer) -> String {
        var text = String(decoding: bytes.assumingMemoryBound(to: UInt8.self), as: UTF8.self)
        let unchanged = text.withUTF8 { utf8 in
            utf8.count == bytes.count && (bytes.isEmpty || memcmp(utf8.baseAddress!, bytes.baseAddress!, bytes.count) == 0)
        }
        if unchanged && !mayHoldEscapes(text) { return text }
        return string(Array(bytes))
    }

    public static func bytes(_ name: String) -> [UInt8] {
        guard mayHoldEscapes(name) else { return Array(name.utf8) }
        var out: [UInt8] = []
        out.reserveCapacity(name.utf8.count)
        for scalar in name.unicodeScalars {
            if escapes.contains(scalar.value) {
                out.append(UInt8(scalar.value - escapes.lowerBound + 0x80))
            } else {
                out += String(scalar).utf8
            }
        }
        return out
    }

    /// Whether the string may hold an escape scalar: each is 4 bytes of UTF-8 led by
    /// 0xF4 (U+100000 and up), so a string without that byte is its own bytes. Names are
    /// converted at every lookup and listing: this spares walking their scalars.
    public static func mayHoldEscapes(_ text: String) -> Bool {
        var text = text
        return text.withUTF8 { utf8 in utf8.baseAddress.map { memchr($0, 0xF4, utf8.count) != nil } ?? false }
    }

    /// The length of the name in bytes (what NAME_MAX and PATH_MAX count).
    public static func byteCount(_ name: String) -> Int {
        guard mayHoldEscapes(name) else { return name.utf8.count }
        var count = 0
        for scalar in name.unicodeScalars { count += escapes.contains(scalar.value) ? 1 : String(scalar).utf8.count }
        return count
    }
}
