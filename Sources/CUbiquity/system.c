#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/falloc.h>
#include <malloc.h>
#include <stdio.h>
#include <sys/random.h>
#include <sys/vfs.h>
#include <unistd.h>
#include "CUbiquity.h"

int ubq_syncfs(int fd) { return syncfs(fd); }

int ubq_start_writeback(int fd) { return sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE); }

int ubq_start_writeback_range(int fd, int64_t offset, int64_t count) {
    return sync_file_range(fd, offset, count, SYNC_FILE_RANGE_WRITE);
}

int ubq_limit_malloc_arenas(int count) { return mallopt(M_ARENA_MAX, count); }

int ubq_rename_noreplace(const char *from, const char *to) {
    return renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE);
}

int ubq_open_tmpfile(const char *dir, int flags, mode_t mode) {
    return open(dir, flags | O_TMPFILE, mode);
}

const int ubq_seek_data = SEEK_DATA;
const int ubq_seek_hole = SEEK_HOLE;
const int ubq_falloc_keep_size = FALLOC_FL_KEEP_SIZE;
const int ubq_falloc_punch_hole = FALLOC_FL_PUNCH_HOLE;
const int ubq_falloc_zero_range = FALLOC_FL_ZERO_RANGE;

int ubq_fallocate(int fd, int mode, int64_t offset, int64_t length) { return fallocate(fd, mode, offset, length); }

pid_t ubq_gettid(void) { return gettid(); }

ssize_t ubq_getrandom(void *buffer, size_t length) { return getrandom(buffer, length, 0); }

long long ubq_filesystem_type(int fd) {
    struct statfs st;
    return fstatfs(fd, &st) == 0 ? (long long)st.f_type : -1;
}

int ubq_rename_exchange(const char *a, const char *b) {
    return renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE);
}

static _Thread_local unsigned lock_ranks_held;

unsigned ubq_lock_ranks_held(void) { return lock_ranks_held; }

void ubq_set_lock_ranks_held(unsigned ranks) { lock_ranks_held = ranks; }
