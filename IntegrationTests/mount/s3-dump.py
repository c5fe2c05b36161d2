#!/usr/bin/env python3
"""Copies every object under an S3 prefix into a local directory, as stored (SigV4 with
the standard library only: the mount scenarios scan what the server holds).

    s3-dump.py s3://BUCKET/PREFIX DIR

Credentials, region and endpoint from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_REGION (default us-east-1) and AWS_ENDPOINT_URL (path-style requests). Prints the
number of objects copied.
"""
import datetime
import hashlib
import hmac
import os
import sys
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET

url, out = sys.argv[1], sys.argv[2]
bucket, _, prefix = url[len("s3://"):].partition("/")
endpoint = os.environ["AWS_ENDPOINT_URL"].rstrip("/")
region = os.environ.get("AWS_REGION", "us-east-1")
access, secret = os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"]
host = urllib.parse.urlparse(endpoint).netloc
EMPTY = hashlib.sha256(b"").hexdigest()


def sign(key, msg):
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def get(path, query):
    now = datetime.datetime.now(datetime.timezone.utc)
    amzdate, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    canonical_query = "&".join(
        "%s=%s" % (urllib.parse.quote(k, safe="-_.~"), urllib.parse.quote(v, safe="-_.~")) for k, v in sorted(query.items()))
    canonical_path = urllib.parse.quote(path, safe="/-_.~")
    headers = "host:%s\nx-amz-content-sha256:%s\nx-amz-date:%s\n" % (host, EMPTY, amzdate)
    signed = "host;x-amz-content-sha256;x-amz-date"
    request = "\n".join(["GET", canonical_path, canonical_query, headers, signed, EMPTY])
    scope = "%s/%s/s3/aws4_request" % (day, region)
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amzdate, scope, hashlib.sha256(request.encode()).hexdigest()])
    key = sign(sign(sign(sign(("AWS4" + secret).encode(), day), region), "s3"), "aws4_request")
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    auth = "AWS4-HMAC-SHA256 Credential=%s/%s, SignedHeaders=%s, Signature=%s" % (access, scope, signed, signature)
    req = urllib.request.Request(endpoint + canonical_path + ("?" + canonical_query if canonical_query else ""),
                                 headers={"x-amz-date": amzdate, "x-amz-content-sha256": EMPTY, "Authorization": auth})
    with urllib.request.urlopen(req, timeout=30) as response:
        return response.read()


keys, token = [], None
while True:
    query = {"list-type": "2", "prefix": prefix}
    if token:
        query["continuation-token"] = token
    root = ET.fromstring(get("/" + bucket, query))
    ns = root.tag.split("}")[0] + "}" if root.tag.startswith("{") else ""
    keys += [c.find(ns + "Key").text for c in root.findall(ns + "Contents")]
    token = root.findtext(ns + "NextContinuationToken")
    if root.findtext(ns + "IsTruncated") != "true" or not token:
        break
for key in keys:
    path = os.path.join(out, key)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(get("/" + bucket + "/" + key, {}))
print(len(keys))
