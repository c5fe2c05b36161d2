/* direct-io-check FILE SECONDS SEED
 *
 * Direct and cached I/O must agree (issue 22): after an O_DIRECT write completes, no read
 * on any descriptor returns the bytes it replaced. Two child processes read FILE buffered,
 * over and over (as `dd if=FILE bs=640k count=1` in a loop would), keeping the kernel's page
 * cache busy refilling. Meanwhile this process rewrites the whole file with a new byte
 * pattern per cycle, alternately by asynchronous O_DIRECT writes (libaio io_submit, then
 * io_getevents until every one completed) and by synchronous O_DIRECT pwrite, and after each
 * cycle reads the file back buffered, on a descriptor of its own, and compares every byte.
 * It stops at the first stale byte (exit 1, naming the cycle, offset and both patterns) or
 * after SECONDS (exit 0, with the number of cycles). SEED picks the patterns and the order
 * of the AIO pieces; it is printed so a failure replays.
 *
 * Build: cc -O2 -o direct-io-check direct-io-check.c -laio   (Debian: libaio-dev)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <libaio.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define FILE_SIZE (640 * 1024)
#define PIECE (64 * 1024)
#define PIECES (FILE_SIZE / PIECE)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void die(const char *what) {
    fprintf(stderr, "direct-io-check: %s: %s\n", what, strerror(errno));
    exit(2);
}

/* A reader: whole-file buffered reads until killed. */
static void reader(const char *path) {
    char *buf = malloc(FILE_SIZE);
    if (!buf) _exit(2);
    for (;;) {
        int fd = open(path, O_RDONLY);
        if (fd < 0) _exit(2);
        ssize_t got = 0, n;
        while (got < FILE_SIZE && (n = pread(fd, buf + got, FILE_SIZE - got, got)) > 0) got += n;
        close(fd);
    }
}

static uint64_t state;
static uint64_t next_random(void) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: direct-io-check FILE SECONDS SEED\n");
        return 2;
    }
    const char *path = argv[1];
    double seconds = atof(argv[2]);
    state = strtoull(argv[3], NULL, 10) | 1;
    printf("direct-io-check: seed %s, %.0f s, file %s\n", argv[3], seconds, path);
    fflush(stdout);

    unsigned char *data;
    if (posix_memalign((void **)&data, 4096, FILE_SIZE) != 0) die("posix_memalign");
    unsigned char *check = malloc(FILE_SIZE);
    if (!check) die("malloc");

    int dfd = open(path, O_RDWR | O_CREAT | O_DIRECT, 0644);
    if (dfd < 0) die("open O_DIRECT");
    unsigned char previous = 0xaa;
    memset(data, previous, FILE_SIZE);
    if (pwrite(dfd, data, FILE_SIZE, 0) != FILE_SIZE) die("first write");

    io_context_t ctx = 0;
    int rc = io_setup(PIECES, &ctx);
    if (rc < 0) { errno = -rc; die("io_setup"); }

    pid_t readers[2];
    for (int i = 0; i < 2; i++) {
        readers[i] = fork();
        if (readers[i] < 0) die("fork");
        if (readers[i] == 0) reader(path);
    }

    int status = 0;
    long cycles = 0;
    double end = now() + seconds;
    while (now() < end) {
        unsigned char pattern;
        do pattern = (unsigned char)next_random(); while (pattern == previous);
        memset(data, pattern, FILE_SIZE);
        int async = cycles % 2 == 0;
        if (async) {
            struct iocb iocbs[PIECES], *list[PIECES];
            int order[PIECES];
            for (int i = 0; i < PIECES; i++) order[i] = i;
            for (int i = PIECES - 1; i > 0; i--) {
                int j = (int)(next_random() % (uint64_t)(i + 1)), t = order[i];
                order[i] = order[j];
                order[j] = t;
            }
            for (int i = 0; i < PIECES; i++) {
                io_prep_pwrite(&iocbs[i], dfd, data + (size_t)order[i] * PIECE, PIECE, (long long)order[i] * PIECE);
                list[i] = &iocbs[i];
            }
            rc = io_submit(ctx, PIECES, list);
            if (rc != PIECES) { errno = rc < 0 ? -rc : EIO; die("io_submit"); }
            struct io_event events[PIECES];
            int done = 0;
            while (done < PIECES) {
                rc = io_getevents(ctx, 1, PIECES - done, events, NULL);
                if (rc < 0) { errno = -rc; die("io_getevents"); }
                for (int i = 0; i < rc; i++) {
                    if ((long)events[i].res != PIECE) {
                        fprintf(stderr, "direct-io-check: an AIO write returned %ld\n", (long)events[i].res);
                        status = 2;
                    }
                }
                done += rc;
            }
        } else if (pwrite(dfd, data, FILE_SIZE, 0) != FILE_SIZE) {
            die("O_DIRECT pwrite");
        }
        if (status) break;
        int bfd = open(path, O_RDONLY);
        if (bfd < 0) die("open buffered");
        ssize_t got = 0, n;
        while (got < FILE_SIZE && (n = pread(bfd, check + got, FILE_SIZE - got, got)) > 0) got += n;
        close(bfd);
        if (got != FILE_SIZE) {
            fprintf(stderr, "direct-io-check: cycle %ld: buffered read returned %zd of %d bytes\n", cycles, got, FILE_SIZE);
            status = 1;
            break;
        }
        for (size_t i = 0; i < FILE_SIZE; i++) {
            if (check[i] != pattern) {
                fprintf(stderr, "direct-io-check: cycle %ld (%s O_DIRECT write): byte %zu reads %02x after the write of %02x (the previous cycle wrote %02x)\n",
                        cycles, async ? "AIO" : "synchronous", i, check[i], pattern, previous);
                status = 1;
                break;
            }
        }
        if (status) break;
        previous = pattern;
        cycles++;
    }
    for (int i = 0; i < 2; i++) {
        kill(readers[i], SIGKILL);
        waitpid(readers[i], NULL, 0);
    }
    io_destroy(ctx);
    close(dfd);
    printf("direct-io-check: %ld cycles %s\n", cycles, status == 0 ? "without a stale byte" : "then a failure");
    return status;
}
