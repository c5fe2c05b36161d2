#!/usr/bin/env bash
# A real S3 server on loopback for the tests and for trying S3 locally: Ceph's radosgw on a
# one-node cluster (one mon, one memstore OSD, no mgr), from Debian's packages. Facts
# behind the settings: ../shared/notes/s3-test-server.md (each one was found by a failure).
#
#   scripts/s3-server.sh start DIR    starts it (state in DIR), prints `export AWS_...` lines
#   scripts/s3-server.sh env DIR      prints them again
#   scripts/s3-server.sh stop DIR     stops it (by the PIDs it recorded) and removes DIR
#   scripts/s3-server.sh gateway-stop DIR / gateway-start DIR
#                                     stops / starts only the HTTP gateway (radosgw): the
#                                     server goes away and comes back with its data (tests)
#
#   eval "$(scripts/s3-server.sh start /tmp/s3)"; ubiquity mount ~/Cloud --backing s3://ubiquity-test
#
# The bucket `ubiquity-test` is made at start. Data lives in the OSD's memory: stop loses it.
# The gateway also answers HTTPS on S3_TLS_PORT (default S3_PORT + 10000) with a
# certificate of its own (DIR/cert.pem): UBQ_S3_TLS_ENDPOINT and UBQ_S3_TLS_CA name them.
# S3_PORT (default 7480) and S3_MON_PORT (default 6789) let instances run side by side.
set -euo pipefail
cd "$(dirname "$0")/.."
cmd=${1:-} dir=${2:-}
[[ $cmd =~ ^(start|stop|env|gateway-stop|gateway-start)$ && -n $dir ]] ||
  { echo "usage: scripts/s3-server.sh start|env|stop|gateway-stop|gateway-start DIR" >&2; exit 64; }
port=${S3_PORT:-7480} mon_port=${S3_MON_PORT:-6789}
tls_port=${S3_TLS_PORT:-$((port + 10000))}
access=ubiquitytest secret=ubiquity-test-secret-key bucket=ubiquity-test

print_env() {
  cat <<EOT
export AWS_ACCESS_KEY_ID=$access
export AWS_SECRET_ACCESS_KEY=$secret
export AWS_ENDPOINT_URL=http://127.0.0.1:$(cat "$dir/port")
export AWS_REGION=us-east-1
export UBIQUITY_S3_BUCKET=$bucket
export UBQ_S3_TLS_ENDPOINT=https://127.0.0.1:$(cat "$dir/tls-port")
export UBQ_S3_TLS_CA=$dir/cert.pem
EOT
}

# stop_pid FILE: SIGTERM the PID in FILE, wait until it is gone (or a zombie: this
# machine's PID 1 reaps slowly), SIGKILL after 10 s.
stop_pid() {
  local pid i state
  [[ -f $1 ]] || return 0
  pid=$(cat "$1")
  [[ $pid =~ ^[0-9]+$ ]] || return 0
  kill -TERM "$pid" 2>/dev/null || return 0
  for ((i = 0; i < 100; i++)); do
    state=$(awk '{ print $3 }' "/proc/$pid/stat" 2>/dev/null || echo gone)
    [[ $state == gone || $state == Z ]] && return 0
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
}

# start_gateway: radosgw on the cluster in $dir, waiting until it answers.
start_gateway() {
  radosgw -c "$dir/ceph.conf" -n client.rgw.a --pid-file "$dir/rgw.pid" 2>>"$dir/log/start.err"
  for ((i = 0; i < 150; i++)); do
    curl -s -o /dev/null "http://127.0.0.1:$(cat "$dir/port")/" && return 0
    sleep 0.2
  done
  echo "s3-server: radosgw did not answer on port $(cat "$dir/port") (log: $dir/log)" >&2
  return 1
}

case $cmd in
env) print_env; exit 0 ;;
gateway-stop) stop_pid "$dir/rgw.pid"; rm -f "$dir/rgw.pid"; exit 0 ;;
gateway-start) start_gateway; exit ;;
stop)
  for d in rgw osd mon; do stop_pid "$dir/$d.pid"; done
  rm -rf --one-file-system "$dir"
  exit 0 ;;
esac

. scripts/deps.sh
install_missing ceph-mon ceph-osd radosgw ceph-common python3 curl openssl >&2
[[ ! -e $dir/mon.pid ]] || { echo "s3-server: $dir is in use (stop it first)" >&2; exit 1; }
mkdir -p "$dir"/{mon,osd,rgw,run,log}
dir=$(cd "$dir" && pwd)
echo "$port" >"$dir/port"
echo "$tls_port" >"$dir/tls-port"
# A certificate for 127.0.0.1, its own CA: clients trust it through UBQ_S3_TLS_CA.
openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=127.0.0.1" -addext "subjectAltName=IP:127.0.0.1" \
  -keyout "$dir/key.pem" -out "$dir/cert.pem" >"$dir/log/openssl.out" 2>&1 ||
  { echo "s3-server: openssl could not make the HTTPS certificate: $(cat "$dir/log/openssl.out")" >&2; exit 1; }
fsid=$(cat /proc/sys/kernel/random/uuid)
conf=$dir/ceph.conf
cat >"$conf" <<EOT
[global]
fsid = $fsid
mon host = v1:127.0.0.1:$mon_port
public addr = 127.0.0.1
ms bind msgr2 = false
ms bind ipv6 = false
auth cluster required = none
auth service required = none
auth client required = none
osd pool default size = 1
osd pool default min size = 1
mon allow pool size one = true
osd crush chooseleaf type = 0
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
mon max pg per osd = 1000
paxos propose interval = 0.01
paxos min wait = 0.001
run dir = $dir/run
log file = $dir/log/\$name.log
admin socket = $dir/run/\$name.asok
[mon.a]
mon data = $dir/mon
[osd.0]
osd data = $dir/osd
osd objectstore = memstore
# memstore's default capacity is 1 GiB: past it the OSD is full and radosgw holds every
# write until the client's timeout (found when a 1 GiB benchmark stalled every PUT). The
# memory is used only as data comes; S3_MEMSTORE_GIB raises the ceiling.
memstore device bytes = $(( ${S3_MEMSTORE_GIB:-12} << 30 ))
osd crush update on start = false
osd class update on start = false
[client.rgw.a]
rgw frontends = beast endpoint=127.0.0.1:$port ssl_endpoint=127.0.0.1:$tls_port ssl_certificate=$dir/cert.pem ssl_private_key=$dir/key.pem
rgw data = $dir/rgw
rgw dns name = 127.0.0.1
EOT
ceph=(ceph -c "$conf")
monmaptool --create --clobber --addv a "[v1:127.0.0.1:$mon_port]" --fsid "$fsid" "$dir/monmap" >/dev/null
ceph-mon -c "$conf" --mkfs -i a --monmap "$dir/monmap" >/dev/null 2>&1
ceph-mon -c "$conf" -i a --pid-file "$dir/mon.pid" 2>>"$dir/log/start.err"
osd_uuid=$(cat /proc/sys/kernel/random/uuid)
id=$("${ceph[@]}" osd new "$osd_uuid" 2>/dev/null)
"${ceph[@]}" osd crush add "osd.$id" 1.0 root=default >/dev/null 2>&1
ceph-osd -c "$conf" -i "$id" --mkfs --osd-uuid "$osd_uuid" >/dev/null 2>&1
ceph-osd -c "$conf" -i "$id" --pid-file "$dir/osd.pid" 2>>"$dir/log/start.err"
for ((i = 0; i < 100; i++)); do
  "${ceph[@]}" osd dump 2>/dev/null | grep -q "^osd.$id up" && break
  sleep 0.2
done
start_gateway || exit 1
radosgw-admin -c "$conf" -n client.rgw.a user create --uid=ubiquity --display-name=ubiquity \
  --access-key="$access" --secret-key="$secret" >/dev/null 2>&1
# The bucket, with a signed request of Python's standard library (no SDK needed).
python3 - "$port" "$access" "$secret" "$bucket" <<'PY'
import datetime, hashlib, hmac, sys, urllib.request
port, access, secret, bucket = sys.argv[1:5]
now = datetime.datetime.now(datetime.timezone.utc)
amz, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
host, payload = "127.0.0.1:" + port, hashlib.sha256(b"").hexdigest()
canonical = "\n".join(["PUT", "/" + bucket, "", "host:%s\nx-amz-content-sha256:%s\nx-amz-date:%s\n" % (host, payload, amz),
                       "host;x-amz-content-sha256;x-amz-date", payload])
scope = day + "/us-east-1/s3/aws4_request"
to_sign = "\n".join(["AWS4-HMAC-SHA256", amz, scope, hashlib.sha256(canonical.encode()).hexdigest()])
key = ("AWS4" + secret).encode()
for part in (day, "us-east-1", "s3", "aws4_request"):
    key = hmac.new(key, part.encode(), hashlib.sha256).digest()
sig = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
req = urllib.request.Request("http://%s/%s" % (host, bucket), method="PUT", headers={
    "x-amz-date": amz, "x-amz-content-sha256": payload,
    "Authorization": "AWS4-HMAC-SHA256 Credential=%s/%s, SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature=%s" % (access, scope, sig)})
try:
    urllib.request.urlopen(req, timeout=30)
except urllib.error.HTTPError as e:
    if e.code != 409:  # BucketAlreadyOwnedByYou
        sys.exit("s3-server: creating the bucket failed: %s %s" % (e.code, e.read()[:200]))
PY
print_env
