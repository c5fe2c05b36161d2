# Helpers the quick benchmark scripts (bench-write.sh, bench-meta.sh, bench-fold.sh,
# bench-replay.sh) share; sourced from the project's root.

# Installs the build's Debian packages and those named ($@), builds the release binary
# ($UBQ), and checks UBQ_REF, an older build to compare with ($REF, empty when unset).
release_build() {
  REF=${UBQ_REF:-}
  [[ -z $REF || -x $REF ]] || { echo "UBQ_REF=$REF is not an executable" >&2; exit 2; }
  . scripts/deps.sh
  install_missing "${BUILD_PACKAGES[@]}" "$@" >&2
  swift build -c release >&2
  UBQ=$(swift build -c release --show-bin-path)/ubiquity
}

# Waits (up to 2 minutes) until the Ubiquity mount at $1 has copied everything to its
# backing directory, so that no upload of one run overlaps the next; then flushes the disk.
# The status's pending count is the last cycle's: read right after a workload, before a
# cycle has counted its versions, it says 0. So a cycle is asked for first, and the wait
# is for one that began after the ask (requests-done reaching requests) and left nothing.
settle_mount() {
  local asked status
  setfattr -n user.ubiquity.control -v sync "$1"
  asked=$(getfattr --absolute-names --only-values -n user.ubiquity.sync "$1" | awk -F= '$1 == "requests" { print $2 }')
  for _ in $(seq 1200); do
    status=$(getfattr --absolute-names --only-values -n user.ubiquity.sync "$1" 2>/dev/null) || true
    if awk -F= -v asked="$asked" '$1 == "requests-done" && $2 >= asked { ok = 1 } END { exit !ok }' <<< "$status" &&
       grep -qx 'pending=0' <<< "$status"; then
      sync
      return 0
    fi
    sleep 0.1
  done
  echo "  ($1 still has pending uploads after 2 minutes; going on)" >&2
  sync
}

# The median of the numbers on stdin, one a line.
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.1f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# The median of the values of target $1, row $2 in $RAW (lines "target<TAB>row<TAB>value").
cell() { awk -F'\t' -v t="$1" -v k="$2" '$1 == t && $2 == k { print $3 }' "$RAW" | median; }
