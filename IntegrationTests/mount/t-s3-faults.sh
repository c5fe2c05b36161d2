#!/usr/bin/env bash
# S3 going wrong under real mounts. alpha reaches the loopback S3 server through a
# fault-injecting proxy (s3-fault-proxy.py), beta directly. While the proxy answers
# 503 SlowDown, resets connections or stalls them, alpha keeps saving locally, `ls` and
# reads on its mount stay instant, its status says offline and why; when the proxy
# passes again, everything arrives on beta. The server's gateway stopped in the middle
# of a 40 MB upload and started again: the file arrives whole. A daemon killed with
# SIGKILL in the middle of an upload: after a remount the upload is done again, and
# nothing half-written is visible. Fails (does not skip) without a server.
# ubq-timeout: 300
# ubq-alone: stops and starts the S3 gateway that the other S3 scenarios use
set -euo pipefail
source "$(dirname "$0")/lib.sh"

s3_backing faults
if [[ -z ${UBQ_S3_SERVER_DIR:-} ]]; then
  # Another server (docs/TESTING.md): this scenario stops and
  # starts the loopback server's gateway and proxies plain http on loopback.
  [[ ${CI:-} != true ]] || fail "UBQ_S3_SERVER_DIR unset: scripts/test.sh names the loopback server's directory"
  skip "needs the loopback S3 server of scripts/test.sh (UBQ_S3_SERVER_DIR)"
fi
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
target_port=${AWS_ENDPOINT_URL##*:}
target_port=${target_port%%/*}
proxy_port=$((20000 + $$ % 20000))
modes="${TEST_PREFIX}proxy-mode"
echo pass >"$modes"
python3 "$here/s3-fault-proxy.py" "$proxy_port" "$target_port" "$modes" >"${TEST_PREFIX}proxy.out" 2>&1 &
proxy_pid=$!
on_exit "echo pass >'$modes'"
after_unmount "kill $proxy_pid 2>/dev/null"
on_exit "[[ -e $UBQ_S3_SERVER_DIR/rgw.pid ]] || '$repo/scripts/s3-server.sh' gateway-start '$UBQ_S3_SERVER_DIR' >/dev/null"
wait_for "the proxy listens" grep -q ready "${TEST_PREFIX}proxy.out"

DEVICE=alpha
AWS_ENDPOINT_URL="http://127.0.0.1:$proxy_port" mount_fresh s3faults --poll 0.2
A=$MNT
mount_device beta --poll 0.2
B=$(mnt_of beta)
on_failure dump_sync_state
on_failure "cat '${modes}.count' >&2"
on_failure 'for m in "$A" "$B"; do echo "--- status of $m:"; xattr "$m" user.ubiquity.sync; ls -la "$m"; done >&2' 

state_of() { xattr "$1" user.ubiquity.sync | sed -n "s/^$2=//p"; }

# quick MNT: ls and a read of the mount answer within a second (no request to the
# backing store runs under the filesystem's lock).
quick() {
  timeout 1 ls -la "$1" >/dev/null || fail "ls $1 took more than a second while S3 is failing"
  timeout 1 cat "$1/hello.txt" >/dev/null || fail "reading $1/hello.txt took more than a second while S3 is failing"
}

echo hello >"$A/hello.txt"
wait_content "$B/hello.txt" hello "hello.txt on beta (proxy passing)"

for mode in 503 reset stall; do
  step "the proxy answers '$mode': alpha saves locally, stays quick, goes offline; then it all arrives"
  echo "$mode" >"$modes"
  echo "written during $mode" >"$A/during-$mode.txt"
  head -c 3000000 /dev/urandom >"$A/big-during-$mode.bin"
  quick "$A"
  if [[ $mode != stall ]]; then
    wait_eq offline "alpha's sync state while the proxy answers $mode" state_of "$A" state
    assert_ne "" "$(state_of "$A" error)" "alpha's sync error while the proxy answers $mode"
    # The error keeps its kind from the backing store to the status line.
    assert_eq retryable "$(state_of "$A" error-kind)" "the kind of alpha's sync error while the proxy answers $mode"
    assert_contains "$(ubq status)" "error (retryable):" "ubiquity status while the proxy answers $mode"
  else
    sleep 2
  fi
  quick "$A"
  assert_eq "written during $mode" "$(cat "$A/during-$mode.txt")" "during-$mode.txt on alpha"
  echo pass >"$modes"
  wait_content "$B/during-$mode.txt" "written during $mode" "during-$mode.txt on beta after the proxy passes again"
  wait_for "big-during-$mode.bin on beta" cmp -s "$A/big-during-$mode.bin" "$B/big-during-$mode.bin"
  wait_eq syncing "alpha's sync state after the proxy passes again" state_of "$A" state
done
log "proxy connections: $(cat "${modes}.count")"

step "the server's gateway stops in the middle of a 40 MB upload and comes back: nothing lost"
head -c 40000000 /dev/urandom >"$A/gateway.bin" &
writer=$!
sleep 0.5
"$repo/scripts/s3-server.sh" gateway-stop "$UBQ_S3_SERVER_DIR"
wait "$writer"
quick "$A"
sleep 2
"$repo/scripts/s3-server.sh" gateway-start "$UBQ_S3_SERVER_DIR" >/dev/null
wait_for "gateway.bin on beta, whole" cmp -s "$A/gateway.bin" "$B/gateway.bin"

step "alpha killed with SIGKILL in the middle of an upload: after a remount it goes out again"
echo stall >"$modes"
head -c 20000000 /dev/urandom >"$A/killed.bin"
sync "$A/killed.bin"
sleep 1
crash_daemon
echo pass >"$modes"
AWS_ENDPOINT_URL="http://127.0.0.1:$proxy_port" _ubq_mount
wait_for "killed.bin on beta, whole" cmp -s "$A/killed.bin" "$B/killed.bin"
assert_daemon_alive alpha
assert_daemon_alive beta
pass
