import Glibc
@testable import UbiquityStore

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
