import TinyPix
import UbiquityStore
import UbiquitySystem

/// `.tinypix` files read and write as ASCII grids through the mount (DESIGN §1.2) while
/// the store keeps the app's 8-byte form, which is what syncs. One place for the rule.
///
/// How: an open `.tinypix` file's content is the *view* (the grid, or what a program
/// wrote); each commit encodes the view back to 8 bytes, and a view that is neither a
/// grid nor 8 raw bytes is refused (EINVAL), leaving the stored picture as it was.
/// A stored file that is not 8 bytes is shown as it is.
enum TinyPixView {
    /// Files this applies to, by name.
    static func applies(to name: String) -> Bool { name.hasSuffix(".tinypix") }

    /// What a reader sees: the grid for 8 stored bytes, else the stored bytes.
    static func view(of stored: ChunkList, chunks: ChunkStore) throws(StoreError) -> ChunkList {
        guard stored.totalSize == Int64(TinyPix.storedSize) else { return stored }
        let bytes = try read(stored, chunks)
        guard let grid = TinyPix.render(bytes) else { return stored }
        return try put(grid, chunks)
    }

    /// The size a reader sees for a stored size.
    static func viewSize(storedSize: Int64) -> Int64 {
        storedSize == Int64(TinyPix.storedSize) ? Int64(TinyPix.gridSize) : storedSize
    }

    /// The stored form of what was written. An empty file stays empty (`touch`); anything
    /// else must be a grid or exactly 8 bytes.
    static func stored(from view: ChunkList, chunks: ChunkStore, path: String) throws(StoreError) -> ChunkList {
        if view.totalSize == 0 { return view }
        guard view.totalSize <= 64 << 10 else {
            throw .invalidContent("\(path): refused: \(view.totalSize) bytes is not a TinyPix picture (write an 8x8 grid of '#' and '.', or 8 raw bytes)")
        }
        switch TinyPix.encode(try read(view, chunks)) {
        case .success(let bytes): return try put(bytes, chunks)
        case .failure(let error): throw .invalidContent("\(path): refused: \(error)")
        }
    }

    /// `tinypix`: "grid" when shown as a grid, "as-is" when the stored file is not 8 bytes;
    /// `raw`: the stored bytes in hex (the raw 8 bytes stay reachable from the mount).
    static func addStatus(_ status: inout [String: String], inode: Inode, store: any FileSystemStore) throws(Errno) {
        guard let row = inode.head else { return }
        guard inode.size <= 64 else { status["tinypix"] = "as-is"; return }
        let bytes = try storeCall { () throws(StoreError) in try read(try store.chunkList(row: row), store.chunks) }
        status["tinypix"] = bytes.count == TinyPix.storedSize ? "grid" : "as-is"
        if bytes.count <= 64 {
            status["raw"] = Hex.encode(bytes)
        }
    }

    /// A small file's bytes (callers check the size: at most 64 KiB).
    private static func read(_ list: ChunkList, _ chunks: ChunkStore) throws(StoreError) -> [UInt8] {
        try chunks.bytes(of: list, limit: 64 << 10)
    }

    private static func put(_ bytes: [UInt8], _ chunks: ChunkStore) throws(StoreError) -> ChunkList {
        try chunks.listOfOneChunk(bytes)
    }
}
