import Testing
@testable import UbiquityBacking

/// Golden vectors: AWS's own S3 example (GET with a Range) and three requests signed by
/// botocore 1.43 (S3SigV4Auth, time pinned): a path-style PUT with If-None-Match and a key
/// that needs encoding, a list with an encoded query, a DELETE with a session token.
@Suite struct SigV4Tests {
    func authorization(_ signer: SigV4, _ method: String, _ path: String, _ query: [(String, String)], _ headers: [(String, String)],
                       body: [UInt8] = [], time: Int64) -> String {
        let added = signer.sign(method: method, path: path, query: query, headers: headers,
                                payloadHash: SigV4.payloadHash(body), time: UTCTime(seconds: time))
        return added.first { $0.0 == "Authorization" }!.1
    }

    @Test func awsDocumentedExample() {
        let signer = SigV4(credentials: .init(accessKey: "AKIAIOSFODNN7EXAMPLE", secretKey: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", sessionToken: nil),
                           region: "us-east-1")
        let auth = authorization(signer, "GET", "/test.txt", [], [("Host", "examplebucket.s3.amazonaws.com"), ("Range", "bytes=0-9")],
                                 time: 1_369_353_600) // 2013-05-24T00:00:00Z
        #expect(auth == "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
            + "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41")
    }

    @Test func botocoreVectors() {
        let time: Int64 = 1_795_688_430 // 2026-11-26T10:20:30Z
        #expect(UTCTime(seconds: time).amzDate == "20261126T102030Z")
        let signer = SigV4(credentials: .init(accessKey: "AKIDEXAMPLE", secretKey: "secret/with+chars", sessionToken: nil), region: "eu-central-1")
        let put = authorization(signer, "PUT", "/bucket/" + SigV4.encode("dir/a b+c~.pack", slash: false), [],
                                [("Host", "127.0.0.1:7480"), ("If-None-Match", "*")], body: Array("hello world".utf8), time: time)
        #expect(put.hasSuffix("SignedHeaders=host;if-none-match;x-amz-content-sha256;x-amz-date, Signature=1e81f305690b9cefd064acbd10e1c176cca681c410b5087f196e86bb73a70d1a"))
        let list = authorization(signer, "GET", "/bucket",
                                 [("list-type", "2"), ("prefix", "devices/ab/"), ("start-after", "devices/ab/seg-1"), ("max-keys", "1000")],
                                 [("Host", "127.0.0.1:7480")], time: time)
        #expect(list.hasSuffix("Signature=081a3b8410362512da1636f07ccfcce6a23d0a8ea209ba59168fc86be68e9ae1"))
        let temporary = SigV4(credentials: .init(accessKey: "ASIAEXAMPLE", secretKey: "sk", sessionToken: "TOKEN/with=chars"), region: "eu-central-1")
        let delete = authorization(temporary, "DELETE", "/b/k", [], [("Host", "s3.eu-central-1.amazonaws.com")], time: time)
        #expect(delete.hasSuffix("SignedHeaders=host;x-amz-content-sha256;x-amz-date;x-amz-security-token, Signature=b28029f58f5e9726775655e4eb8fcd83c3c43e7c0a70c3e204a1d712f824f707"))
    }

    @Test func httpDates() {
        #expect(UTCTime(httpDate: "Thu, 26 Nov 2026 10:20:30 GMT")?.seconds == 1_795_688_430)
        #expect(UTCTime(httpDate: "Sun, 06 Nov 1994 08:49:37 GMT")?.amzDate == "19941106T084937Z")
        for bad in ["", "yesterday", "Thu, 32 Nov 2026 10:20:30 GMT", "Thu, 26 Foo 2026 10:20:30 GMT", "Thu, 26 Nov 99999999999999999999 10:20:30 GMT",
                    "Thu, 26 Nov 2026 25:20:30 GMT", "Thu, 26 Nov 2026 10:20 GMT", "Thu, 26 Nov 2026 10:20:30 PST"] {
            #expect(UTCTime(httpDate: bad) == nil, "\(bad)")
        }
    }
}
