// listings DIR K: lists DIR/p0 .. DIR/p<K-1>, each once, as fast as it can (a listing
// always reaches the filesystem: readdir is not cached), and prints the median, 99th
// percentile and longest time of one listing, in milliseconds.
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int compare(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc != 3 || atoi(argv[2]) < 1) {
        fprintf(stderr, "usage: listings DIR K\n");
        return 2;
    }
    int k = atoi(argv[2]);
    double *took = malloc(sizeof(double) * k);
    char path[4096];
    for (int i = 0; i < k; i++) {
        snprintf(path, sizeof path, "%s/p%d", argv[1], i);
        double start = now_ms();
        DIR *d = opendir(path);
        if (!d) {
            perror(path);
            return 1;
        }
        while (readdir(d)) {}
        closedir(d);
        took[i] = now_ms() - start;
    }
    qsort(took, k, sizeof(double), compare);
    printf("%.2f %.2f %.2f\n", took[k / 2], took[k * 99 / 100], took[k - 1]);
    return 0;
}
