# Sourced by quickstart.sh and test.sh: install the Debian packages that are missing
# (with sudo unless root). One list per purpose, so each script asks only for its own.
#
#   install_missing PACKAGE...

# What building and mounting need.
BUILD_PACKAGES=(libfuse3-dev fuse3 libsqlite3-dev pkg-config)
# What the test suite needs on top: fio and getfattr/setfattr (attr) in the mount
# scenarios, python3 for the differential and hostile-syscall tests, sqlite3 and git as
# workloads, vim-tiny for the editor saves, rsync for the xattr backups, gcc and libaio-dev
# for the O_DIRECT check (t-direct-io.sh), a systemd user manager for the unit test, and
# man-db and bash-completion for the installed man page and completions (docs suite).
TEST_PACKAGES=(sqlite3 fio attr git python3 strace systemd dbus-user-session util-linux procps psmisc vim-tiny rsync gcc libc6-dev libaio-dev man-db bash-completion)

install_missing() {
  local need=() pkg
  for pkg in "$@"; do
    # The status, not dpkg's exit code: a package removed but not purged is "deinstall ok
    # config-files", and `dpkg -s` still exits 0 for it.
    [[ $(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null) == "install ok installed" ]] || need+=("$pkg")
  done
  [ ${#need[@]} -gt 0 ] || return 0
  command -v apt-get >/dev/null || { echo "missing packages: ${need[*]} (install them; this script knows only apt-get)" >&2; return 1; }
  echo "installing: ${need[*]}"
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
}
