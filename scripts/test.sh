#!/usr/bin/env bash
# The one test entry point: README and CI run exactly this. Builds, then runs the unit
# tests (swift test), the real-mount scenarios and the systemd test. Under CI=true a test
# that cannot mount FUSE fails instead of skipping.
set -euo pipefail
cd "$(dirname "$0")/.."

swift build
export UBIQUITY="${UBIQUITY:-$(swift build --show-bin-path)/ubiquity}"

scripts/sweep-test-mounts.sh
swift test
tests/mount/run.sh
tests/systemd/run.sh
