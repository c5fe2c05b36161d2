/* Tree generator for scripts/bench.sh: N files under DIR in nested directories, like a
 * source tree, for the tar -x, rsync, du and find rows. Sizes are log-uniform between
 * 100 B and 16 KiB (many small files, a few larger ones) and the contents are
 * pseudo-random, so no filesystem can dedupe or compress them. Deterministic for a
 * given N and SEED: every target of a run gets the same tree, and each run a new one
 * (ubiquity would otherwise dedupe the second run against the first). Prints
 * "files bytes dirs". */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static uint64_t state = 0x9e3779b97f4a7c15ULL;

static uint64_t next(void) { /* xorshift64*: fast, and good enough for file contents */
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    return state * 0x2545f4914f6cdd1dULL;
}

static long dirs = 0;

/* mkdir -p for the parent directories of path (path itself is a file). */
static int make_parents(char *path) {
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        int rc = mkdir(path, 0755);
        *p = '/';
        if (rc == 0) dirs++;
        else if (errno != EEXIST) { perror(path); return -1; }
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 3 && argc != 4) { fprintf(stderr, "usage: mktree DIR N [SEED]\n"); return 2; }
    if (argc == 4) state ^= ((uint64_t)atoll(argv[3]) + 1) * 0xbf58476d1ce4e5b9ULL; /* not 0 for the small seeds the runs use */
    const char *root = argv[1];
    long n = atol(argv[2]);
    static const char *ext[] = {"c", "h", "txt", "json", "md", "py", "swift", "png"};
    static uint64_t buf[16384 / 8];
    char path[4096];
    long long total = 0;
    for (long i = 0; i < n; i++) {
        /* Three levels of 16 x 8 directories, and a fourth for a third of the files:
         * about 100 files per leaf directory at 20,000 files. */
        int len = snprintf(path, sizeof path, "%s/src%02ld/mod%ld/", root, i % 16, (i / 16) % 8);
        if (i % 3 == 0) len += snprintf(path + len, sizeof path - len, "sub%ld/", (i / 128) % 4);
        snprintf(path + len, sizeof path - len, "file%06ld.%s", i, ext[(i / 16) % 8]);
        if (make_parents(path) != 0) return 1;
        double u = (double)(next() >> 11) / (double)(1ULL << 53);
        size_t size = (size_t)(100.0 * pow(16384.0 / 100.0, u));
        for (size_t w = 0; w < (size + 7) / 8; w++) buf[w] = next();
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || write(fd, buf, size) != (ssize_t)size || close(fd) != 0) { perror(path); return 1; }
        total += size;
    }
    printf("%ld %lld %ld\n", n, total, dirs);
    return 0;
}
