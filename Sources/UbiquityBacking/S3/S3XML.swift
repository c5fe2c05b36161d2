/// The few S3 XML answers this client reads, by a small scanner rather than a general
/// parser: the documents are flat and fixed (ListBucketResult, Error,
/// InitiateMultipartUploadResult, ListMultipartUploadsResult), and every value is checked
/// before use. Anything it cannot make sense of is `nil` (the caller's `.garbage`), never
/// a trap or a loop: it only moves forward through a bounded document (S3XMLTests fuzzes
/// it).
enum S3XML {
    /// The text of every `<name>…</name>` in `xml` (or in each block given), entities
    /// decoded, in order. An element with attributes (`<name a="b">`) counts too.
    static func values(_ name: String, in xml: Substring) -> [String]? {
        var out: [String] = []
        var rest = xml[...]
        let close = "</\(name)>"
        while let open = rest.firstRange(of: "<\(name)") {
            let after = rest[open.upperBound...]
            guard let first = after.first else { return nil }
            if first != ">" && first != " " && first != "/" {
                // Another element whose name starts the same (<Key> vs <KeyMarker>).
                rest = after
                continue
            }
            guard let endOfTag = after.firstIndex(of: ">") else { return nil }
            if endOfTag > after.startIndex && after[after.index(before: endOfTag)] == "/" { // <name/>: empty
                out.append("")
                rest = after[after.index(after: endOfTag)...]
                continue
            }
            let body = after[after.index(after: endOfTag)...]
            guard let end = body.firstRange(of: close) else { return nil }
            guard let text = decode(body[..<end.lowerBound]) else { return nil }
            out.append(text)
            rest = body[end.upperBound...]
        }
        return out
    }

    static func value(_ name: String, in xml: Substring) -> String? { values(name, in: xml)?.first }

    /// The raw text of every `<name>…</name>` block (for repeated groups like <Contents>).
    static func blocks(_ name: String, in xml: Substring) -> [Substring]? {
        var out: [Substring] = []
        var rest = xml[...]
        while let open = rest.firstRange(of: "<\(name)>") {
            guard let end = rest[open.upperBound...].firstRange(of: "</\(name)>") else { return nil }
            out.append(rest[open.upperBound..<end.lowerBound])
            rest = rest[end.upperBound...]
        }
        return out
    }

    /// XML text: the five named entities and numeric references; markup inside is an
    /// error (a value never holds an element here).
    static func decode(_ text: Substring) -> String? {
        guard text.contains("&") || text.contains("<") else { return String(text) }
        var out = ""
        var i = text.startIndex
        while i < text.endIndex {
            let c = text[i]
            if c == "<" { return nil }
            guard c == "&" else { out.append(c); i = text.index(after: i); continue }
            guard let semi = text[i...].firstIndex(of: ";"), text.distance(from: i, to: semi) <= 12 else { return nil }
            let entity = text[text.index(after: i)..<semi]
            switch entity {
            case "amp": out.append("&")
            case "lt": out.append("<")
            case "gt": out.append(">")
            case "quot": out.append("\"")
            case "apos": out.append("'")
            default:
                guard entity.hasPrefix("#") else { return nil }
                let digits = entity.dropFirst()
                let code = digits.hasPrefix("x") ? UInt32(digits.dropFirst(), radix: 16) : UInt32(digits)
                guard let code, let scalar = Unicode.Scalar(code), code != 0 else { return nil }
                out.unicodeScalars.append(scalar)
            }
            i = text.index(after: semi)
        }
        return out
    }

    struct Listing {
        var objects: [(key: String, size: Int64)]
        var truncated: Bool
    }

    /// ListObjectsV2's answer. Sizes must be whole numbers within S3's 5 TiB object limit.
    static func listing(_ xml: Substring) -> Listing? {
        guard xml.contains("<ListBucketResult"), let truncated = value("IsTruncated", in: xml),
              truncated == "true" || truncated == "false", let contents = blocks("Contents", in: xml) else { return nil }
        var objects: [(String, Int64)] = []
        for block in contents {
            guard let key = value("Key", in: block), let sizeText = value("Size", in: block),
                  let size = Int64(sizeText), size >= 0, size <= 5 << 40 else { return nil }
            objects.append((key, size))
        }
        return Listing(objects: objects, truncated: truncated == "true")
    }

    /// An error document's code and message ("NoSuchBucket", "The specified bucket …").
    static func error(_ xml: Substring) -> (code: String, message: String)? {
        guard xml.contains("<Error"), let code = value("Code", in: xml) else { return nil }
        return (code, value("Message", in: xml) ?? "")
    }
}
