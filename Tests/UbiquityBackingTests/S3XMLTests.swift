import Testing
import TestSupport
@testable import UbiquityBacking

/// The XML scanner on real answers, on hostile ones, and fuzzed: random mutations of real
/// documents never trap or hang, and whatever parses has checked values.
@Suite struct S3XMLTests {
    static let listing = """
    <?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>b</Name>\
    <Prefix>p/</Prefix><KeyCount>2</KeyCount><MaxKeys>1000</MaxKeys><IsTruncated>true</IsTruncated>\
    <Contents><Key>p/a&amp;b</Key><LastModified>2026-11-26T10:00:00.000Z</LastModified><ETag>&quot;x&quot;</ETag><Size>12</Size>\
    <StorageClass>STANDARD</StorageClass></Contents><Contents><Key>p/&#x65e5;</Key><Size>0</Size></Contents>\
    <KeyMarker>m</KeyMarker></ListBucketResult>
    """
    static let error = """
    <?xml version="1.0" encoding="UTF-8"?><Error><Code>NoSuchBucket</Code><Message>The specified bucket does not exist</Message>\
    <BucketName>b</BucketName><RequestId>tx1</RequestId></Error>
    """

    @Test func realAnswers() throws {
        let l = try #require(S3XML.listing(Self.listing[...]))
        #expect(l.truncated && l.objects.map(\.key) == ["p/a&b", "p/日"] && l.objects.map(\.size) == [12, 0])
        let e = try #require(S3XML.error(Self.error[...]))
        #expect(e.code == "NoSuchBucket" && e.message.hasPrefix("The specified"))
        #expect(S3XML.value("UploadId", in: "<InitiateMultipartUploadResult><UploadId>2~abc</UploadId></InitiateMultipartUploadResult>") == "2~abc")
        #expect(S3XML.values("Key", in: "<Key/><Key>x</Key>") == ["", "x"])
    }

    /// Regression: every answer's body was decoded as text to look for an error code,
    /// megabytes of a segment or a pack each time (a fifth of an encrypted join's CPU,
    /// perf). Only an error answer is read for one.
    @Test func onlyErrorAnswersAreReadForAnErrorCode() {
        let document = Array("<?xml version=\"1.0\"?><Error><Code>SlowDown</Code></Error>".utf8)
        #expect(S3Store.Answer(status: 503, headers: [:], body: document).errorCode == "SlowDown")
        #expect(S3Store.Answer(status: 200, headers: [:], body: document).errorCode == nil, "data, not an error document")
        #expect(S3Store.Answer(status: 206, headers: [:], body: document).errorCode == nil, "data, not an error document")
    }

    @Test func hostileAnswers() {
        for bad in ["", "<ListBucketResult>", "<ListBucketResult><IsTruncated>maybe</IsTruncated></ListBucketResult>",
                    "<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>a</Key><Size>-1</Size></Contents></ListBucketResult>",
                    "<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>a</Key><Size>99999999999999999999</Size></Contents></ListBucketResult>",
                    "<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>a&bogus;</Key><Size>1</Size></Contents></ListBucketResult>",
                    "<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>a&#0;</Key><Size>1</Size></Contents></ListBucketResult>",
                    "<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>a</Key><Size>1</Size>",
                    "<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key><b>x</b></Key><Size>1</Size></Contents></ListBucketResult>"] {
            #expect(S3XML.listing(bad[...]) == nil, "\(bad)")
        }
        #expect(S3XML.error("<Error><Message>no code</Message></Error>") == nil)
        #expect(S3XML.value("Key", in: "<Key") == nil && S3XML.value("Key", in: "<Key>") == nil && S3XML.value("K", in: "<K>") == nil)
    }

    @Test(arguments: [51, 52, UInt64.random(in: 100...UInt64.max)])
    func fuzzedAnswersNeverTrap(seed: UInt64) {
        print("S3XMLTests.fuzzedAnswersNeverTrap seed \(seed)")
        var gen = SplitMix64(seed: seed)
        let pieces = Array("<>/&;#x\"'= abcKeySizeContentsIsTruncatedtrue0123456789".utf8)
        for round in 0..<3000 {
            var doc = Array((round % 2 == 0 ? Self.listing : Self.error).utf8)
            for _ in 0..<gen.int(1..<12) {
                let at = gen.int(0..<doc.count + 1)
                switch gen.int(0..<3) {
                case 0: doc.insert(pieces[gen.int(0..<pieces.count)], at: at)
                case 1: if at < doc.count { doc.remove(at: at) }
                default: if at < doc.count { doc.removeSubrange(at..<min(doc.count, at + gen.int(1..<40))) }
                }
            }
            let text = String(decoding: doc, as: UTF8.self)
            if let l = S3XML.listing(text[...]) {
                #expect(l.objects.allSatisfy { $0.size >= 0 && $0.size <= 5 << 40 }, "seed \(seed) round \(round)")
            }
            _ = S3XML.error(text[...])
        }
    }
}
