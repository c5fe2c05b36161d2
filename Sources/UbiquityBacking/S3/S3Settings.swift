import Glibc
import UbiquitySystem

/// Where a bucket is and how to reach it, from `s3://BUCKET[/PREFIX]` and the AWS
/// conventions users already have (the AWS CLI's documented order):
/// - credentials: `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`/`AWS_SESSION_TOKEN`, else
///   the profile (`AWS_PROFILE`, default `default`) in `AWS_SHARED_CREDENTIALS_FILE` or
///   `~/.aws/credentials`;
/// - region: `AWS_REGION`, `AWS_DEFAULT_REGION`, the profile's `region` in
///   `AWS_CONFIG_FILE` or `~/.aws/config`, else `us-east-1`;
/// - endpoint: `AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL`, the profile's `endpoint_url`,
///   else AWS itself (`https://s3.REGION.amazonaws.com`, virtual-hosted addressing); a
///   custom endpoint (MinIO, Ceph, Garage, R2, ...) is addressed path-style;
/// - CA bundle: `AWS_CA_BUNDLE`, the profile's `ca_bundle`, else the system's CAs.
/// Secrets are kept here and in the signer only: `description` and every message name
/// the bucket, endpoint and key id's first characters, never the secret or the token.
public struct S3Settings: Sendable, CustomStringConvertible {
    public var bucket: String
    /// Keys live under it (no leading or trailing `/`; empty: the bucket's root).
    public var prefix: String
    public var region: String
    public var endpoint: Endpoint
    public var pathStyle: Bool
    public var caBundle: String?
    var credentials: SigV4.Credentials

    public struct Endpoint: Sendable, Equatable {
        public var secure: Bool
        public var host: String
        public var port: Int
        /// The Host header: host, with the port when it is not the scheme's default.
        var hostHeader: String { (secure && port == 443) || (!secure && port == 80) ? host : "\(host):\(port)" }
        var base: String { "\(secure ? "https" : "http")://\(hostHeader)" }
    }

    public var description: String {
        "s3://\(bucket)\(prefix.isEmpty ? "" : "/" + prefix) at \(endpoint.base) (\(region), key \(credentials.accessKey.prefix(4))…)"
    }

    /// Parses `s3://BUCKET[/PREFIX]`; nil when it is not one.
    public static func parseURL(_ url: String) -> (bucket: String, prefix: String)? {
        guard url.hasPrefix("s3://") else { return nil }
        let rest = url.dropFirst(5)
        let bucket = rest.prefix { $0 != "/" }
        // Bucket names: 3-63 of a-z 0-9 . - (S3's rules, which every compatible server keeps).
        guard (3...63).contains(bucket.count), bucket.allSatisfy({ $0.isASCII && ($0.isLowercase || $0.isNumber || $0 == "." || $0 == "-") })
        else { return nil }
        let prefix = rest.dropFirst(bucket.count).split(separator: "/").joined(separator: "/")
        // The prefix is part of every key: it must be one itself (no `.` or `..`).
        guard prefix.isEmpty || BackingKey(prefix) != nil else { return nil }
        return (String(bucket), prefix)
    }

    public struct ConfigError: Error, CustomStringConvertible {
        public let description: String
    }

    /// Resolves everything for `url` from `environment` and the AWS files under `home`.
    public static func resolve(url: String, environment: [String: String], home: String) throws(ConfigError) -> S3Settings {
        guard let (bucket, prefix) = parseURL(url) else {
            throw ConfigError(description: "\(url) is not an S3 URL: expected s3://BUCKET[/PREFIX] (bucket: 3-63 of a-z, 0-9, '.', '-')")
        }
        let profile = environment["AWS_PROFILE"] ?? "default"
        let credentialsFile = environment["AWS_SHARED_CREDENTIALS_FILE"] ?? home + "/.aws/credentials"
        let configFile = environment["AWS_CONFIG_FILE"] ?? home + "/.aws/config"
        let credentialSection = try iniSection(credentialsFile, profile)
        let configSection = try iniSection(configFile, profile == "default" ? "default" : "profile " + profile)

        let accessKey = environment["AWS_ACCESS_KEY_ID"] ?? credentialSection["aws_access_key_id"]
        let secretKey = environment["AWS_SECRET_ACCESS_KEY"] ?? credentialSection["aws_secret_access_key"]
        let token = environment["AWS_ACCESS_KEY_ID"] != nil ? environment["AWS_SESSION_TOKEN"] : credentialSection["aws_session_token"]
        guard let accessKey, !accessKey.isEmpty, let secretKey, !secretKey.isEmpty else {
            throw ConfigError(description: "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or put them in \(credentialsFile) under [\(profile)] (AWS_PROFILE picks the section)")
        }
        let region = environment["AWS_REGION"] ?? environment["AWS_DEFAULT_REGION"] ?? configSection["region"] ?? "us-east-1"
        guard !region.isEmpty, region.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "-") }) else {
            throw ConfigError(description: "the region '\(region)' is not a region name (e.g. us-east-1)")
        }
        var settings = S3Settings(bucket: bucket, prefix: prefix, region: region,
                                  endpoint: Endpoint(secure: true, host: "s3.\(region).amazonaws.com", port: 443), pathStyle: false,
                                  caBundle: environment["AWS_CA_BUNDLE"] ?? configSection["ca_bundle"],
                                  credentials: .init(accessKey: accessKey, secretKey: secretKey, sessionToken: token?.isEmpty == false ? token : nil))
        if let url = environment["AWS_ENDPOINT_URL_S3"] ?? environment["AWS_ENDPOINT_URL"] ?? configSection["endpoint_url"] {
            guard let endpoint = parseEndpoint(url) else {
                // Never echo what may hold a secret (https://KEY:SECRET@host): only the scheme.
                throw ConfigError(description: "the endpoint (AWS_ENDPOINT_URL or endpoint_url, starting '\(url.prefix { $0 != ":" })') is not an http(s)://HOST[:PORT] URL without a user or password")
            }
            settings.endpoint = endpoint
            settings.pathStyle = true
        } else if bucket.contains(".") {
            settings.pathStyle = true // a dotted bucket name breaks the TLS name of virtual hosts
        }
        return settings
    }

    static func parseEndpoint(_ url: String) -> Endpoint? {
        let secure: Bool
        let rest: Substring
        if url.hasPrefix("https://") { (secure, rest) = (true, url.dropFirst(8)) } else if url.hasPrefix("http://") { (secure, rest) = (false, url.dropFirst(7)) } else { return nil }
        let authority = rest.prefix { $0 != "/" }
        guard rest.dropFirst(authority.count).allSatisfy({ $0 == "/" }), !authority.isEmpty else { return nil }
        var host = authority, port = secure ? 443 : 80
        if let colon = authority.lastIndex(of: ":"), !authority.hasSuffix("]") {
            guard let p = Int(authority[authority.index(after: colon)...]), (1...65535).contains(p) else { return nil }
            port = p
            host = authority[..<colon]
        }
        guard !host.isEmpty, host.allSatisfy({ $0.isASCII && !$0.isWhitespace && $0 != "@" }) else { return nil }
        return Endpoint(secure: secure, host: String(host), port: port)
    }

    /// `key = value` lines of `[section]` in an INI file as the AWS CLI writes them; an
    /// absent file is an empty section. The file's size is bounded before it is read.
    static func iniSection(_ path: String, _ section: String) throws(ConfigError) -> [String: String] {
        let bytes: [UInt8]?
        do { bytes = try readFile(path, limit: 1 << 20) } catch { throw ConfigError(description: "cannot read \(path): \(error.reason)") }
        guard let bytes else { return [:] }
        var current: String?
        var out: [String: String] = [:]
        for raw in String(decoding: bytes, as: UTF8.self).split(whereSeparator: \.isNewline) {
            let line = raw.trimming(" \t")
            if line.isEmpty || line.hasPrefix("#") || line.hasPrefix(";") { continue }
            if line.hasPrefix("[") && line.hasSuffix("]") {
                current = line.dropFirst().dropLast().trimming(" \t")
                continue
            }
            guard current == section, let eq = line.firstIndex(of: "=") else { continue }
            out[line[..<eq].trimming(" \t").lowercased()] = line[line.index(after: eq)...].trimming(" \t")
        }
        return out
    }
}

extension StringProtocol {
    func trimming(_ set: String) -> String {
        let chars = Set(set)
        var s = self[...]
        while let f = s.first, chars.contains(f) { s = s.dropFirst() }
        while let l = s.last, chars.contains(l) { s = s.dropLast() }
        return String(s)
    }
}
