import Glibc
@testable import UbiquityStore

/// Deterministic bytes for tests (SplitMix64), so golden vectors stay fixed.
struct SeededBytes {
    var state: UInt64
    init(seed: UInt64) { state = seed }

    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    mutating func bytes(_ count: Int) -> [UInt8] {
        var out = [UInt8]()
        out.reserveCapacity(count + 8)
        while out.count < count { withUnsafeBytes(of: next()) { out += $0 } }
        return Array(out.prefix(count))
    }

    mutating func int(_ range: Range<Int>) -> Int { range.lowerBound + Int(next() % UInt64(range.count)) }
}

/// A fresh temporary directory, removed by `cleanup()`.
struct TempDirectory {
    let path: String
    init() {
        var template = Array("/tmp/ubiquity-unit-XXXXXX".utf8CString)
        path = String(cString: mkdtemp(&template)!)
    }
    func cleanup() { _ = system("rm -rf '\(path)'") }
}

@_silgen_name("system") func system(_ command: UnsafePointer<CChar>) -> Int32

/// All cut lengths of `data` with `chunker`.
func cuts(_ data: [UInt8], _ chunker: Chunker = .standard) -> [Int] {
    var result: [Int] = []
    data.withUnsafeBytes { raw in
        var pos = 0
        while pos < raw.count {
            let window = UnsafeRawBufferPointer(rebasing: raw[pos..<min(raw.count, pos + chunker.maxSize)])
            let n = chunker.cut(window)
            result.append(n)
            pos += n
        }
    }
    return result
}
