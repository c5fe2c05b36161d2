# IntegrationTests/systemd/lib.sh: a real `systemd --user` for tests, on hosts whose PID 1 is not
# systemd (containers, CI VMs), isolated from the host. Source it from a bash script run
# as root:
#
#   sd_up USER HOME     start journald + a user manager for USER in private mount and
#                       cgroup namespaces; returns once the manager finished starting up.
#                       USER is `root` or a name; a name the host lacks exists only inside.
#   sd_run CMD...       run CMD inside, as USER, with the environment `systemctl --user` needs
#                       (it stays in the caller's cgroup: start anything long-lived through
#                       the manager, e.g. `systemd-run --user`, so that sd_down reaches it)
#   sd_root CMD...      run CMD inside as root
#   sd_wait_mount PATH [1|0]   wait (5 s) until PATH is (1) / is not (0) a mount point inside
#   sd_down             stop the manager (it stops its units), kill what is left, remove
#                       the cgroup; the namespace and every mount in it go away with it
#
# How it stays off the host: the namespaces run in a cgroup of their own, SD_CG (never
# start a systemd manager in the host's root cgroup: it would adopt every process there);
# /run, /var/log/journal, /sys/fs/cgroup, /etc/passwd and /dev/fuse are replaced by mounts
# only that mount namespace sees (ns-init.sh). Files live under SD_TMP. After a run that
# was killed before sd_down, cleanup.sh removes what is left.
#
# Needs: util-linux (unshare, nsenter, setpriv, findmnt), systemd (252 tested), cgroup2.

SD_ID=ubiquity-sdtest-$$        # names this run's cgroup and temp dir; cleanup.sh parses the PID
SD_TMP=/tmp/$SD_ID              # homes and manager state of this run
SD_TEST_UID=${SD_TEST_UID:-54223}  # uid for a test user the host lacks; below 60000, so
                                   # journald gives it its own journal (dynamic uids do not get one)
SD_LIB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# The cgroup2 hierarchy: /sys/fs/cgroup/unified on hybrid hosts, else /sys/fs/cgroup.
sd_cgroup_root() {
	local d
	for d in /sys/fs/cgroup/unified /sys/fs/cgroup; do
		[ "$(stat -fc %T "$d" 2>/dev/null)" = cgroup2fs ] && { echo "$d"; return 0; }
	done
	echo "sd: no cgroup2 hierarchy is mounted" >&2
	return 1
}

sd_up() {
	SD_USER=$1 SD_HOME=$2
	SD_STATE=$SD_TMP/state
	mkdir -p "$SD_STATE"
	chmod 755 "$SD_TMP" "$SD_STATE"
	if [ "$SD_USER" = root ]; then
		SD_UID=0 SD_GID=0
	elif SD_UID=$(id -u "$SD_USER" 2>/dev/null); then
		SD_GID=$(id -g "$SD_USER")
	else
		SD_UID=$SD_TEST_UID SD_GID=$SD_TEST_UID
		if getent passwd "$SD_UID" >/dev/null || getent group "$SD_GID" >/dev/null; then
			echo "sd: uid/gid $SD_UID is taken on this host; set SD_TEST_UID" >&2
			return 1
		fi
		{ cat /etc/passwd; echo "$SD_USER:x:$SD_UID:$SD_GID:ubiquity test:$SD_HOME:/bin/bash"; } >"$SD_STATE/passwd"
		{ cat /etc/group; echo "$SD_USER:x:$SD_GID:"; } >"$SD_STATE/group"
	fi
	mkdir -p "$SD_HOME"
	chown "$SD_UID:$SD_GID" "$SD_HOME"

	local root
	root=$(sd_cgroup_root) || return 1
	SD_CG=$root/$SD_ID
	mkdir "$SD_CG" || return 1

	# Move into SD_CG first, then unshare: the new cgroup namespace is rooted there.
	(
		echo "$BASHPID" >"$SD_CG/cgroup.procs"
		export SD_USER SD_UID SD_GID SD_HOME SD_STATE
		exec unshare --mount --cgroup --propagation private -- bash "$SD_LIB_DIR/ns-init.sh"
	) >"$SD_STATE/ns.log" 2>&1 </dev/null &
	SD_PID=$! # after the execs in ns-init.sh, this is the user manager itself

	for _ in $(seq 100); do # until the manager answers on its private socket
		sd_run systemctl --user show -P Version >/dev/null 2>&1 && break
		kill -0 "$SD_PID" 2>/dev/null || break
		sleep 0.05
	done
	# ... and until startup is complete (enabled units started). It exits non-zero when
	# startup ended "degraded"; that is for the caller to judge.
	sd_run timeout 30 systemctl --user is-system-running --wait >/dev/null 2>&1
	sd_run systemctl --user show -P Version >/dev/null 2>&1 && return 0
	echo "sd: the user manager did not come up; its log:" >&2
	cat "$SD_STATE/ns.log" >&2
	return 1
}

# nsenter into the manager's mount namespace only (PID and cgroup stay the host's).
sd_root() {
	nsenter -t "$SD_PID" -m --wd="$PWD" -- "$@"
}

sd_run() {
	sd_root setpriv --reuid="$SD_UID" --regid="$SD_GID" --init-groups -- \
		env -i HOME="$SD_HOME" USER="$SD_USER" LOGNAME="$SD_USER" LANG=C.UTF-8 \
		XDG_RUNTIME_DIR="/run/user/$SD_UID" PATH=/usr/local/bin:/usr/bin:/bin "$@"
}

sd_wait_mount() {
	local path=$1 want=${2:-1}
	for _ in $(seq 100); do
		# findmnt reads mountinfo; stat would get EACCES on another user's FUSE mount
		if sd_root findmnt -rn --mountpoint "$path" >/dev/null; then
			[ "$want" = 1 ] && return 0
		else
			[ "$want" = 0 ] && return 0
		fi
		sleep 0.05
	done
	return 1
}

sd_down() {
	[ -n "${SD_CG:-}" ] || return 0
	local pids
	# SIGTERM makes a user manager stop all its units (as at logout) and exit.
	kill -TERM "$SD_PID" 2>/dev/null
	for _ in $(seq 150); do
		kill -0 "$SD_PID" 2>/dev/null || break
		sleep 0.1
	done
	# Whatever is left (journald, stragglers): kill by PID, then remove the cgroups
	# (rmdir fails with EBUSY until the killed processes are gone, so retry).
	for _ in $(seq 50); do
		mapfile -t pids < <(find "$SD_CG" -name cgroup.procs -exec cat {} + 2>/dev/null)
		[ ${#pids[@]} = 0 ] || kill -KILL "${pids[@]}" 2>/dev/null
		find "$SD_CG" -depth -type d -exec rmdir {} + 2>/dev/null
		[ -d "$SD_CG" ] || break
		sleep 0.1
	done
	wait "$SD_PID" 2>/dev/null
	if [ -d "$SD_CG" ]; then
		echo "sd: could not remove $SD_CG" >&2
		return 1
	fi
	rm -rf "$SD_STATE"
	unset SD_CG SD_PID
}
