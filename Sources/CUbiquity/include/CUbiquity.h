// Linux system calls and constants that Swift's Glibc module hides behind _GNU_SOURCE or
// does not include. Each is a real C function compiled with _GNU_SOURCE (system.c), so
// Swift calls it with the C calling convention.
#ifndef UBIQUITY_CSYSTEM_H
#define UBIQUITY_CSYSTEM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/xattr.h>

/// syncfs(2): flush the whole filesystem holding fd.
int ubq_syncfs(int fd);

/// sync_file_range(2) with SYNC_FILE_RANGE_WRITE over the whole file: start writing its
/// dirty pages to disk, without waiting.
int ubq_start_writeback(int fd);

/// sync_file_range(2) of `count` bytes at `offset`: start writing them back, no wait.
int ubq_start_writeback_range(int fd, int64_t offset, int64_t count);

/// mallopt(M_ARENA_MAX, count): at most `count` malloc arenas (0 on failure).
int ubq_limit_malloc_arenas(int count);

/// renameat2(RENAME_NOREPLACE): publish `from` as `to` unless `to` exists (EEXIST);
/// EINVAL where the filesystem cannot (NFS, some FUSE filesystems).
int ubq_rename_noreplace(const char *from, const char *to);

/// open(2) with O_TMPFILE: an unnamed file in directory `dir`.
int ubq_open_tmpfile(const char *dir, int flags, mode_t mode);

/// lseek(2) whence values for sparse files.
extern const int ubq_seek_data;
extern const int ubq_seek_hole;


/// fstatfs(2)'s f_type of the filesystem holding `fd` (its magic number), or -1.
long long ubq_filesystem_type(int fd);

/// renameat2(RENAME_EXCHANGE): `a` and `b` swap places (both must exist).
int ubq_rename_exchange(const char *a, const char *b);

/// gettid(2): the calling thread's id (for setpriority of one thread).
pid_t ubq_gettid(void);

/// getrandom(2) with no flags: up to `length` random bytes into `buffer`.
ssize_t ubq_getrandom(void *buffer, size_t length);

/// fallocate(2) mode bits.
extern const int ubq_falloc_keep_size;
extern const int ubq_falloc_punch_hole;
extern const int ubq_falloc_zero_range;
/// fallocate(2) (Glibc's module does not export it).
int ubq_fallocate(int fd, int mode, int64_t offset, int64_t length);

/// The ranks of the locks the calling thread holds, one bit per rank (`LockRank`: the
/// lock order, checked in debug builds); thread-local.
unsigned ubq_lock_ranks_held(void);
void ubq_set_lock_ranks_held(unsigned ranks);

#endif
