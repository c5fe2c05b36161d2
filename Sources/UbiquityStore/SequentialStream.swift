/// The content of a file being written from its start, in order (`cp`, `dd`, a download,
/// an archive being extracted): cut into chunks and stored as the bytes arrive, instead of
/// staged, read back and cut at the commit. Every byte is then written to disk once, not
/// twice, and the commit has only the last chunk or two left to cut.
///
/// The cuts are the ones `FileContent`'s commit would make (`Chunker.standard`): a cut is
/// made only when `maxSize` bytes after the previous one are known, which is all the
/// chunker looks at. Memory: the bytes not cut yet, less than `maxSize` plus one write.
struct SequentialStream {
    static let chunker = Chunker.standard

    /// The chunks cut so far, from offset 0.
    private(set) var chunks = ChunkList()
    /// Bytes after the last cut: `tail[tailStart...]`.
    private var tail: [UInt8]
    private var tailStart = 0

    init(startingWith bytes: [UInt8]) { tail = bytes }

    var size: Int64 { chunks.totalSize + Int64(tail.count - tailStart) }
    var pendingBytes: ArraySlice<UInt8> { tail[tailStart...] }

    /// Stores every chunk whose end the bytes so far decide. Throws what storing throws
    /// (a full disk); nothing is lost then, the bytes stay pending.
    mutating func cutComplete(into store: ChunkStore) throws(StoreError) {
        let maxSize = Self.chunker.maxSize
        while tail.count - tailStart >= maxSize {
            let start = tailStart
            let (id, length) = try withBytes(tail) { (raw) throws(StoreError) in
                try Self.cutAndStore(UnsafeRawBufferPointer(rebasing: raw[start..<start + maxSize]), into: store)
            }
            chunks.append(id, size: length)
            tailStart += length
        }
        // Keep the buffer small: drop what was cut once it outweighs what is left.
        if tailStart > maxSize { tail.removeFirst(tailStart); tailStart = 0 }
    }

    mutating func append(_ data: UnsafeRawBufferPointer) { tail.append(contentsOf: data) }

    /// The whole content as a chunk list: the pending bytes cut to their end and stored.
    func finished(into store: ChunkStore) throws(StoreError) -> ChunkList {
        var list = chunks
        var at = tailStart
        while at < tail.count {
            let start = at, end = min(tail.count, at + Self.chunker.maxSize)
            let (id, length) = try withBytes(tail) { (raw) throws(StoreError) in
                try Self.cutAndStore(UnsafeRawBufferPointer(rebasing: raw[start..<end]), into: store)
            }
            list.append(id, size: length)
            at += length
        }
        return list
    }

    /// Cuts the chunk that starts `window` (at most `maxSize` bytes, or the rest of the
    /// input) and stores it.
    private static func cutAndStore(_ window: UnsafeRawBufferPointer, into store: ChunkStore) throws(StoreError) -> (ChunkID, Int) {
        let length = chunker.cut(window)
        let chunk = UnsafeRawBufferPointer(rebasing: window[0..<length])
        let id = ChunkID(hashing: chunk)
        try store.put(id, chunk)
        return (id, length)
    }
}
