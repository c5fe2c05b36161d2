// swift-tools-version: 6.1
// Ubiquity: a versioned, synced FUSE filesystem. Layers (each knows only those below it):
//   CFuse, CSQLite   system libraries (pkg-config fuse3 / sqlite3), no C code of our own
//   TinyPix          pure codec: 8 bytes <-> ASCII grid
//   UbiquityStore    chunks, metadata database, versions, the synced view; no FUSE, no kernel inodes
//   UbiquitySync     replicates a store through a backing directory (docs/FORMAT.md)
//   UbiquityFS       POSIX semantics over the store; speaks Errno
//   UbiquityFUSE     the only importer of CFuse: ops table, replies, session
//   ubiquity         the command line
import PackageDescription

let package = Package(
    name: "Ubiquity",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "ubiquity", targets: ["ubiquity"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-crypto", from: "4.5.2"),
    ],
    targets: [
        .systemLibrary(name: "CFuse", pkgConfig: "fuse3", providers: [.apt(["libfuse3-dev"])]),
        .systemLibrary(name: "CSQLite", pkgConfig: "sqlite3", providers: [.apt(["libsqlite3-dev"])]),
        .target(name: "TinyPix"),
        .target(name: "UbiquityStore", dependencies: [
            "CSQLite",
            .product(name: "Crypto", package: "swift-crypto"),
        ]),
        .target(name: "UbiquitySync", dependencies: [
            "UbiquityStore",
            .product(name: "Crypto", package: "swift-crypto"),
        ]),
        .target(name: "UbiquityFS", dependencies: ["UbiquityStore", "TinyPix"]),
        .target(name: "UbiquityFUSE", dependencies: ["UbiquityFS", "CFuse"]),
        .executableTarget(name: "ubiquity", dependencies: [
            "UbiquityFUSE", "UbiquityFS", "UbiquitySync", "UbiquityStore", "TinyPix",
            .product(name: "ArgumentParser", package: "swift-argument-parser"),
        ]),
        .testTarget(name: "TinyPixTests", dependencies: ["TinyPix"]),
        .testTarget(name: "UbiquityStoreTests", dependencies: ["UbiquityStore"]),
        .testTarget(name: "UbiquityFSTests", dependencies: ["UbiquityFS"]),
        .testTarget(name: "UbiquitySyncTests", dependencies: ["UbiquitySync", "UbiquityFS"]),
    ]
)
