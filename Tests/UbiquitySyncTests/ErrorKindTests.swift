import Glibc
import Testing
import TestSupport
import UbiquityBacking
import UbiquitySystem
@testable import UbiquityFS
@testable import UbiquityStore
@testable import UbiquitySync

/// A backing store's error keeps its kind on the way up: the engine's error says
/// whether a retry can help, the status attribute (`ubiquity status`) shows that kind and
/// what to do, and errno comes from the kind in one place.
@Suite struct ErrorKindTests {
    @Test func everyBackingErrorKeepsItsKind() {
        let cases: [(BackingError, BackingFailure.Kind, Int32)] = [
            (.notFound("k"), .notFound, EIO), (.exists("k"), .exists, EIO),
            (.transient("timeout"), .retryable, EIO), (.garbage("bad XML"), .retryable, EIO),
            (.permanent("AccessDenied"), .permanent, EIO),
        ]
        for (backing, kind, code) in cases {
            let error = Backing.storeError(backing, "put log/x")
            guard case .backing(let failure) = error else {
                Issue.record("\(backing) became \(error)")
                continue
            }
            #expect(failure.kind == kind, "\(backing)")
            #expect(error.isRetryable == backing.isRetryable, "\(backing)")
            #expect(error.errno.code == code, "\(backing)")
            #expect("\(error)".hasPrefix("put log/x: "), "\(error)")
        }
    }

    @Test func statusSaysWhetherSyncRetriesByItself() throws {
        let temp = TempDirectory(prefix: "ubiquity-error-kind")
        defer { temp.cleanup() }
        let store = RecordingStore(MemoryStore())
        let device = try SimDevice(name: "a", root: temp.path, backing: store, clock: nowNanos, options: SimDevice.alwaysPolling)
        func field(_ key: String) -> String? {
            device.engine.statusText().split(separator: "\n").first { $0.hasPrefix(key + "=") }.map { String($0.dropFirst(key.count + 1)) }
        }
        let faults: [(BackingError, String)] = [(.transient("injected: connection refused"), "retryable"),
                                                (.permanent("injected: AccessDenied"), "permanent")]
        for (fault, kind) in faults {
            try device.save("notes-\(kind).txt", "a save while the store fails")
            store.setFault { op, _ in op == .put ? .before(fault) : nil }
            #expect(throws: StoreError.self) { try device.engine.cycle(pushPull: true, force: true) }
            #expect(field("state") == "offline")
            #expect(field("error-kind") == kind, "\(device.engine.statusText())")
            #expect(field("error")?.contains("injected") == true)
            #expect(field("error-advice")?.isEmpty == false)
        }
        store.setFault(nil)
        try device.engine.cycle(pushPull: true, force: true)
        #expect(field("state") == "syncing")
        #expect(field("error") == "" && field("error-kind") == "" && field("error-advice") == "")
    }
}
