import Crypto
import UbiquityStore
import UbiquitySystem

/// Journal lines (docs/FORMAT.md, "Journal"): `U1 <sha256> key=value ...`. Decoding is
/// strict: a line from a shared directory is untrusted input, and anything doubtful is
/// rejected with a reason rather than half-applied.
public enum RecordCodec {
    public static let maxChunkSize = ChunkStore.maxChunkSize
    public static let maxParents = 64
    /// Chunks up to this size travel inside their record (`inline`, format 3), so the
    /// backing directory holds no object file per tiny chunk.
    public static let maxInline = Store.inlineChunkLimit

    /// A format-4 line (`U2`): keys left out when they hold their default (`kind=file`,
    /// `tomb=0`, `meta=0`, `device` = the journal's, a context that is the device's own
    /// previous dot), small chunks as their bytes in `chunks` (`=<hex>`), and a 128-bit
    /// checksum: a tiny file's version is about 300 bytes instead of 460 (docs/FORMAT.md).
    public static func encode(_ r: SyncRecord) -> String {
        // Written as bytes in place: every save passes here, and fields built as strings and
        // joined cost as much as the line's checksum (a small file's chunk is in the line).
        var line = Line(capacity: 400 + 2 * r.inline.values.reduce(0) { $0 + $1.count })
        line.field("id", r.id.hex)
        if r.kind != .file { line.field("kind", kindName(r.kind)) }
        if r.kind == .file { line.field("node", r.node.description) }
        line.key("parents")
        line.list(r.parents) { $0.text($1.hex) }
        line.key("name")
        line.percent(r.deviceName)
        line.field("committed", String(r.committed))
        line.field("mtime", String(r.mtime))
        line.field("mode", String(r.mode & 0o7777))
        if r.isTombstone { line.field("tomb", "1") }
        line.key("path")
        line.percent(r.path)
        if r.kind == .file {
            if r.isMeta { line.field("meta", "1") }
            line.field("size", String(r.chunks.totalSize))
            line.key("chunks")
            line.chunkItems(r.chunks, inline: r.inline, places: r.places)
        }
        if r.kind == .symlink {
            line.key("target")
            line.percent(r.target ?? "")
        }
        if !r.xattrs.isEmpty {
            line.key("xattrs")
            line.list(r.xattrs) { line, xattr in
                line.percent(xattr.name)
                line.byte(":")
                line.hex(xattr.value)
            }
        }
        if !r.lineage.isEmpty {
            line.field("dot", String(r.lineage.dot))
            if !r.lineage.isLinear(device: r.deviceID) {
                line.field("context", r.lineage.contextText)
            }
        }
        return line.finished()
    }

    /// A `U2` line as it is written: the body's fields, then the checksum put in front.
    private struct Line {
        private var body: [UInt8] = []

        init(capacity: Int) { body.reserveCapacity(capacity) }

        mutating func key(_ key: StaticString) {
            if !body.isEmpty { body.append(0x20) }
            body.append(contentsOf: UnsafeRawBufferPointer(start: key.utf8Start, count: key.utf8CodeUnitCount))
            body.append(UInt8(ascii: "="))
        }

        mutating func field(_ key: StaticString, _ value: String) {
            self.key(key)
            text(value)
        }

        mutating func text(_ text: String) { body.append(contentsOf: text.utf8) }

        mutating func byte(_ c: Unicode.Scalar) { body.append(UInt8(ascii: c)) }

        /// `items`, each written by `item`, separated by commas.
        mutating func list<T>(_ items: [T], _ item: (inout Line, T) -> Void) {
            for (i, element) in items.enumerated() {
                if i > 0 { byte(",") }
                item(&self, element)
            }
        }

        mutating func hex(_ bytes: [UInt8]) { bytes.withUnsafeBytes { Hex.append($0, to: &body) } }

        mutating func percent(_ text: String) { RecordCodec.appendPercent(text, to: &body) }

        /// The chunk list: a hole as `hole:<size>`; a chunk's first item as its bytes
        /// (`=<hex>`, inline) or `<id>:<size>@<pack>:<offset>` when its place is known;
        /// any other as `<id>:<size>`.
        mutating func chunkItems(_ list: ChunkList, inline: [ChunkID: [UInt8]], places: [ChunkID: ChunkPlace]) {
            var written: Set<ChunkID> = []
            for i in 0..<list.count {
                if i > 0 { byte(",") }
                if list.isHole(i) {
                    text("hole:")
                    text(String(list.size(i)))
                    continue
                }
                let id = list.ids[i]
                let first = written.insert(id).inserted
                if first, let bytes = inline[id] ?? list.inline[id] {
                    byte("=")
                    hex(bytes)
                    continue
                }
                text(id.hex)
                byte(":")
                text(String(list.size(i)))
                if first, let place = places[id] {
                    byte("@")
                    text(place.pack)
                    byte(":")
                    text(String(place.offset))
                }
            }
        }

        /// `U2 <checksum> <body>\n`.
        func finished() -> String {
            let digest = SHA256.hash(data: body)
            var line: [UInt8] = []
            line.reserveCapacity(body.count + 37)
            line.append(contentsOf: "U2 ".utf8)
            digest.withUnsafeBytes { Hex.append(UnsafeRawBufferPointer(rebasing: $0.prefix(16)), to: &line) }
            line.append(0x20)
            line.append(contentsOf: body)
            line.append(0x0A)
            return String(decoding: line, as: UTF8.self)
        }
    }

    /// Decodes one line (without its `\n`) from the journal of device `journalDevice`.
    public static func decode(_ line: ArraySlice<UInt8>, journalDevice: DeviceID) -> Result<SyncRecord, Rejection> {
        let bytes = Array(line)
        // U1 (formats 1-3): 64 hex digits of checksum; U2 (format 4): 32.
        let digits = bytes.starts(with: Array("U1 ".utf8)) ? 64 : bytes.starts(with: Array("U2 ".utf8)) ? 32 : 0
        guard digits > 0, bytes.count > digits + 4, bytes[digits + 3] == 0x20 else {
            return .failure(Rejection("not a U1 or U2 record line"))
        }
        let body = Array(bytes[(digits + 4)...])
        guard checksum(body, hexDigits: digits).utf8.elementsEqual(bytes[3..<digits + 3]) else {
            return .failure(Rejection("checksum mismatch"))
        }
        var fields: [String: String] = [:]
        for part in body.split(separator: 0x20) {
            guard let eq = part.firstIndex(of: UInt8(ascii: "=")) else { return .failure(Rejection("field without '='")) }
            let key = String(decoding: part[part.startIndex..<eq], as: UTF8.self)
            guard fields[key] == nil else { return .failure(Rejection("repeated key \(key)")) }
            fields[key] = String(decoding: part[(eq + 1)...], as: UTF8.self)
        }
        do throws(Rejection) {
            return .success(try record(fields, journalDevice: journalDevice))
        } catch {
            return .failure(error)
        }
    }

    public struct Rejection: Error, CustomStringConvertible {
        public let description: String
        init(_ description: String) { self.description = description }
    }

    private static func record(_ f: [String: String], journalDevice: DeviceID) throws(Rejection) -> SyncRecord {
        func field(_ key: String) throws(Rejection) -> String {
            guard let value = f[key] else { throw Rejection("missing key \(key)") }
            return value
        }
        func int(_ key: String) throws(Rejection) -> Int64 {
            guard let value = Int64(try field(key)) else { throw Rejection("\(key) is not a number") }
            return value
        }
        guard let id = VersionID(hex: try field("id")) else { throw Rejection("bad id") }
        // The journal's device is the record's; a `device` key may only repeat it.
        if let device = f["device"], device != journalDevice.hex {
            throw Rejection("device \(device.prefix(40)) writes in the journal of \(journalDevice)")
        }
        let device = journalDevice
        let kind: NodeKind
        switch f["kind"] ?? "file" {
        case "file": kind = .file
        case "dir": kind = .directory
        case "link": kind = .symlink
        default: throw Rejection("unknown kind")
        }
        let parentText = try field("parents").split(separator: ",")
        let parents = parentText.compactMap { VersionID(hex: $0) }
        guard parents.count <= maxParents, parents.count == parentText.count else { throw Rejection("bad parents") }
        guard let path = unpercent(try field("path")) else { throw Rejection("path is not valid percent-encoded UTF-8") }
        if let reason = SyncPath.problem(path) { throw Rejection("path \(printable(path)): \(reason)") }
        guard let name = unpercent(try field("name")) else { throw Rejection("bad device name") }
        let mode = try int("mode")
        guard (0...0o7777).contains(mode) else { throw Rejection("mode out of range") }
        let tomb = f["tomb"] ?? "0"
        guard tomb == "0" || tomb == "1" else { throw Rejection("tomb is not 0 or 1") }
        var record = SyncRecord(id: id, node: .directory(path), kind: kind, parents: parents, deviceID: device, deviceName: name,
                                committed: try int("committed"), mtime: try int("mtime"), mode: UInt32(mode),
                                isTombstone: tomb == "1", isMeta: f["meta"] == "1", path: path)
        switch kind {
        case .file:
            guard let node = FileID(hex: try field("node")) else { throw Rejection("bad node") }
            record.node = .file(node)
            let chunkText = try field("chunks")
            for item in chunkText.split(separator: ",") {
                if item.first == "=" {
                    // Format 4: a small chunk as its bytes; its id is their hash.
                    guard item.utf8.count > 1, item.utf8.count <= 2 * maxInline + 1, let bytes = Hex.decode(item.dropFirst()),
                          Int64(bytes.count) <= maxFileSize - record.chunks.totalSize else {
                        throw Rejection("bad chunk \(item.prefix(80))")
                    }
                    let id = ChunkID(hashing: bytes)
                    record.chunks.append(id, size: bytes.count)
                    record.inline[id] = bytes
                    continue
                }
                // Backing format 5: `@<pack>:<offset>` after a chunk says where it is.
                var item = item
                if let at = item.firstIndex(of: "@") {
                    let place = item[item.index(after: at)...].split(separator: ":", omittingEmptySubsequences: false)
                    guard place.count == 2, Hex.isLowercase(String(place[0]), count: 32), place[1].utf8.count <= 16,
                          let offset = Int64(place[1]), offset >= 8, offset <= 1 << 42 else {
                        throw Rejection("bad chunk place \(item.prefix(80))")
                    }
                    item = item[..<at]
                    guard let chunk = ChunkID(hex: String(item.split(separator: ":").first ?? "")), record.places[chunk] == nil else {
                        throw Rejection("bad chunk \(item.prefix(80))")
                    }
                    record.places[chunk] = ChunkPlace(pack: String(place[0]), offset: offset)
                }
                let parts = item.split(separator: ":")
                guard parts.count == 2, let size = Int64(parts[1]), size > 0,
                      size <= maxFileSize - record.chunks.totalSize else { throw Rejection("bad chunk \(item.prefix(80))") }
                if parts[0] == "hole" {
                    record.chunks.appendHole(size)
                } else {
                    guard let chunk = ChunkID(hex: String(parts[0])), chunk != .hole, size <= maxChunkSize else {
                        throw Rejection("bad chunk \(item.prefix(80))")
                    }
                    record.chunks.append(chunk, size: Int(size))
                }
            }
            guard record.chunks.totalSize == (try int("size")) else { throw Rejection("size does not match the chunks") }
            if let text = f["inline"], !text.isEmpty {
                for item in text.split(separator: ",") {
                    let parts = item.split(separator: ":", omittingEmptySubsequences: false)
                    guard parts.count == 2, let i = Int(parts[0]), i >= 0, i < record.chunks.count, !record.chunks.isHole(i),
                          parts[1].utf8.count <= 2 * maxInline, let bytes = Hex.decode(parts[1]),
                          Int64(bytes.count) == record.chunks.size(i), record.inline[record.chunks.ids[i]] == nil else {
                        throw Rejection("bad inline chunk \(item.prefix(80))")
                    }
                    guard ChunkID(hashing: bytes) == record.chunks.ids[i] else { throw Rejection("inline bytes of chunk \(i) do not match its hash") }
                    record.inline[record.chunks.ids[i]] = bytes
                }
            }
            for i in 0..<record.chunks.count where !record.chunks.isHole(i) {
                if let bytes = record.inline[record.chunks.ids[i]], Int64(bytes.count) != record.chunks.size(i) {
                    throw Rejection("chunk \(i) names carried bytes of another size")
                }
            }
            // The tiniest stay in the list (and so in the version row), never in a store.
            record.chunks.keepInline(record.inline)
        case .directory:
            record.node = .directory(path)
        default:
            record.node = .symlink(path)
            guard let target = unpercent(try field("target")), !target.isEmpty || record.isTombstone,
                  NameCodec.byteCount(target) < 4096, !target.utf8.contains(0) else { throw Rejection("bad symlink target") }
            record.target = record.isTombstone ? nil : target
        }
        if record.isTombstone && !record.chunks.ids.isEmpty { throw Rejection("a tombstone with content") }
        if let text = f["xattrs"], !text.isEmpty {
            for item in text.split(separator: ",") {
                let parts = item.split(separator: ":", omittingEmptySubsequences: false)
                guard parts.count == 2, let name = unpercent(String(parts[0])), !name.isEmpty, name.utf8.count <= 250,
                      !name.utf8.contains(0), let value = Hex.decode(parts[1]), value.count <= 65536 else {
                    throw Rejection("bad xattr")
                }
                record.xattrs.append(XattrEntry(name: name, value: value))
            }
        }
        // Format 4: the record's dot and context (Lineage); records from before have none.
        if let dot = f["dot"] {
            guard let counter = Lineage.counter(Substring(dot)) else { throw Rejection("bad dot") }
            if let text = f["context"] {
                guard let context = Lineage.parseContext(Substring(text)) else { throw Rejection("bad context") }
                record.lineage.context = context
            } else {
                record.lineage.context = Lineage.linear(device: device, dot: counter)
            }
            guard !record.lineage.contains(device: device, counter: counter) else { throw Rejection("the context holds the record's own dot") }
            record.lineage.dot = counter
        } else if f["context"] != nil {
            throw Rejection("a context without a dot")
        }
        return record
    }

    /// `<sha256>:<size>` per chunk, `hole:<length>` per hole (backing format 2), and
    /// `=<hex bytes>` for the first occurrence of a chunk in `inline` or kept inline by the
    /// list (format 4), and
    /// `@<pack>:<offset>` after the first occurrence of a chunk in `places` (format 5).
    static func kindName(_ kind: NodeKind) -> String {
        switch kind {
        case .directory: "dir"
        case .symlink: "link"
        default: "file"
        }
    }

    // MARK: encodings

    static func sha256Hex(_ bytes: [UInt8]) -> String { SHA256.hash(data: bytes).withUnsafeBytes { Hex.encode($0) } }

    /// A line's checksum: the first `hexDigits` hex digits of the body's SHA-256.
    static func checksum(_ body: [UInt8], hexDigits: Int) -> String { String(sha256Hex(body).prefix(hexDigits)) }

    public static func percent(_ text: String) -> String {
        var out: [UInt8] = []
        appendPercent(text, to: &out)
        return String(decoding: out, as: UTF8.self)
    }

    /// `text` with every byte but letters, digits and `._~-/` written as `%XX`.
    static func appendPercent(_ text: String, to out: inout [UInt8]) {
        let hexDigits: StaticString = "0123456789ABCDEF"
        for b in text.utf8 {
            switch b {
            case 0x41...0x5A, 0x61...0x7A, 0x30...0x39, UInt8(ascii: "."), UInt8(ascii: "_"), UInt8(ascii: "~"),
                 UInt8(ascii: "-"), UInt8(ascii: "/"):
                out.append(b)
            default:
                out.append(UInt8(ascii: "%"))
                out.append(hexDigits.utf8Start[Int(b >> 4)])
                out.append(hexDigits.utf8Start[Int(b & 15)])
            }
        }
    }

    public static func unpercent(_ text: String) -> String? {
        var out: [UInt8] = []
        let utf8 = Array(text.utf8)
        var i = 0
        while i < utf8.count {
            if utf8[i] == UInt8(ascii: "%") {
                guard i + 2 < utf8.count, let hi = Hex.value(utf8[i + 1]), let lo = Hex.value(utf8[i + 2]) else { return nil }
                out.append(hi << 4 | lo)
                i += 3
            } else {
                out.append(utf8[i])
                i += 1
            }
        }
        return String(validating: out, as: UTF8.self)
    }

    static func printable(_ text: String) -> String {
        String(text.unicodeScalars.prefix(80).map { $0.value < 0x20 || $0.value == 0x7F ? "?" : Character($0) })
    }
}

/// Which paths a record may name: inside the container, never a control entry, never a
/// local-only name. The one check every incoming path goes through.
public enum SyncPath {
    public static func problem(_ path: String) -> String? {
        let bytes = Array(path.utf8)
        if bytes.isEmpty { return "empty" }
        if NameCodec.byteCount(path) > 4096 { return "longer than 4096 bytes" }
        if bytes.contains(0) { return "contains NUL" }
        if bytes.first == UInt8(ascii: "/") || bytes.last == UInt8(ascii: "/") { return "starts or ends with '/'" }
        let components = PathBytes.components(path, keepingEmpty: true)
        for c in components {
            if c.isEmpty || c.utf8.elementsEqual(".".utf8) || c.utf8.elementsEqual("..".utf8) { return "has an empty, '.' or '..' component" }
            if NameCodec.byteCount(c) > 255 { return "has a component over 255 bytes" }
        }
        if [".versions", ".conflicts", ".kv"].contains(components.first) { return "names a control entry" }
        if LocalOnly.contains(path) { return "is local-only" }
        return nil
    }
}
