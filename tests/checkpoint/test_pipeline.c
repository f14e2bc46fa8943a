/* server/checkpoint/pipeline.c: random item lists (in-memory bytes, copied ranges, processed
 * ranges; sizes from 0 to past the 8 MiB staging chunk; every padding; offsets on and off
 * 4 KiB blocks) give exactly the file that writing the items one after the other gives, in
 * every mode the pipeline has: the input read into buffers or through a mapping, the output
 * written plainly or with O_DIRECT (where the build directory's file system allows it; the
 * test says which it got), each with one processing lane and with three (items processed at
 * once, finishing out of order). Items may come from two source files (a split model's
 * shards). A failing item leaves no file. QD_PIPE_SEED=N repeats a random run.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <dirent.h>
#include <libgen.h>

#include "checkpoint/pipeline.h"

static char dir[512]; /* the test binary's own directory: a disk, not a tmpfs */

static uint64_t rng;
static uint64_t next(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}

struct model {
    uint8_t *src, *src2; /* the sources: src2 only where sources is 2 (same size) */
    int sources;
    size_t src_size;
    struct qd_pipe_item items[64];
    uint8_t *bytes[64];
    int n;
};

/* out[j] = in[j % src_bytes] + item + j: a function of the input the test can recompute */
static enum qd_status process(void *ctx, int lane, int i, const void *in, void *out, char *err, size_t errlen)
{
    struct model *m = ctx;
    const struct qd_pipe_item *it = &m->items[i];
    if (it->out_bytes == 13) { /* the failing item of the failure case */
        snprintf(err, errlen, "item %d refused", i);
        return QD_EINVAL;
    }
    if (i % 3 == 0) /* slower items: with several lanes, later items finish first */
        usleep(300);
    for (uint64_t j = 0; j < it->out_bytes; j++)
        ((uint8_t *)out)[j] = (uint8_t)(((const uint8_t *)in)[j % it->src_bytes] + i + j);
    return QD_OK;
}

static uint64_t pick_size(void)
{
    switch (next() % 6) {
    case 0: return 0;
    case 1: return 1 + next() % 64;
    case 2: return 4096 * (1 + next() % 4);          /* whole blocks */
    case 3: return 4096 * (1 + next() % 4) + 1;
    case 4: return 1 + next() % 300000;
    default: return (8u << 20) + next() % 100000;     /* past one staging chunk */
    }
}

static void make_model(struct model *m, int n, size_t src_size)
{
    m->src_size = src_size;
    m->sources = 1;
    m->src2 = NULL;
    m->src = malloc(m->src_size);
    for (size_t j = 0; j < m->src_size; j++)
        m->src[j] = (uint8_t)next();
    m->n = n;
    static const uint32_t pads[] = {0, 0, 1, 8, 32, 4096};
    for (int i = 0; i < n; i++) {
        struct qd_pipe_item *it = &m->items[i];
        memset(it, 0, sizeof *it);
        m->bytes[i] = NULL;
        it->kind = (enum qd_pipe_kind)(next() % 3);
        it->pad_to = pads[next() % 6];
        uint64_t size = pick_size();
        if (it->kind == QD_PIPE_BYTES) {
            m->bytes[i] = malloc(size ? size : 1);
            for (uint64_t j = 0; j < size; j++)
                m->bytes[i][j] = (uint8_t)next();
            it->bytes = m->bytes[i];
            it->out_bytes = size;
        } else {
            it->src_bytes = size ? size : 1;
            if (it->kind == QD_PIPE_COPY && it->src_bytes == 13) /* (a copy is as long as its source) */
                it->src_bytes = 14;
            it->src_offset = next() % (m->src_size - it->src_bytes);
            it->out_bytes = it->kind == QD_PIPE_COPY ? it->src_bytes : 1 + next() % (it->src_bytes * 2);
            if (it->out_bytes == 13) /* 13 is the failure case's refused item */
                it->out_bytes = 14;
        }
    }
}

static void free_model(struct model *m)
{
    for (int i = 0; i < m->n; i++)
        free(m->bytes[i]);
    free(m->src);
    free(m->src2);
}

/* A second source file, and each copied or processed item from either. */
static void two_sources(struct model *m)
{
    m->sources = 2;
    m->src2 = malloc(m->src_size);
    for (size_t j = 0; j < m->src_size; j++)
        m->src2[j] = (uint8_t)next();
    for (int i = 0; i < m->n; i++)
        m->items[i].src = m->items[i].kind == QD_PIPE_BYTES ? 0 : (int)(next() % 2);
}

/* The file the items describe, written one after the other. */
static uint8_t *expected(const struct model *m, uint64_t *size)
{
    uint64_t at = 0;
    for (int i = 0; i < m->n; i++) {
        at += m->items[i].out_bytes;
        if (m->items[i].pad_to)
            at += (m->items[i].pad_to - at % m->items[i].pad_to) % m->items[i].pad_to;
    }
    uint8_t *e = calloc(at ? at : 1, 1);
    at = 0;
    for (int i = 0; i < m->n; i++) {
        const struct qd_pipe_item *it = &m->items[i];
        const uint8_t *src = it->src ? m->src2 : m->src;
        if (it->kind == QD_PIPE_BYTES)
            memcpy(e + at, it->bytes, it->out_bytes);
        else if (it->kind == QD_PIPE_COPY)
            memcpy(e + at, src + it->src_offset, it->src_bytes);
        else
            for (uint64_t j = 0; j < it->out_bytes; j++)
                e[at + j] = (uint8_t)(src[it->src_offset + j % it->src_bytes] + i + j);
        at += it->out_bytes;
        if (it->pad_to)
            at += (it->pad_to - at % it->pad_to) % it->pad_to;
    }
    *size = at;
    return e;
}

static uint8_t *slurp(const char *path, uint64_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    *size = (uint64_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(*size ? *size : 1);
    if (fread(b, 1, *size, f) != *size)
        *size = 0;
    fclose(f);
    return b;
}

static int run_model(struct model *m, int mapped, int direct, int lanes, const char *out_path, enum qd_status *st,
                     char *err, size_t errlen)
{
    char src_path[2][600];
    int fds[2] = {-1, -1};
    for (int k = 0; k < m->sources; k++) {
        snprintf(src_path[k], sizeof src_path[k], "%s/pipe-src-XXXXXX", dir);
        fds[k] = mkstemp(src_path[k]);
        assert_true(fds[k] >= 0);
        assert_int_equal(write(fds[k], k ? m->src2 : m->src, m->src_size), (ssize_t)m->src_size);
    }
    uint64_t in_cap = 1, out_cap = 1;
    for (int i = 0; i < m->n; i++)
        if (m->items[i].kind == QD_PIPE_PROCESS) {
            in_cap = m->items[i].src_bytes > in_cap ? m->items[i].src_bytes : in_cap;
            out_cap = m->items[i].out_bytes > out_cap ? m->items[i].out_bytes : out_cap;
        }
    struct qd_pipe_pool *pool = qd_pipe_pool_new(NULL, in_cap, out_cap, lanes);
    assert_non_null(pool);
    assert_int_equal(qd_pipe_pool_modes(pool, mapped, direct), 0);
    struct qd_outfile out;
    assert_int_equal(qd_outfile_open(&out, out_path, err, errlen), 0);
    struct qd_pipe p = {.src_fd = fds[0], .out = &out, .items = m->items, .n = m->n, .process = process, .ctx = m,
                        .pool = pool, .lanes = lanes};
    if (m->sources > 1)
        p.src_fds = fds, p.n_src = m->sources;
    int rc = qd_pipe_run(&p, st, err, errlen);
    if (rc)
        qd_outfile_abort(&out);
    else
        assert_int_equal(qd_outfile_commit(&out, err, errlen), 0);
    qd_pipe_pool_free(pool);
    for (int k = 0; k < m->sources; k++) {
        close(fds[k]);
        unlink(src_path[k]);
    }
    return rc;
}

/* Whether O_DIRECT works where the test writes (else the direct runs fall back). */
static int direct_here(void)
{
    char path[600];
    snprintf(path, sizeof path, "%s/pipe-probe-XXXXXX", dir);
    int fd = mkstemp(path);
    if (fd < 0)
        return 0;
    close(fd);
    int dfd = open(path, O_WRONLY | O_DIRECT);
    void *b = NULL;
    int ok = dfd >= 0 && !posix_memalign(&b, 4096, 4096) && (memset(b, 0, 4096), pwrite(dfd, b, 4096, 0) == 4096);
    if (dfd >= 0)
        close(dfd);
    free(b);
    unlink(path);
    return ok;
}

/* Runs the model in a mode and compares the file with the items written one after the other. */
static void check_model(struct model *m, int mode, unsigned long long seed)
{
    uint64_t esize, gsize = 0;
    uint8_t *e = expected(m, &esize);
    char err[512];
    enum qd_status st;
    char out[600];
    snprintf(out, sizeof out, "%s/pipe-out.bin", dir);
    if (run_model(m, mode & 1, (mode >> 1) & 1, mode & 4 ? 3 : 1, out, &st, err, sizeof err))
        fail_msg("seed %llu mode %d: %s", seed, mode, err);
    uint8_t *g = slurp(out, &gsize);
    assert_non_null(g);
    if (gsize != esize || memcmp(g, e, esize)) {
        uint64_t k = 0, at = 0;
        while (k < esize && k < gsize && g[k] == e[k])
            k++;
        for (int i = 0; i < m->n; i++) { /* the items, to tell which one went wrong */
            printf("# item %d: kind %d, %llu bytes at %llu, pad_to %u\n", i, (int)m->items[i].kind,
                   (unsigned long long)m->items[i].out_bytes, (unsigned long long)at, m->items[i].pad_to);
            at += m->items[i].out_bytes;
            if (m->items[i].pad_to)
                at += (m->items[i].pad_to - at % m->items[i].pad_to) % m->items[i].pad_to;
        }
        fail_msg("seed %llu mode %d (%d items): %llu bytes, expected %llu; first difference at %llu", seed, mode,
                 m->n, (unsigned long long)gsize, (unsigned long long)esize, (unsigned long long)k);
    }
    unlink(out);
    free(g);
    free(e);
}

static void random_item_lists(void **state)
{
    rng = getenv("QD_PIPE_SEED") ? strtoull(getenv("QD_PIPE_SEED"), NULL, 10) : (uint64_t)time(NULL) * 2654435761u | 1;
    uint64_t seeds[6] = {1, 2, 3, 0x9e3779b97f4a7c15u, 42, rng};
    printf("# random seed %llu; O_DIRECT %s in %s\n", (unsigned long long)rng,
           direct_here() ? "works" : "is refused (plain writes tested twice)", dir);
    for (int s = 0; s < 6; s++)
        for (int mode = 0; mode < 8; mode++) {
            rng = seeds[s];
            struct model m;
            make_model(&m, 2 + (int)(next() % 40), 24u << 20);
            check_model(&m, mode, seeds[s]);
            free_model(&m);
        }
}

/* Items from two source files (qd_pipe.src_fds): each read, mapped or copied from its own. */
static void items_from_two_sources(void **state)
{
    for (int s = 0; s < 3; s++)
        for (int mode = 0; mode < 8; mode++) {
            rng = 101 + (uint64_t)s;
            struct model m;
            make_model(&m, 2 + (int)(next() % 40), 24u << 20);
            two_sources(&m);
            check_model(&m, mode, 101 + (uint64_t)s);
            free_model(&m);
        }
}

/* Copies longer than the pipeline's copy piece (64 MiB) are written by several writers, piece
 * by piece: the pieces must tile the item exactly, on and off block boundaries. */
static void big_copies_go_in_pieces(void **state)
{
    rng = 11;
    struct model m;
    make_model(&m, 5, 200u << 20);
    m.items[1] = (struct qd_pipe_item){.kind = QD_PIPE_COPY, .src_offset = 12345, .src_bytes = (150u << 20) + 333,
                                       .out_bytes = (150u << 20) + 333};
    m.items[3] = (struct qd_pipe_item){.kind = QD_PIPE_COPY, .src_offset = 3, .src_bytes = 64u << 20,
                                       .out_bytes = 64u << 20, .pad_to = 4096};
    for (int mode = 0; mode < 8; mode++)
        check_model(&m, mode, 11);
    free_model(&m);
}

static void a_failing_item_leaves_no_file(void **state)
{
    for (int mode = 0; mode < 8; mode++) {
        rng = 7;
        struct model m;
        make_model(&m, 12, 24u << 20);
        m.items[9] = (struct qd_pipe_item){.kind = QD_PIPE_PROCESS, .src_offset = 0, .src_bytes = 100, .out_bytes = 13};
        char err[512];
        enum qd_status st;
        char out[600];
        snprintf(out, sizeof out, "%s/pipe-fail.bin", dir);
        unlink(out);
        assert_int_equal(run_model(&m, mode & 1, (mode >> 1) & 1, mode & 4 ? 3 : 1, out, &st, err, sizeof err), -1);
        assert_int_equal(st, QD_EINVAL);
        assert_non_null(strstr(err, "item 9 refused"));
        struct stat sb;
        assert_int_equal(stat(out, &sb), -1);
        DIR *d = opendir(dir); /* nor its temporary name */
        for (struct dirent *de; d && (de = readdir(d));)
            if (strstr(de->d_name, "pipe-fail.bin"))
                fail_msg("left behind: %s", de->d_name);
        if (d)
            closedir(d);
        free_model(&m);
    }
}

int main(int argc, char **argv)
{
    char self[512];
    snprintf(self, sizeof self, "%s", argv[0]);
    snprintf(dir, sizeof dir, "%s", dirname(self));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(random_item_lists),
        cmocka_unit_test(items_from_two_sources),
        cmocka_unit_test(big_copies_go_in_pieces),
        cmocka_unit_test(a_failing_item_leaves_no_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
