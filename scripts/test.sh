#!/usr/bin/env bash
# The one test entry point: README and CI run exactly this. Installs the Debian packages
# it needs that are missing (sudo unless root), builds with every warning an error (set in
# Package.swift) and with every import checked against the declared target dependencies,
# then runs the unit tests (swift test), the documentation checks (README commands, links,
# help text, man page and completions), the real-mount scenarios and the systemd test.
# Under CI=true a test that cannot mount FUSE fails instead of skipping.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/deps.sh
install_missing "${BUILD_PACKAGES[@]}" "${TEST_PACKAGES[@]}"
command -v swift >/dev/null || { echo "swift is not on PATH: install Swift 6.x first (swift.org)"; exit 1; }

strict=(--explicit-target-dependency-import-check error)
swift build "${strict[@]}"
export UBIQUITY="${UBIQUITY:-$(swift build --show-bin-path)/ubiquity}"

scripts/sweep-test-mounts.sh
# A real S3 server on loopback (radosgw, scripts/s3-server.sh) for the S3 tests, stopped at
# the end whatever happens. UBIQUITY_S3_BUCKET already set: use that bucket instead (AWS,
# MinIO, R2: docs/TESTING.md).
if [[ -z ${UBIQUITY_S3_BUCKET:-} ]]; then
  s3dir=$(mktemp -d /tmp/ubiquity-s3.XXXXXX)
  trap 'scripts/s3-server.sh stop "$s3dir"' EXIT
  eval "$(S3_PORT=${S3_PORT:-7480} scripts/s3-server.sh start "$s3dir")"
  # t-s3-faults.sh stops and starts this server's gateway.
  export UBQ_S3_SERVER_DIR=$s3dir
fi
swift test "${strict[@]}"
IntegrationTests/docs/run.sh
IntegrationTests/mount/run.sh
IntegrationTests/systemd/run.sh
