/// Where chunks are in the backing store (store format 10, backing format 5): a pack and
/// the offset of the chunk's bytes in it. Learned when this device uploads a chunk and
/// when it takes in another device's record (records carry the places of their chunks),
/// so a chunk already in a pack is named, not uploaded again, and a reader can fetch any
/// chunk with one ranged GET. The backing store's I/O is UbiquitySync's.
extension Store {
    /// The known places of `ids` (those without one are absent).
    public func chunkPlaces(_ ids: some Sequence<ChunkID>) throws(StoreError) -> [ChunkID: ChunkPlace] {
        var places: [ChunkID: ChunkPlace] = [:]
        for id in ids where places[id] == nil {
            if let place = try db.rows("SELECT pack, offset FROM chunk_places WHERE id = ?", [.blob(id.raw)], {
                ChunkPlace(pack: $0.text(0), offset: $0.int(1))
            }).first {
                places[id] = place
            }
        }
        return places
    }

    /// Records places (a newer one replaces an older: the chunk was uploaded again, into
    /// a new pack, because the old one was going away).
    public func setChunkPlaces(_ places: [ChunkID: ChunkPlace]) throws(StoreError) {
        guard !places.isEmpty else { return }
        try db.transaction { () throws(StoreError) in
            for (id, place) in places {
                try db.query("REPLACE INTO chunk_places(id, pack, offset) VALUES(?, ?, ?)",
                             [.blob(id.raw), .text(place.pack), .int(place.offset)])
            }
        }
    }

    /// Forgets the places in `pack` (it is gone from the backing store).
    public func forgetPlaces(inPack pack: String) throws(StoreError) {
        try db.query("DELETE FROM chunk_places WHERE pack = ?", [.text(pack)])
    }
}
