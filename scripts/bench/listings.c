// listings DIR K SECONDS: lists DIR/p0 .. DIR/p<K-1> round after round for SECONDS (a
// listing always reaches the filesystem: readdir is not cached), and prints the median,
// 99th percentile and longest time of one listing, in milliseconds.
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
    if (argc != 4 || atoi(argv[2]) < 1 || atof(argv[3]) <= 0) {
        fprintf(stderr, "usage: listings DIR K SECONDS\n");
        return 2;
    }
    int k = atoi(argv[2]);
    double end = now_ms() + atof(argv[3]) * 1e3;
    size_t n = 0, capacity = 1024;
    double *took = malloc(sizeof(double) * capacity);
    char path[4096];
    for (int i = 0; now_ms() < end; i = (i + 1) % k) {
        snprintf(path, sizeof path, "%s/p%d", argv[1], i);
        double start = now_ms();
        DIR *d = opendir(path);
        if (!d) {
            perror(path);
            return 1;
        }
        while (readdir(d)) {}
        closedir(d);
        if (n == capacity) took = realloc(took, sizeof(double) * (capacity *= 2));
        took[n++] = now_ms() - start;
    }
    qsort(took, n, sizeof(double), compare);
    printf("%.2f %.2f %.2f %zu\n", took[n / 2], took[n * 99 / 100], took[n - 1], n);
    return 0;
}
