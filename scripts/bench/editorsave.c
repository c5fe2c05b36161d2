/* Editor-save workload for scripts/bench.sh: N times write a temp file, fsync it and
 * rename it over the target, as editors do. Prints "save seconds". */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: editorsave DIR N\n"); return 2; }
    int n = atoi(argv[2]);
    char target[4096], temp[4096], buf[4096];
    snprintf(target, sizeof target, "%s/doc.txt", argv[1]);
    snprintf(temp, sizeof temp, "%s/.doc.txt.tmp", argv[1]);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < n; i++) {
        memset(buf, 'a' + i % 26, sizeof buf);
        int fd = open(temp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || write(fd, buf, sizeof buf) != sizeof buf || fsync(fd) != 0 || close(fd) != 0) { perror(temp); return 1; }
        if (rename(temp, target) != 0) { perror("rename"); return 1; }
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("save %.3f\n", (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9);
    return 0;
}
