#!/usr/bin/env bash
# The S3 backing against the tools people use on the same server, in one run (release
# build, median of BENCH_RUNS, default 3): the loopback radosgw of scripts/s3-server.sh,
# or the bucket named by UBIQUITY_S3_BUCKET (with AWS_* set).
#
#   scripts/bench-s3.sh                    # every row
#   BENCH_ROWS="big small" scripts/bench-s3.sh
#
# Rows (docs/BENCHMARKS.md, S3):
#   big       a 1 GiB file: `cp` into a fresh mount + `ubiquity sync` (returns once it is
#             uploaded), against `rclone copy` (Debian) and `aws s3 cp` (PyPI) of it
#   small     10,000 files of 1 KiB: the same against `rclone copy` of the tree; and
#             the PUT requests the mount made
#   idle      requests of an idle mount over IDLE_SECONDS (default 600) after its
#             active window (300 s), as requests per hour
#   propagate one save on alpha until beta shows it, PROPAGATE_SAVES times (default 40):
#             p50 and p99 (both mounts poll at the default 1 s)
#   join      a device joining JOIN_FILES (default 100,000) small files: time until all
#             are listed, and its requests
#
# big, small and join also run on an encrypted container (`mount --encrypt`, issue 25),
# interleaved with the plain runs, and print encrypted against not encrypted. The
# passphrase's scrypt (0.5 s, once per mount, before it) is left out of the join's time
# in both columns: that row times from the mount's return. BENCH_BACKING=dir runs those
# rows against a backing directory (on this disk) instead of the server, without the
# rclone and aws columns. BENCH_TLS=1 sends every tool to the loopback server's HTTPS
# endpoint (over TLS Ubiquity does not hash a body for its signature).
set -euo pipefail
export LC_ALL=C
cd "$(dirname "$0")/.."
RUNS=${BENCH_RUNS:-3}
ROWS=${BENCH_ROWS:-big small idle propagate join}
. scripts/deps.sh
install_missing "${BUILD_PACKAGES[@]}" rclone python3 curl >&2
command -v aws >/dev/null || pip3 install --quiet awscli >&2 || echo "bench-s3: no aws CLI (pip3 install awscli): its column stays empty" >&2
swift build -c release >/dev/null
BIN=$(swift build -c release --show-bin-path)/ubiquity

W=$(mktemp -d /var/tmp/ubiquity-bench-s3.XXXXXX)
s3dir=""
mounts=()
cleanup() {
  set +e
  for m in "${mounts[@]}"; do mountpoint -q "$m" && { "$BIN" unmount "$m" >/dev/null 2>&1 || fusermount3 -u -z "$m"; }; done
  [[ -n $s3dir ]] && scripts/s3-server.sh stop "$s3dir"
  rm -rf "$W"
}
trap cleanup EXIT INT TERM
if [[ -z ${UBIQUITY_S3_BUCKET:-} && ${BENCH_BACKING:-s3} != dir ]]; then
  s3dir=$W/s3
  eval "$(S3_PORT=${S3_PORT:-7480} scripts/s3-server.sh start "$s3dir")"
fi
rclone_tls=()
if [[ ${BENCH_TLS:-} == 1 ]]; then
  [[ -n ${UBQ_S3_TLS_ENDPOINT:-} ]] || { echo "bench-s3: BENCH_TLS=1 needs the loopback server's HTTPS endpoint" >&2; exit 1; }
  export AWS_ENDPOINT_URL=$UBQ_S3_TLS_ENDPOINT AWS_CA_BUNDLE=$UBQ_S3_TLS_CA
  # The AWS CLI's default CRC checksums fail against this radosgw over TLS.
  export AWS_REQUEST_CHECKSUM_CALCULATION=when_required AWS_RESPONSE_CHECKSUM_VALIDATION=when_required
  rclone_tls=(--ca-cert "$UBQ_S3_TLS_CA")
fi
bucket=${UBIQUITY_S3_BUCKET:-}
export RCLONE_CONFIG_BENCH_TYPE=s3 RCLONE_CONFIG_BENCH_PROVIDER=Other
export RCLONE_CONFIG_BENCH_ACCESS_KEY_ID=${AWS_ACCESS_KEY_ID:-} RCLONE_CONFIG_BENCH_SECRET_ACCESS_KEY=${AWS_SECRET_ACCESS_KEY:-}
export RCLONE_CONFIG_BENCH_ENDPOINT=${AWS_ENDPOINT_URL:-} RCLONE_CONFIG_BENCH_REGION=${AWS_REGION:-us-east-1}
export RCLONE_CONFIG_BENCH_FORCE_PATH_STYLE=true

# rclone 1.60 fails on any AWS_CA_BUNDLE ("unsupported transport"): it gets none.
rclone_() { env -u AWS_CA_BUNDLE rclone --config /dev/null "${rclone_tls[@]}" "$@"; }
now() { printf '%s' "${EPOCHREALTIME/,/.}"; }
median() { sort -g | awk '{ a[NR] = $1 } END { if (NR == 0) print "-"; else print a[int((NR + 1) / 2)] }'; }
run_id=$RANDOM

printf 'bench passphrase %s\n' "$run_id" >"$W/passphrase"
backing_of() {
  if [[ ${BENCH_BACKING:-s3} == dir ]]; then echo "$W/backing-$1"; else echo "s3://$bucket/bench-$run_id-$1"; fi
}

# mount_fresh NAME [BACKING-NAME [MOUNT-ARG...]]: a new store on a new prefix; prints the
# mount point. `--encrypt` among the arguments makes an encrypted container.
mount_fresh() {
  local m=$W/$1/mnt name=$1 prefix=${2:-$1}
  shift
  (($# == 0)) || shift
  mkdir -p "$m" "$W/$name/store"
  "$BIN" mount "$m" --store "$W/$name/store" --backing "$(backing_of "$prefix")" --device "$name" \
    --password-file "$W/passphrase" "$@" >/dev/null
  mounts+=("$m")
  echo "$m"
}
# encrypted_ratio PLAIN ENCRYPTED: plain time / encrypted time (above 1: encrypted is faster).
encrypted_ratio() { awk -v p="$1" -v e="$2" 'BEGIN { printf "%.2f", p / e }'; }
# purge BACKING-NAME: a run's objects go (the loopback server keeps them in memory).
purge() {
  if [[ ${BENCH_BACKING:-s3} == dir ]]; then rm -rf "$W/backing-$1"; else rclone_ purge "bench:$bucket/bench-$run_id-$1" 2>/dev/null || true; fi
}
unmount() { "$BIN" unmount "$1" >/dev/null; }
count() { getfattr --absolute-names --only-values -n user.ubiquity.sync "$1" | sed -n "s/^backing-$2=//p"; }

echo "bench-s3: release build, $RUNS runs, server ${AWS_ENDPOINT_URL:-AWS}"

if [[ " $ROWS " == *" big "* ]]; then
  head -c $((1 << 30)) /dev/urandom >"$W/big.bin"
  u=() e=() r=() a=()
  for i in $(seq "$RUNS"); do
    m=$(mount_fresh "big$i")
    t0=$(now); cp "$W/big.bin" "$m/"; "$BIN" sync "$m" >/dev/null; t1=$(now)
    u+=("$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')")
    unmount "$m"; rm -rf "$W/big$i"; purge "big$i"
    m=$(mount_fresh "bigenc$i" "bigenc$i" --encrypt)
    t0=$(now); cp "$W/big.bin" "$m/"; "$BIN" sync "$m" >/dev/null; t1=$(now)
    e+=("$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')")
    unmount "$m"; rm -rf "$W/bigenc$i"; purge "bigenc$i"
    [[ ${BENCH_BACKING:-s3} == dir ]] && continue
    t0=$(now); rclone_ copy "$W/big.bin" "bench:$bucket/rclone-$run_id-$i/"; t1=$(now)
    r+=("$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')")
    if command -v aws >/dev/null; then
      t0=$(now); aws s3 cp --quiet "$W/big.bin" "s3://$bucket/aws-$run_id-$i/big.bin"; t1=$(now)
      a+=("$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')")
    fi
    # The loopback server keeps everything in memory: each run's copies go.
    for p in "bench-$run_id-big$i" "rclone-$run_id-$i" "aws-$run_id-$i"; do rclone_ purge "bench:$bucket/$p" 2>/dev/null || true; done
  done
  mu=$(printf '%s\n' "${u[@]}" | median) me=$(printf '%s\n' "${e[@]}" | median)
  printf 'big encrypted: 1 GiB until uploaded: %.1f s encrypted, %.1f s not: %sx\n' "$me" "$mu" "$(encrypted_ratio "$mu" "$me")"
  if [[ ${BENCH_BACKING:-s3} != dir ]]; then
    mr=$(printf '%s\n' "${r[@]}" | median) ma=$(printf '%s\n' "${a[@]:-}" | median)
    best=$mr; [[ $ma != - ]] && best=$(awk -v x="$mr" -v y="$ma" 'BEGIN { print (y < x) ? y : x }')
    printf 'big: 1 GiB until uploaded: ubiquity %.1f s, rclone copy %.1f s, aws s3 cp %s s: %.2fx the faster tool\n' \
      "$mu" "$mr" "$ma" "$(awk -v u="$mu" -v b="$best" 'BEGIN { print b / u }')"
  fi
  rm -f "$W/big.bin"
fi

if [[ " $ROWS " == *" small "* ]]; then
  python3 - "$W/small" <<'EOF'
import os, sys
root = sys.argv[1]
for i in range(10000):
    d = os.path.join(root, "d%02d" % (i % 100))
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "f%05d" % i), "wb") as f:
        f.write(os.urandom(1024))
EOF
  u=() e=() r=() p=()
  for i in $(seq "$RUNS"); do
    m=$(mount_fresh "small$i")
    before=$(count "$m" puts)
    t0=$(now); cp -r "$W/small" "$m/"; "$BIN" sync "$m" >/dev/null; t1=$(now)
    u+=("$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')")
    p+=($(($(count "$m" puts) - before)))
    unmount "$m"; rm -rf "$W/small$i"; purge "small$i"
    m=$(mount_fresh "smallenc$i" "smallenc$i" --encrypt)
    t0=$(now); cp -r "$W/small" "$m/"; "$BIN" sync "$m" >/dev/null; t1=$(now)
    e+=("$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')")
    unmount "$m"; rm -rf "$W/smallenc$i"; purge "smallenc$i"
    [[ ${BENCH_BACKING:-s3} == dir ]] && continue
    t0=$(now); rclone_ copy --transfers 16 "$W/small" "bench:$bucket/rclone-small-$run_id-$i/"; t1=$(now)
    r+=("$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')")
  done
  mu=$(printf '%s\n' "${u[@]}" | median) me=$(printf '%s\n' "${e[@]}" | median) mp=$(printf '%s\n' "${p[@]}" | median)
  printf 'small encrypted: 10,000 files of 1 KiB until uploaded: %.1f s encrypted, %.1f s not: %sx\n' "$me" "$mu" "$(encrypted_ratio "$mu" "$me")"
  if [[ ${BENCH_BACKING:-s3} != dir ]]; then
    mr=$(printf '%s\n' "${r[@]}" | median)
    printf 'small: 10,000 files of 1 KiB until uploaded: ubiquity %.1f s (%s PUTs), rclone copy %.1f s: %.1fx\n' \
      "$mu" "$mp" "$mr" "$(awk -v u="$mu" -v r="$mr" 'BEGIN { print r / u }')"
  fi
fi

if [[ " $ROWS " == *" idle "* ]]; then
  secs=${IDLE_SECONDS:-600}
  m=$(mount_fresh idle)
  echo x >"$m/x"; "$BIN" sync "$m" >/dev/null
  sleep 305 # the active window after the last change (SyncEngine.Options.activeWindow)
  before=$(count "$m" requests)
  sleep "$secs"
  n=$(($(count "$m" requests) - before))
  printf 'idle: %d requests in %d s after the active window: %.0f per hour\n' "$n" "$secs" "$(awk -v n="$n" -v s="$secs" 'BEGIN { print n * 3600 / s }')"
  unmount "$m"
fi

if [[ " $ROWS " == *" propagate "* ]]; then
  a=$(mount_fresh alpha prop) b=$(mount_fresh beta prop)
  echo warm >"$a/warm"; for _ in $(seq 100); do [[ -e $b/warm ]] && break; sleep 0.1; done
  lat=()
  for i in $(seq "${PROPAGATE_SAVES:-40}"); do
    sleep 0.$((RANDOM % 10))
    t0=$(now); echo "$i" >"$a/p$i"
    until [[ -e $b/p$i ]]; do sleep 0.01; done
    lat+=("$(awk -v a="$t0" -v b="$(now)" 'BEGIN { print b - a }')")
  done
  printf '%s\n' "${lat[@]}" | sort -g | awk '{ a[NR] = $1 } END { printf "propagate: one save to an active peer: p50 %.2f s, p99 %.2f s (%d saves)\n", a[int((NR + 1) / 2)], a[int(NR * 0.99 + 0.99)], NR }'
  unmount "$a"; unmount "$b"
fi

if [[ " $ROWS " == *" join "* ]]; then
  n=${JOIN_FILES:-100000}
  python3 - "$W/jointree" "$n" <<'EOF'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    d = os.path.join(root, "d%03d" % (i % 500))
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "f%06d" % i), "w") as f:
        f.write("file %d\n" % i)
EOF
  # join_once KIND RUN [MOUNT-ARG...]: fills a container, then times a second device
  # from its mount's return until it lists every file; prints the seconds.
  join_once() {
    local kind=$1 i=$2 m j t0 t1
    shift 2
    m=$(mount_fresh "joinsrc$kind$i" "join$kind$i" "$@")
    cp -r "$W/jointree" "$m/tree"
    "$BIN" sync "$m" >/dev/null
    j=$(mount_fresh "joiner$kind$i" "join$kind$i")
    t0=$(now)
    "$BIN" sync "$j" >/dev/null
    until [[ $(find "$j/tree" -type f 2>/dev/null | wc -l) -ge $n ]]; do sleep 0.2; done
    t1=$(now)
    echo "join $kind: $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f s", b - a }'), $(count "$j" requests) requests ($(count "$j" gets) GETs, $(count "$j" lists) LISTs)" >&2
    unmount "$j"; unmount "$m"; rm -rf "$W/joinsrc$kind$i" "$W/joiner$kind$i"; purge "join$kind$i"
    awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }'
  }
  u=() e=()
  for i in $(seq "$RUNS"); do
    u+=("$(join_once plain "$i")")
    e+=("$(join_once enc "$i" --encrypt)")
  done
  mu=$(printf '%s\n' "${u[@]}" | median) me=$(printf '%s\n' "${e[@]}" | median)
  printf 'join: a device joining %d files, from its mount until all are listed: %.1f s encrypted, %.1f s not: %sx\n' \
    "$n" "$me" "$mu" "$(encrypted_ratio "$mu" "$me")"
fi
