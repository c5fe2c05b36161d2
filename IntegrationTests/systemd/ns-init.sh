#!/bin/bash
# ns-init.sh: the first process inside the private namespaces that lib.sh's sd_up creates
# (`unshare --mount --cgroup --propagation private`). It is root here, prepares a tiny
# "booted with systemd" world that only this mount namespace sees, starts journald, and
# finally *becomes* `systemd --user` for the test user (exec), so lib.sh can nsenter it.
#
# Input (environment, set by sd_up): SD_USER SD_UID SD_GID SD_HOME SD_STATE
# Nothing here writes to the host: every change is a mount in this namespace, a file under
# $SD_STATE, or a cgroup below the one sd_up created for us.
set -eu

# Private /run first. `-n` keeps libmount from recording the mount in /run/mount/utab,
# which at this moment would still be the host's /run.
mount -n -t tmpfs -o mode=755,nosuid,nodev tmpfs /run

# This namespace starts with a copy of every host mount, including other programs' FUSE
# mounts. A copy holds a reference on their FUSE connection, so their daemon would not see
# its own unmount finish while we live. Detach our copies (lazily; the host is unaffected,
# propagation is private).
findmnt -rn -o FSTYPE,TARGET | while read -r fstype target; do
	case $fstype in
	fuse | fuse.* | fuseblk) umount -n -l "$(printf '%b' "$target")" 2>/dev/null || true ;;
	esac
done

# A cgroup2 hierarchy whose root is the sub-cgroup sd_up made (cgroup namespace); it also
# hides the host's v1 hierarchies. The manager gets the cgroup a real login gives it,
# delegated to the user: journald recognizes user units by that path (it sets
# _SYSTEMD_USER_UNIT, which `journalctl --user -u UNIT` matches).
mount -t cgroup2 cgroup2 /sys/fs/cgroup
manager_cg=/sys/fs/cgroup/user.slice/user-$SD_UID.slice/user@$SD_UID.service
mkdir -p "$manager_cg"
chown "$SD_UID:$SD_GID" "$manager_cg" "$manager_cg"/cgroup.{procs,threads,subtree_control}

# sd_booted() checks for this directory; without it `systemd --user` exits at once.
mkdir -p /run/systemd/system /run/user /run/lock
install -d -m 700 -o "$SD_UID" -g "$SD_GID" "/run/user/$SD_UID"

# A test user that the host does not have: add it to passwd/group for this namespace only.
if [ -f "$SD_STATE/passwd" ]; then
	mount --bind "$SD_STATE/passwd" /etc/passwd
	mount --bind "$SD_STATE/group" /etc/group
fi

# Without udev the host's /dev/fuse is 0600 root; desktops have 0666 (udev rule). Give this
# namespace its own 0666 node for the same device (10:229) so the user can mount. It needs
# a tmpfs of its own: /run is mounted nodev, and a bind mount keeps its source's nodev.
if [ "$SD_UID" != 0 ] && [ "$(stat -c %a /dev/fuse)" != 666 ]; then
	mkdir /run/ubq-dev
	mount -t tmpfs -o mode=755,size=16k tmpfs /run/ubq-dev
	mknod -m 666 /run/ubq-dev/fuse c 10 229
	mount --bind /run/ubq-dev/fuse /dev/fuse
fi

# journald: the manager's and the units' logs. Its files go to a tmpfs over /var/log/journal
# (persistent mode there gives per-user journals, so `journalctl --user` works as the user).
# The config is a drop-in in our private /run (sorted last, so it wins); "flushed" makes it
# write to /var/log/journal right away. It never touches the host's kernel log or syslog.
if [ -d /var/log/journal ]; then
	mount -t tmpfs -o mode=2755 tmpfs /var/log/journal
	storage=persistent
else
	storage=volatile # never create /var/log/journal on the host
fi
mkdir -p /run/systemd/journald.conf.d /run/systemd/journal
printf '[Journal]\nStorage=%s\nReadKMsg=no\nForwardToSyslog=no\nForwardToKMsg=no\nForwardToConsole=no\nForwardToWall=no\n' \
	"$storage" >/run/systemd/journald.conf.d/zz-ubiquity-test.conf
touch /run/systemd/journal/flushed
# In its own child cgroup, so the user manager does not treat it as one of its processes.
mkdir /sys/fs/cgroup/journald
(
	echo "$BASHPID" >/sys/fs/cgroup/journald/cgroup.procs
	SYSTEMD_LOG_TARGET=console exec /lib/systemd/systemd-journald
) &
for _ in $(seq 100); do
	[ -S /run/systemd/journal/socket ] && break
	sleep 0.05
done

# Become the user manager, in its cgroup, with the clean environment a login gives it.
echo $$ >"$manager_cg/cgroup.procs"
exec setpriv --reuid="$SD_UID" --regid="$SD_GID" --init-groups -- \
	env -i HOME="$SD_HOME" USER="$SD_USER" LOGNAME="$SD_USER" SHELL=/bin/bash LANG=C.UTF-8 \
	PATH=/usr/local/bin:/usr/bin:/bin XDG_RUNTIME_DIR="/run/user/$SD_UID" \
	/lib/systemd/systemd --user --log-target=journal
