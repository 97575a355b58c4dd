/* The floor: the least a replayer can do on this machine, for bench/floor_lateness.py and
 * bench/afap_floor.py to measure ours against. Reads a trace the bench writes (24-byte
 * little-endian records: int64 ts_ns, int64 offset, uint32 length, uint32 op, 0 read 1 write)
 * and replays it on DEV with O_DIRECT in one of three ways:
 *   floor timed DEV TRACE OUT [SLEEP_NS]
 *                               one thread spins on CLOCK_MONOTONIC to each absolute deadline,
 *                               stamps the clock, then preads/pwrites; writes each I/O's
 *                               lateness (int64 ns) to OUT. With SLEEP_NS, it first sleeps
 *                               (clock_nanosleep, 1 ns timer slack) until SLEEP_NS before each
 *                               deadline further away than that: what a sleep near a deadline
 *                               costs (engine/src/clock.rs's LONG_SPIN_NS)
 *   floor psync DEV TRACE N     AFAP: N threads, each one pread/pwrite loop over every Nth row
 *                               on a descriptor of DEV it opens itself (as fio's jobs do: one
 *                               open file shared by threads on several CPUs costs each call a
 *                               cache line crossing between them, 7 % more CPU per I/O on zram)
 *   floor uring DEV TRACE QD    AFAP: one io_uring loop keeping QD in flight (registered file
 *                               and buffers; up to QD 32 each I/O in an enter of its own, as
 *                               fio does, deeper all the free slots in one; with up to 4 in
 *                               flight, a 30 us poll for a completion before sleeping for one)
 *   floor psync|uring DEV TRACE N|QD record
 *                               the same, keeping each I/O's times as a replayer must: the
 *                               clock read when it is issued and completed (psync: one read
 *                               after each call, which stands for the next I/O's issue, as
 *                               ours does; io_uring: one before each enter that submits, one
 *                               per batch reaped) and its intended, issue and complete time
 *                               and result stored in four arrays of a row each, written once
 *                               before the run (as the engine lays out each chunk's)
 * Writes carry the bytes ours writes by default (`write_source` below).
 * Prints one JSON line: ios, seconds, iops, cpu_s (user + system of the whole process).
 * Built by the bench: cc -O2 -o floor floor.c -luring -lpthread */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct rec { int64_t ts_ns, offset; uint32_t length, op; };

static struct rec *rows;
static size_t nrows;
static int fd;
static const char *dev;
enum { ALIGN = 4096, MAXLEN = 1 << 20 };
/* The io_uring loop's spin for a completion before it sleeps, with at most POLL_MAX_INFLIGHT
 * I/Os in flight (uring.rs's POLL_NS and POLL_MAX_INFLIGHT; its `Poll` says why). */
#define POLL_NS 30000
#define POLL_MAX_INFLIGHT 4
/* Up to this depth the io_uring loop submits each I/O in an enter of its own (uring.rs's
 * SUBMIT_EACH_MAX_DEPTH; its `submit_batch` says why), deeper all the free slots at once. */
#define SUBMIT_EACH_MAX_DEPTH 32

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void die(const char *what) { perror(what); exit(1); }

static void *buffer(size_t len) {
    unsigned char *p;
    if (posix_memalign((void **)&p, ALIGN, len)) die("posix_memalign");
    for (size_t i = 0; i < len; i++) p[i] = (unsigned char)(i * 2654435761u >> 13); /* not all zeros */
    return p;
}

/* What writes carry: the bytes ours writes by default (engine/src/data.rs, `Buffers` with
 * DataPattern::Random), an 8 MiB pool of pseudo-random words from which each write takes 4 KiB-
 * aligned bytes at a position hashed from its row, so that consecutive writes do not carry the
 * same block. Writing one buffer over and over would copy from a cache line already near, and
 * hand zram the same compressible block each time: a different job from ours. */
enum { POOL = 8 << 20 };
static unsigned char *pool;

static uint64_t splitmix64(uint64_t x) {
    uint64_t z = x + 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static void pool_open(void) {
    if (posix_memalign((void **)&pool, ALIGN, POOL)) die("posix_memalign");
    uint64_t state = 0x7472616365726570ULL | 1; /* data.rs's seed */
    for (size_t w = 0; w < POOL / 8; w++) {
        state = splitmix64(state);
        memcpy(pool + w * 8, &state, 8);
    }
}

static const void *write_source(size_t row, uint32_t len) {
    uint64_t slots = (POOL - (len + ALIGN - 1) / ALIGN * ALIGN) / ALIGN + 1;
    return pool + (uint64_t)(((unsigned __int128)splitmix64(row) * slots) >> 64) * ALIGN;
}

static void load(const char *path) {
    FILE *f = fopen(path, "rb");
    struct stat st;
    if (!f || fstat(fileno(f), &st)) die(path);
    nrows = st.st_size / sizeof(struct rec);
    rows = malloc(nrows * sizeof(struct rec) + 1);
    if (fread(rows, sizeof(struct rec), nrows, f) != nrows) die("fread");
    fclose(f);
}

/* With `record`, each row's intended, issue and complete time and result (relative to t0). */
static int64_t *kept[4], kept_t0;

static void keep_open(void) {
    for (int c = 0; c < 4; c++) {
        if (!(kept[c] = malloc(nrows * sizeof(int64_t)))) die("malloc");
        memset(kept[c], 0xff, nrows * sizeof(int64_t)); /* -1: not done; and every page mapped */
    }
}

static inline void keep(size_t i, int64_t issue, int64_t complete, long result) {
    kept[0][i] = issue - kept_t0; /* as fast as possible, an I/O is due when issued */
    kept[1][i] = issue - kept_t0;
    kept[2][i] = complete - kept_t0;
    kept[3][i] = result;
}

static long rw(int f, void *buf, size_t i) {
    const struct rec *r = &rows[i];
    return r->op ? pwrite(f, write_source(i, r->length), r->length, r->offset) : pread(f, buf, r->length, r->offset);
}

static void report(int64_t t0, int64_t t1) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double cpu = ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
    double s = (t1 - t0) / 1e9;
    printf("{\"ios\": %zu, \"seconds\": %.6f, \"iops\": %.1f, \"cpu_s\": %.6f}\n", nrows, s, nrows / s, cpu);
}

static void timed(const char *out, int64_t sleep_ns) {
    int64_t *late = malloc(nrows * sizeof(int64_t));
    void *buf = buffer(MAXLEN);
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    int64_t t0 = now_ns() + 20000000, issue = t0;
    for (size_t i = 0; i < nrows; i++) {
        int64_t deadline = t0 + rows[i].ts_ns;
        if (sleep_ns > 0 && deadline - now_ns() > sleep_ns) {
            int64_t t = deadline - sleep_ns;
            struct timespec ts = {t / 1000000000LL, t % 1000000000LL};
            clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
        }
        while ((issue = now_ns()) < deadline) {}
        late[i] = issue - deadline;
        if (rw(fd, buf, i) != (long)rows[i].length) die("pread/pwrite");
    }
    report(t0, issue);
    FILE *f = fopen(out, "wb");
    if (!f || fwrite(late, sizeof(int64_t), nrows, f) != nrows || fclose(f)) die(out);
}

struct job { size_t first, step; };

static void *psync_loop(void *arg) {
    struct job *j = arg;
    void *buf = buffer(MAXLEN);
    int f = open(dev, O_RDWR | O_DIRECT);
    if (f < 0) die(dev);
    if (kept[0]) {
        int64_t last = now_ns();
        for (size_t i = j->first; i < nrows; i += j->step) {
            long r = rw(f, buf, i);
            int64_t done = now_ns();
            keep(i, last, done, r);
            last = done;
            if (r != (long)rows[i].length) die("pread/pwrite");
        }
    } else {
        for (size_t i = j->first; i < nrows; i += j->step)
            if (rw(f, buf, i) != (long)rows[i].length) die("pread/pwrite");
    }
    close(f);
    return NULL;
}

static void psync(int n) {
    pthread_t t[256];
    struct job jobs[256];
    int64_t t0 = kept_t0 = now_ns();
    for (int k = 0; k < n; k++) {
        jobs[k] = (struct job){k, n};
        if (pthread_create(&t[k], NULL, psync_loop, &jobs[k])) die("pthread_create");
    }
    for (int k = 0; k < n; k++) pthread_join(t[k], NULL);
    report(t0, now_ns());
}

static void uring(unsigned qd) {
    struct io_uring ring;
    struct io_uring_params p = {.flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN |
                                         IORING_SETUP_TASKRUN_FLAG};
    if (io_uring_queue_init_params(qd, &ring, &p) < 0) {
        memset(&p, 0, sizeof(p));
        if (io_uring_queue_init_params(qd, &ring, &p) < 0) die("io_uring_queue_init");
    }
    char *bufs = buffer((size_t)qd * MAXLEN);
    struct iovec iov[2] = {{bufs, (size_t)qd * MAXLEN}, {pool, POOL}};
    if (io_uring_register_files(&ring, &fd, 1) || io_uring_register_buffers(&ring, iov, 2)) die("register");
    unsigned *free_slots = malloc(qd * sizeof(unsigned)), nfree = qd;
    for (unsigned k = 0; k < qd; k++) free_slots[k] = k;
    /* With `record`: each slot's row and issue time, and the slots queued since the last enter. */
    size_t *slot_row = malloc(qd * sizeof(size_t));
    int64_t *slot_issue = malloc(qd * sizeof(int64_t));
    unsigned *queued_slots = malloc(qd * sizeof(unsigned)), nqueued = 0;
    size_t next = 0, done = 0;
    unsigned batch = qd <= SUBMIT_EACH_MAX_DEPTH ? 1 : qd;
    int64_t t0 = kept_t0 = now_ns();
#define STAMP_QUEUED() do { if (kept[0]) { int64_t at = now_ns(); \
        while (nqueued) slot_issue[queued_slots[--nqueued]] = at; } } while (0)
    while (done < nrows) {
        for (unsigned queued = 0; nfree && next < nrows; queued++) {
            /* Up to SUBMIT_EACH_MAX_DEPTH, the one queued before goes in an enter of its own
             * (that also reaps) before the next is queued; the last goes below. */
            if (queued == batch) {
                STAMP_QUEUED();
                if (io_uring_submit_and_get_events(&ring) < 0) die("io_uring_submit_and_get_events");
                queued = 0;
            }
            struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
            unsigned slot = free_slots[--nfree];
            const struct rec *r = &rows[next++];
            if (r->op) io_uring_prep_write_fixed(sqe, 0, write_source(next - 1, r->length), r->length, r->offset, 1);
            else io_uring_prep_read_fixed(sqe, 0, bufs + (size_t)slot * MAXLEN, r->length, r->offset, 0);
            sqe->flags |= IOSQE_FIXED_FILE;
            sqe->user_data = slot;
            if (kept[0]) {
                slot_row[slot] = next - 1;
                queued_slots[nqueued++] = slot;
            }
        }
        /* fio's commit then getevents: one enter submits and reaps what has completed (with
         * DEFER_TASKRUN, only an enter with GETEVENTS runs completions), and only if none came
         * back, a second enter waits. Against one enter that submits and sleeps
         * (io_uring_submit_and_wait), at QD1 on a loop device over /dev/shm, medians of the
         * per-round ratios on the shared VM: 1.04x in 31 alternating rounds, 1.20x and 2.05x
         * (submit, then wait) in 25 and 15; at QD4 1.02x in 31. At depth the first enter
         * nearly always finds completions: QD128 took half the enters. */
        struct io_uring_cqe *cqe;
        STAMP_QUEUED();
        if (io_uring_submit_and_get_events(&ring) < 0) die("io_uring_submit_and_get_events");
        if (io_uring_peek_cqe(&ring, &cqe) && qd - nfree <= POLL_MAX_INFLIGHT) {
            /* Spin up to POLL_NS for a completion before sleeping for one, as uring.rs does
             * (its Poll says why and what it measured): with DEFER_TASKRUN a completion shows
             * as the TASKRUN flag and reaches the CQ in an enter. On this VM an idle vCPU
             * halts, and a thread sleeping at QD1 is woken from the other CPU through the host:
             * at QD1 on the loop device over /dev/shm, otherwise idle machine, this loop did
             * 25.7-51.7k IOPS sleeping and 51.5-89.6k polling (7 rounds). */
            int64_t until = now_ns() + POLL_NS;
            while (!(IO_URING_READ_ONCE(*ring.sq.kflags) & IORING_SQ_TASKRUN) && now_ns() < until) {}
            if (IO_URING_READ_ONCE(*ring.sq.kflags) & IORING_SQ_TASKRUN) io_uring_get_events(&ring);
        }
        if (io_uring_peek_cqe(&ring, &cqe) && io_uring_wait_cqe(&ring, &cqe) < 0) die("io_uring_wait_cqe");
        unsigned head, seen = 0;
        int64_t reaped = kept[0] ? now_ns() : 0;
        io_uring_for_each_cqe(&ring, head, cqe) {
            if (cqe->res < 0) { errno = -cqe->res; die("io_uring I/O"); }
            unsigned slot = (unsigned)cqe->user_data;
            if (kept[0]) keep(slot_row[slot], slot_issue[slot], reaped, cqe->res);
            free_slots[nfree++] = slot;
            seen++;
        }
        io_uring_cq_advance(&ring, seen);
        done += seen;
    }
    report(t0, now_ns());
}

int main(int argc, char **argv) {
    int record = argc == 6 && strcmp(argv[1], "timed") && !strcmp(argv[5], "record");
    if (argc != 5 && !(argc == 6 && (!strcmp(argv[1], "timed") || record))) {
        fprintf(stderr, "usage: floor timed|psync|uring DEV TRACE OUT|THREADS|QD [SLEEP_NS|record]\n");
        return 2;
    }
    load(argv[3]);
    pool_open();
    if (record) keep_open();
    dev = argv[2];
    if ((fd = open(dev, O_RDWR | O_DIRECT)) < 0) die(dev);
    if (!strcmp(argv[1], "timed")) timed(argv[4], argc == 6 ? atoll(argv[5]) : 0);
    else if (!strcmp(argv[1], "psync")) psync(atoi(argv[4]));
    else if (!strcmp(argv[1], "uring")) uring((unsigned)atoi(argv[4]));
    else { fprintf(stderr, "floor: unknown mode %s\n", argv[1]); return 2; }
    return 0;
}
