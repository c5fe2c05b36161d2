/* Small-file workload for scripts/bench.sh: N files of 1 KiB in one directory, in four
 * timed phases (create+write+close, stat, read, unlink). Prints "phase seconds" lines.
 * With a third argument "create", only the first phase (the files stay). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc != 3 && !(argc == 4 && strcmp(argv[3], "create") == 0)) {
        fprintf(stderr, "usage: smallfiles DIR N [create]\n");
        return 2;
    }
    const char *dir = argv[1];
    int n = atoi(argv[2]);
    char path[4096], buf[1024];
    memset(buf, 'x', sizeof buf);
    double t = now();
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/f%06d", dir, i);
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
        if (fd < 0 || write(fd, buf, sizeof buf) != sizeof buf || close(fd) != 0) { perror(path); return 1; }
    }
    printf("create %.3f\n", now() - t);
    if (argc == 4) return 0;
    t = now();
    for (int i = 0; i < n; i++) {
        struct stat st;
        snprintf(path, sizeof path, "%s/f%06d", dir, i);
        if (stat(path, &st) != 0 || st.st_size != sizeof buf) { perror(path); return 1; }
    }
    printf("stat %.3f\n", now() - t);
    t = now();
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/f%06d", dir, i);
        int fd = open(path, O_RDONLY);
        if (fd < 0 || read(fd, buf, sizeof buf) != sizeof buf || close(fd) != 0) { perror(path); return 1; }
    }
    printf("read %.3f\n", now() - t);
    t = now();
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/f%06d", dir, i);
        if (unlink(path) != 0) { perror(path); return 1; }
    }
    printf("delete %.3f\n", now() - t);
    return 0;
}
