/// The content of a file being written from its start, in order (`cp`, `dd`, a download,
/// an archive being extracted): cut into chunks and stored as the bytes arrive, instead of
/// staged, read back and cut at the commit. Every byte is then written to disk once, not
/// twice, and the commit has only the last chunk or two left to cut.
///
/// The cuts are the ones `FileContent`'s commit would make (the store's chunker): a cut is
/// made only when `maxSize` bytes after the previous one are known, which is all the
/// chunker looks at. The chunks are hashed and stored on another thread (`ChunkWriter`).
/// Memory: the bytes not cut yet (less than `maxSize` plus one write) and the chunks
/// waiting for the writer.
struct SequentialStream {
    let chunker: Chunker

    /// Hashes and stores the chunks cut so far, in order, in the background.
    private let writer: ChunkWriter
    /// Bytes of the chunks cut so far, from offset 0.
    private var cutBytes: Int64 = 0
    /// Bytes after the last cut: `tail[tailStart...]`.
    private var tail: [UInt8]
    private var tailStart = 0

    /// Whether the chunks are shown to the store's observer (a file that syncs).
    private let announce: Bool

    init(startingWith bytes: [UInt8], store: ChunkStore, announce: Bool) {
        tail = bytes
        self.announce = announce
        chunker = store.chunker
        writer = ChunkWriter(store: store, announce: announce)
    }

    var size: Int64 { cutBytes + Int64(tail.count - tailStart) }
    var pendingBytes: ArraySlice<UInt8> { tail[tailStart...] }
    /// The chunks stored so far (gc keeps them while the file is open).
    var storedIDs: [ChunkID] { writer.storedIDs }

    /// Hands every chunk whose end the bytes so far decide to the writer. Throws when a
    /// chunk could not be stored (a full disk) and still cannot: nothing is lost then.
    mutating func cutComplete() throws(StoreError) {
        try writer.retry()
        let maxSize = chunker.maxSize
        while tail.count - tailStart >= maxSize {
            let start = tailStart
            let length = tail.withUnsafeBytes { raw in chunker.cut(UnsafeRawBufferPointer(rebasing: raw[start..<start + maxSize])) }
            writer.submit(Array(tail[start..<start + length]))
            tailStart += length
            cutBytes += Int64(length)
        }
        // Keep the buffer small: drop what was cut once it outweighs what is left.
        if tailStart > maxSize { tail.removeFirst(tailStart); tailStart = 0 }
    }

    mutating func append(_ data: UnsafeRawBufferPointer) { tail.append(contentsOf: data) }

    /// The chunks cut so far, once stored (waits for the writer).
    func storedChunks() throws(StoreError) -> ChunkList { try writer.finish() }

    /// The whole content as a chunk list: the pending bytes cut to their end and stored.
    func finished(into store: ChunkStore) throws(StoreError) -> ChunkList {
        var list = try writer.finish()
        var at = tailStart
        while at < tail.count {
            let start = at, end = min(tail.count, at + chunker.maxSize)
            let length = try withBytes(tail) { (raw) throws(StoreError) -> Int in
                let window = UnsafeRawBufferPointer(rebasing: raw[start..<end])
                let length = chunker.cut(window)
                try list.append(UnsafeRawBufferPointer(rebasing: window[0..<length])) { (id, chunk) throws(StoreError) in
                    try store.putWritten(id, chunk, announce: announce)
                }
                return length
            }
            at += length
        }
        return list
    }
}
