import UbiquityStore
import UbiquitySystem

/// The thread that moves a store's chunk files into packs (`ChunkStore.moveChunkFilesIntoPacks`),
/// and whether it was asked to stop.
struct ChunkFileMover {
    var thread: JoinableThread?
    var stop = false
}

extension FileSystem {
    /// Starts moving the chunk files of a store from before format 18 into packs, in the
    /// background at low priority (a mount: nothing waits for it; files stay readable
    /// meanwhile). Nothing to do for a store without chunk files. The log says when it
    /// begins and ends.
    public func startMovingChunkFiles() {
        guard chunks.legacyFiles else { return }
        let mover = chunkFileMover
        let chunks = self.chunks
        mover.withLock { m in
            guard m.thread == nil else { return }
            m.thread = JoinableThread {
                lowerThreadPriority()
                let (files, bytes) = chunks.chunkFileCount()
                log("ubiquity: moving \(files) chunk files (\(byteText(bytes))) into local packs, in the background")
                let start = nowNanos()
                var lastLog = start
                do throws(StoreError) {
                    let moved = try chunks.moveChunkFilesIntoPacks(stop: { mover.withLock { $0.stop } }) { done in
                        let now = nowNanos()
                        guard now - lastLog >= 10_000_000_000 else { return }
                        lastLog = now
                        log("ubiquity: moving chunk files into local packs: \(done.files) of \(files) moved")
                    }
                    let tenths = (nowNanos() - start) / 100_000_000
                    if moved.finished {
                        log("ubiquity: moved \(moved.files) chunk files (\(byteText(moved.bytes))) into local packs in \(tenths / 10).\(tenths % 10) s")
                    } else if moved.left > 0 {
                        log("ubiquity: moved \(moved.files) chunk files into local packs; \(moved.left) left in place do not hold their chunk's bytes (`ubiquity fsck` names them)")
                    } else {
                        log("ubiquity: moved \(moved.files) chunk files into local packs; the rest at the next mount")
                    }
                } catch {
                    log("ubiquity: moving chunk files into local packs stopped: \(error) (the next mount goes on)")
                }
            }
        }
    }

    /// Stops the move (unmount): it ends after the file it is at, its last batch flushed.
    func stopMovingChunkFiles() {
        let thread = chunkFileMover.withLock { m -> JoinableThread? in
            m.stop = true
            defer { m.thread = nil }
            return m.thread
        }
        thread?.join()
    }
}
