import Glibc
import UbiquityBacking

/// What `--backing` names: `s3://BUCKET[/PREFIX]` (credentials, region and endpoint from
/// the AWS environment variables and files, as the AWS CLI reads them) or a directory.
/// The one place that turns the option into a store, for `mount` and `fsck`.
public enum BackingChoice {
    /// The AWS variables S3Settings reads; nothing else of the environment is passed.
    public static let awsVariables = [
        "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_REGION",
        "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_CA_BUNDLE",
        "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE",
    ]

    public static func isURL(_ text: String) -> Bool { text.contains("://") }

    /// The store, metered (for `ubiquity status`) inside bounded retries. `check`: a first
    /// request now, so a wrong bucket, region, endpoint or key fails with a message that
    /// says what to fix instead of a mount that is offline from its first second.
    public static func open(_ text: String, check: Bool) throws -> any BackingStore {
        let base: any BackingStore
        if text.hasPrefix("s3://") {
            var environment: [String: String] = [:]
            for name in awsVariables { if let value = Paths.env(name) { environment[name] = value } }
            let settings: S3Settings
            do { settings = try S3Settings.resolve(url: text, environment: environment, home: Paths.env("HOME") ?? "/") } catch {
                throw DaemonError.setting("--backing \(text): \(error)")
            }
            let s3: S3Store
            do { s3 = try S3Store(settings: settings) } catch { throw DaemonError.setting("--backing \(text): \(error)") }
            if check {
                do { try RetryingStore(s3, attempts: 3).checkAccess(s3) } catch {
                    throw DaemonError.backing("--backing \(text) (endpoint \(settings.endpoint.host):\(settings.endpoint.port), region \(settings.region))", error)
                }
            }
            base = s3
        } else if isURL(text) {
            throw DaemonError.setting("--backing \(text): not a backing store this version knows: give a directory or s3://BUCKET[/PREFIX]")
        } else {
            base = DirectoryStore(root: Paths.absolute(text))
        }
        return RetryingStore(MeteredStore(base))
    }
}

extension RetryingStore {
    /// `S3Store.checkAccess` with this store's retries (a server that is starting, a
    /// first connection reset, does not fail a mount).
    public func checkAccess(_ s3: S3Store) throws(BackingError) {
        try retrying { () throws(BackingError) in try s3.checkAccess() }
    }
}
