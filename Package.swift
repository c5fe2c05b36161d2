// swift-tools-version: 6.2
// Ubiquity: a versioned, synced FUSE filesystem. Layers (each knows only those below it):
//   CFuse, CSQLite   system libraries (pkg-config fuse3 / sqlite3)
//   CUbiquity          Linux calls Swift's Glibc module hides (_GNU_SOURCE): a few C lines
//   UbiquitySystem   POSIX helpers every layer shares: EINTR loops, atomic writes, the mount table
//   TinyPix          pure codec: 8 bytes <-> ASCII grid
//   UbiquityCrypto   the container key, sealing objects, key files; no I/O
//   UbiquityStore    chunks, metadata database, versions, the synced view; no FUSE, no kernel inodes
//   UbiquityBacking  the storage seam: a backing store protocol and its implementations
//                    (directory, S3, memory with faults, encryption over any), one
//                    conformance suite for all
//   UbiquitySync     replicates a store through a backing directory (docs/FORMAT.md)
//   UbiquityFS       POSIX semantics over the store; speaks Errno
//   UbiquityFUSE     the only importer of CFuse: ops table, replies, session
//   UbiquityDaemon   a mount daemon's assembly (Daemon.serve) and its control socket
//   ubiquity         the command line: parses arguments, calls the layers above
import PackageDescription

// Our own code builds without a single warning (scripts/test.sh also checks that every
// import is declared here: --explicit-target-dependency-import-check error).
let strict: [SwiftSetting] = [.treatAllWarnings(as: .error)]

let package = Package(
    name: "Ubiquity",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "ubiquity", targets: ["ubiquity"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-crypto", from: "4.5.2"),
        // S3 (UbiquityBacking): a well-kept HTTP client (connection reuse, timeouts, TLS
        // with the system's CAs) rather than hand-written HTTP; NIO for its types.
        .package(url: "https://github.com/swift-server/async-http-client", from: "1.37.0"),
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.2"),
        .package(url: "https://github.com/apple/swift-nio-ssl", from: "2.37.6"),
    ],
    targets: [
        .systemLibrary(name: "CFuse", pkgConfig: "fuse3", providers: [.apt(["libfuse3-dev"])]),
        .systemLibrary(name: "CSQLite", pkgConfig: "sqlite3", providers: [.apt(["libsqlite3-dev"])]),
        .target(name: "CUbiquity"),
        .target(name: "UbiquitySystem", dependencies: ["CUbiquity"], swiftSettings: strict),
        .target(name: "TinyPix", swiftSettings: strict),
        .target(name: "UbiquityCrypto", dependencies: [
            "UbiquitySystem",
            .product(name: "Crypto", package: "swift-crypto"),
            .product(name: "CryptoExtras", package: "swift-crypto"),
        ], swiftSettings: strict),
        .target(name: "UbiquityStore", dependencies: [
            "CSQLite", "UbiquitySystem",
            .product(name: "Crypto", package: "swift-crypto"),
        ], swiftSettings: strict),
        .target(name: "UbiquityBacking", dependencies: [
            "UbiquitySystem", "UbiquityCrypto",
            .product(name: "Crypto", package: "swift-crypto"),
            .product(name: "AsyncHTTPClient", package: "async-http-client"),
            .product(name: "NIOCore", package: "swift-nio"),
            .product(name: "NIOHTTP1", package: "swift-nio"),
            .product(name: "NIOSSL", package: "swift-nio-ssl"),
        ], swiftSettings: strict),
        .target(name: "UbiquitySync", dependencies: [
            "UbiquityBacking", "UbiquityCrypto", "UbiquityStore", "UbiquitySystem",
            .product(name: "Crypto", package: "swift-crypto"),
        ], swiftSettings: strict),
        .target(name: "UbiquityFS", dependencies: ["UbiquityStore", "UbiquitySystem", "TinyPix"], swiftSettings: strict),
        .target(name: "UbiquityFUSE", dependencies: ["UbiquityFS", "UbiquityStore", "UbiquitySystem", "CFuse"], swiftSettings: strict),
        .target(name: "UbiquityDaemon", dependencies: [
            "UbiquityFUSE", "UbiquityFS", "UbiquitySync", "UbiquityBacking", "UbiquityCrypto", "UbiquityStore", "UbiquitySystem",
        ], swiftSettings: strict),
        .executableTarget(name: "ubiquity", dependencies: [
            "UbiquityDaemon", "UbiquityBacking", "UbiquityFS", "UbiquitySync", "UbiquityStore", "UbiquitySystem", "TinyPix",
            .product(name: "ArgumentParser", package: "swift-argument-parser"),
        ], swiftSettings: strict),
        // Builds large containers through the store API for scripts/bench-scale.sh.
        .executableTarget(name: "ubiquity-bench-fill", dependencies: ["UbiquityStore", "UbiquitySystem"],
                          swiftSettings: strict),
        // Helpers the test targets share (seeded generators, temp directories).
        .target(name: "TestSupport", path: "Tests/TestSupport", swiftSettings: strict),
        .testTarget(name: "TinyPixTests", dependencies: ["TinyPix", "TestSupport"], swiftSettings: strict),
        .testTarget(name: "UbiquityCryptoTests", dependencies: [
            "UbiquityCrypto", "UbiquitySystem", .product(name: "Crypto", package: "swift-crypto"),
        ], swiftSettings: strict),
        .testTarget(name: "UbiquityStoreTests", dependencies: ["UbiquityStore", "UbiquitySystem", "TestSupport"], swiftSettings: strict),
        .testTarget(name: "UbiquityFSTests", dependencies: ["UbiquityFS", "UbiquityStore", "UbiquitySystem", "TestSupport"], swiftSettings: strict),
        .testTarget(name: "UbiquityBackingTests", dependencies: ["UbiquityBacking", "UbiquityCrypto", "UbiquitySystem", "TestSupport"], swiftSettings: strict),
        .testTarget(name: "UbiquityDaemonTests", dependencies: ["UbiquityDaemon", "UbiquityFS", "UbiquityStore", "UbiquitySystem", "TestSupport"], swiftSettings: strict),
        .testTarget(name: "UbiquitySyncTests", dependencies: ["UbiquitySync", "UbiquityBacking", "UbiquityCrypto", "UbiquityFS", "UbiquityStore", "UbiquitySystem", "TestSupport"], swiftSettings: strict),
    ]
)
