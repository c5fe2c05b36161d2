/* What an fsync of the intent log costs on this disk: N frames of 4.5 KiB (an editor's
 * save of a 4 KiB file) each flushed with fdatasync, appended to a growing file, against
 * written over zeros laid down ahead (the file's size never changes, so ext4 need not
 * flush the inode), and, for reference, N new 4 KiB files each fsynced (what
 * passthrough_ll's fsync of an editor's temp file costs). Prints microseconds per flush.
 *
 *   gcc -O2 scripts/bench/log-flush.c -o /tmp/log-flush && /tmp/log-flush DIR [N]
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void check(int ok, const char *what) {
    if (!ok) { perror(what); exit(1); }
}

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: log-flush DIR [N]\n"); return 2; }
    int n = argc > 2 ? atoi(argv[2]) : 2000;
    char path[4096], frame[4600];
    memset(frame, 'x', sizeof frame);

    snprintf(path, sizeof path, "%s/log-flush-append", argv[1]);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0600);
    check(fd >= 0, path);
    double a = now();
    for (int i = 0; i < n; i++) check(write(fd, frame, sizeof frame) == sizeof frame && fdatasync(fd) == 0, "append");
    printf("append + fdatasync:            %6.1f us\n", (now() - a) / n * 1e6);
    close(fd);
    unlink(path);

    snprintf(path, sizeof path, "%s/log-flush-ahead", argv[1]);
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    check(fd >= 0, path);
    size_t total = (size_t)n * sizeof frame;
    char *zeros = calloc(1, total);
    check(zeros && write(fd, zeros, total) == (ssize_t)total && fsync(fd) == 0, "zeros");
    a = now();
    for (int i = 0; i < n; i++)
        check(pwrite(fd, frame, sizeof frame, (off_t)i * sizeof frame) == sizeof frame && fdatasync(fd) == 0, "overwrite");
    printf("over zeros + fdatasync:        %6.1f us\n", (now() - a) / n * 1e6);
    close(fd);
    unlink(path);
    free(zeros);

    a = now();
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/log-flush-file", argv[1]);
        int f = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        check(f >= 0 && write(f, frame, 4096) == 4096 && fsync(f) == 0 && close(f) == 0, path);
    }
    printf("new 4 KiB file + fsync:        %6.1f us\n", (now() - a) / n * 1e6);
    unlink(path);
    return 0;
}
