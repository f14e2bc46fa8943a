/* server/checkpoint/convert.c and pipeline.c: a conversion cancelled midway (from its progress
 * callback, as DELETE /jobs/{id} does from another thread) stops with QD_ECANCELED and leaves
 * no output and no temporary file; one that completes leaves exactly its output. A tensor or a
 * component at any byte offset converts to the same bytes (under make sanitize, without a
 * misaligned load or store). */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "checkpoint/convert.h"
#include "checkpoint/pipeline.h"

static struct qd_backend cpu;
static void *worker;

static int setup(void **state)
{
    char err[256], name[32];
    qd_backend_cpu_open(&cpu, err, sizeof err);
    worker = cpu.worker_open(&cpu, 0, name, sizeof name, err, sizeof err);
    return worker ? 0 : -1;
}

static int teardown(void **state)
{
    cpu.worker_close(worker);
    cpu.close(&cpu);
    return 0;
}

static volatile int cancel;
static int cancel_after;

static void on_tensor(void *ctx, const struct qd_convert_event *ev)
{
    if (ev->index >= cancel_after)
        cancel = 1;
}

static int entries(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;
    while (d && (e = readdir(d)))
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    if (d)
        closedir(d);
    return n;
}

static void run(const char *seed, const char *out_name, const char *fmt, int cancel_at)
{
    char dir[] = "/tmp/quantd-cancel-XXXXXX", in[64], out[64], err[512];
    assert_non_null(mkdtemp(dir));
    snprintf(in, sizeof in, "%s/in", dir);
    snprintf(out, sizeof out, "%s/%s", dir, out_name);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "cp tests/checkpoint/fuzz_seeds/%s %s", seed, in);
    assert_int_equal(system(cmd), 0);
    struct qd_convert_opts o = {.src = in, .dst = out, .f = qd_format_find(fmt), .backend = &cpu, .worker = worker,
                                .progress = on_tensor, .cancel = &cancel};
    qd_params_default(o.f, &o.params);
    cancel = 0;
    cancel_after = cancel_at;
    struct qd_convert_summary s;
    enum qd_status st;
    int rc = qd_convert(&o, &s, &st, err, sizeof err);
    free(s.layout_config);
    if (cancel_at < 100) {
        assert_int_equal(rc, -1);
        assert_int_equal(st, QD_ECANCELED);
        assert_int_equal(entries(dir), 1); /* the input alone */
    } else {
        if (rc)
            fail_msg("%s", err);
        assert_int_equal(entries(dir), 2);
        assert_int_equal(access(out, R_OK), 0);
    }
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

static void cancelled_gguf_conversion_leaves_nothing(void **state)
{
    run("small.gguf", "out.gguf", "q8_0", 1);
    run("small.gguf", "out.gguf", "q8_0", 1000);
}

static void cancelled_safetensors_conversion_leaves_nothing(void **state)
{
    run("small.safetensors", "out.safetensors", "nf4", 1);
    run("small.safetensors", "out.safetensors", "nf4", 1000);
}

static int events;
static void count_event(void *ctx, const struct qd_convert_event *ev) { events++; }

static long slurp(const char *path, char *buf, long cap)
{
    FILE *f = fopen(path, "rb");
    long n = f ? (long)fread(buf, 1, (size_t)cap, f) : -1;
    if (f)
        fclose(f);
    return n;
}

/* A GGUF tensor cut into pieces of rows (every piece one row here) gives the same file, the
 * same counts and one progress event per tensor, as the tensor in one piece. */
static void gguf_pieces_give_the_same_file(void **state)
{
    char dir[] = "/tmp/quantd-pieces-XXXXXX", in[64], out[2][64], err[512], cmd[256];
    static char a[1 << 16], b[1 << 16];
    assert_non_null(mkdtemp(dir));
    snprintf(in, sizeof in, "%s/in", dir);
    snprintf(cmd, sizeof cmd, "cp tests/checkpoint/fuzz_seeds/small.gguf %s", in);
    assert_int_equal(system(cmd), 0);
    const char *fmts[] = {"q8_0", "q4_1"};
    for (size_t fi = 0; fi < sizeof fmts / sizeof *fmts; fi++) {
        struct qd_convert_summary s[2];
        for (int k = 0; k < 2; k++) {
            snprintf(out[k], sizeof out[k], "%s/out%d.gguf", dir, k);
            struct qd_convert_opts o = {.src = in, .dst = out[k], .f = qd_format_find(fmts[fi]), .backend = &cpu,
                                        .worker = worker, .progress = count_event, .piece_bytes = k ? 1 : 0};
            qd_params_default(o.f, &o.params);
            enum qd_status st;
            events = 0;
            if (qd_convert(&o, &s[k], &st, err, sizeof err))
                fail_msg("%s: %s", fmts[fi], err);
            free(s[k].layout_config);
            assert_int_equal(events, 2); /* t.weight (2 rows: 2 pieces), n.weight */
        }
        long na = slurp(out[0], a, sizeof a), nb = slurp(out[1], b, sizeof b);
        assert_true(na > 0 && na == nb);
        assert_memory_equal(a, b, (size_t)na);
        assert_int_equal(s[0].quantized, 1);
        assert_int_equal(s[1].quantized, 1);
        assert_int_equal(s[0].copied, s[1].copied);
        assert_true(s[0].bytes_in == s[1].bytes_in && s[0].bytes_out == s[1].bytes_out);
        unlink(out[0]), unlink(out[1]);
    }
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* Several workers (one per device with --devices): the pipeline quantizes on all of them at
 * once, items finishing out of order; the file is the one a single worker writes, and the
 * progress still comes once per tensor, in order. */
static void several_workers_give_the_same_file(void **state)
{
    char dir[] = "/tmp/quantd-lanes-XXXXXX", in[64], out[2][64], err[512], cmd[256], name[32];
    static char a[1 << 16], b[1 << 16];
    assert_non_null(mkdtemp(dir));
    void *more[2];
    for (int w = 0; w < 2; w++)
        assert_non_null(more[w] = cpu.worker_open(&cpu, w + 1, name, sizeof name, err, sizeof err));
    const char *seeds[] = {"small.gguf", "small.safetensors"}, *fmts[] = {"q8_0", "nf4"};
    for (int c = 0; c < 2; c++) {
        snprintf(in, sizeof in, "%s/in", dir);
        snprintf(cmd, sizeof cmd, "cp tests/checkpoint/fuzz_seeds/%s %s", seeds[c], in);
        assert_int_equal(system(cmd), 0);
        int ev[2];
        for (int k = 0; k < 2; k++) {
            snprintf(out[k], sizeof out[k], "%s/out%d", dir, k);
            struct qd_convert_opts o = {.src = in, .dst = out[k], .f = qd_format_find(fmts[c]), .backend = &cpu,
                                        .worker = worker, .progress = count_event, .piece_bytes = 1,
                                        .workers = {worker, more[0], more[1]}, .nworkers = k ? 3 : 0};
            qd_params_default(o.f, &o.params);
            assert_int_equal(qd_convert_lanes(&o), k ? 3 : 1);
            struct qd_convert_summary s;
            enum qd_status st;
            events = 0;
            if (qd_convert(&o, &s, &st, err, sizeof err))
                fail_msg("%s, %d lanes: %s", fmts[c], k ? 3 : 1, err);
            free(s.layout_config);
            ev[k] = events;
        }
        assert_int_equal(ev[0], ev[1]);
        long na = slurp(out[0], a, sizeof a), nb = slurp(out[1], b, sizeof b);
        assert_true(na > 0 && na == nb);
        assert_memory_equal(a, b, (size_t)na);
        unlink(out[0]), unlink(out[1]), unlink(in);
    }
    for (int w = 0; w < 2; w++)
        cpu.worker_close(more[w]);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* A backend of fake devices for qd_convert_spread: a worker is the slot it was opened on. */
static int fake_devices, fake_lost = -1, fake_open[QD_MAX_DEVICES];
static void *fake_worker_open(struct qd_backend *b, int index, char *name, size_t namelen, char *err, size_t errlen)
{
    fake_open[index]++;
    return (void *)(intptr_t)(index + 1);
}
static void fake_worker_close(void *w) { fake_open[(intptr_t)w - 1]--; }
static int fake_worker_slot(void *w) { return (int)(intptr_t)w - 1; }
static void fake_stats(struct qd_backend *b, struct qd_backend_stats *s)
{
    s->devices = fake_devices;
    for (int d = 0; d < fake_devices; d++)
        s->device_healthy[d] = d != fake_lost;
}

/* The slots of o's workers after spreading from a worker on slot `mine`, as a string ("0101") */
static void spread_slots(int devices, int lost, int mine, const char *streams, char *slots)
{
    struct qd_backend b = {.kind = "fake", .worker_open = fake_worker_open, .worker_close = fake_worker_close,
                           .worker_slot = fake_worker_slot, .stats = fake_stats};
    char err[64];
    fake_devices = devices, fake_lost = lost;
    if (streams)
        setenv("QUANTD_CONVERT_STREAMS", streams, 1);
    else
        unsetenv("QUANTD_CONVERT_STREAMS");
    struct qd_convert_opts o = {.backend = &b, .worker = (void *)(intptr_t)(mine + 1)};
    assert_int_equal(qd_convert_spread(&o, err, sizeof err), 0);
    int n = 0;
    for (int w = 0; w < o.nworkers; w++)
        slots[n++] = (char)('0' + fake_worker_slot(o.workers[w]));
    slots[n] = 0;
    assert_int_equal(qd_convert_lanes(&o), n ? n : 1);
    qd_convert_unspread(&o);
    for (int d = 0; d < QD_MAX_DEVICES; d++) /* every worker it opened closed again */
        assert_int_equal(fake_open[d], 0);
}

/* A conversion takes three streams on each healthy device (copies overlap the others'
 * kernels): the caller's worker first, one on every other device, then the second streams,
 * then the third; one device gets three lanes; QUANTD_CONVERT_STREAMS=1 gives one a device (and
 * one device no spreading), =2 two; a CPU backend (no devices) none; never more lanes than
 * QD_MAX_DEVICES. */
static void a_conversion_spreads_over_three_streams_a_device(void **state)
{
    char slots[QD_MAX_DEVICES + 1];
    spread_slots(1, -1, 0, NULL, slots);
    assert_string_equal(slots, "000");
    spread_slots(3, -1, 1, NULL, slots);
    assert_string_equal(slots, "102012012");
    spread_slots(3, 2, 0, NULL, slots);
    assert_string_equal(slots, "010101");
    spread_slots(3, -1, 1, "2", slots);
    assert_string_equal(slots, "102012");
    spread_slots(8, -1, 0, NULL, slots); /* 24 asked, 16 kept: every device's first two */
    assert_string_equal(slots, "0123456701234567");
    spread_slots(3, -1, 0, "1", slots);
    assert_string_equal(slots, "012");
    spread_slots(1, -1, 0, "1", slots);
    assert_string_equal(slots, "");
    spread_slots(0, -1, 0, NULL, slots);
    assert_string_equal(slots, "");
    spread_slots(1, -1, 0, "9", slots); /* out of range: the default */
    assert_string_equal(slots, "000");
    unsetenv("QUANTD_CONVERT_STREAMS");
}

/* A file may put a tensor, and a layout a component, at any byte: the bytes must not depend on
 * where (nf4 with double quant: packed codes, then f32 and uint8 scale components; q8_0: blocks) */
static void misaligned_tensors_give_the_same_bytes(void **state)
{
    const char *fmts[] = {"nf4", "fp4", "q8_0", "awq", "nvfp4"};
    enum { ROWS = 256, COLS = 128 };
    static uint16_t src[ROWS * COLS];
    uint32_t seed = 12345;
    for (int i = 0; i < ROWS * COLS; i++) {
        seed = seed * 1664525u + 1013904223u;
        src[i] = (uint16_t)(0x3800 + (seed >> 20) % 0x0c00) | (seed & 0x80000000u ? 0x8000 : 0); /* finite f16 */
    }
    for (size_t fi = 0; fi < sizeof fmts / sizeof *fmts; fi++) {
        const struct qd_format *f = qd_format_find(fmts[fi]);
        assert_non_null(f);
        struct qd_convert_opts o = {.f = f, .backend = &cpu, .worker = worker};
        qd_params_default(f, &o.params);
        struct qd_tensor t = {.dtype = QD_F16};
        int64_t shape[2] = {ROWS, COLS};
        assert_int_equal(qd_tensor_set_shape(&t, 2, shape), QD_OK);
        struct qd_component comps[QD_MAX_COMPONENTS];
        char err[512];
        struct qd_params p = o.params;
        int nc = qd_format_layout(f, &p, &t, comps, err, sizeof err);
        if (nc <= 0)
            fail_msg("%s: %s", fmts[fi], err);
        int64_t bytes = 0;
        for (int i = 0; i < nc; i++)
            bytes += comps[i].bytes;
        size_t cap = ((size_t)bytes + 127) / 64 * 64;
        uint8_t *want = aligned_alloc(64, cap), *got = aligned_alloc(64, cap);
        uint8_t *in = aligned_alloc(64, (sizeof src + 127) / 64 * 64);
        assert_true(want && got && in);
        memcpy(in, src, sizeof src);
        if (qd_convert_quantize(&o, in, QD_F16, ROWS, COLS, want, bytes, NULL, NULL, err, sizeof err) != QD_OK)
            fail_msg("%s: %s", fmts[fi], err);
        for (int shift = 1; shift < 8; shift++) {
            memcpy(in + shift, src, sizeof src);
            memset(got, 0xa5, (size_t)bytes + 64);
            if (qd_convert_quantize(&o, in + shift, QD_F16, ROWS, COLS, got + shift, bytes, NULL, NULL, err,
                                    sizeof err) != QD_OK)
                fail_msg("%s at +%d: %s", fmts[fi], shift, err);
            if (memcmp(want, got + shift, (size_t)bytes))
                fail_msg("%s: the bytes differ when placed at +%d", fmts[fi], shift);
        }
        free(want), free(got), free(in);
    }
}

/* A model directory whose weights file is a FIFO: the conversion refuses it at once (a reader
 * that waited for a writer would block the worker for good; SIGALRM ends the test if so). */
static void a_fifo_in_a_model_directory_is_refused_not_waited_on(void **state)
{
    char dir[] = "/tmp/quantd-fifo-XXXXXX", p[96], out[96], err[512], cmd[128];
    assert_non_null(mkdtemp(dir));
    snprintf(p, sizeof p, "%s/hf", dir);
    assert_int_equal(mkdir(p, 0755), 0);
    snprintf(p, sizeof p, "%s/hf/config.json", dir);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs("{}", f);
    fclose(f);
    snprintf(p, sizeof p, "%s/hf/model.safetensors", dir);
    assert_int_equal(mkfifo(p, 0644), 0);
    snprintf(p, sizeof p, "%s/hf", dir);
    snprintf(out, sizeof out, "%s/q", dir);
    struct qd_convert_opts o = {.src = p, .dst = out, .f = qd_format_find("nf4"), .backend = &cpu, .worker = worker};
    qd_params_default(o.f, &o.params);
    struct qd_convert_summary s;
    enum qd_status st;
    alarm(30);
    int rc = qd_convert(&o, &s, &st, err, sizeof err);
    alarm(0);
    free(s.layout_config);
    assert_int_equal(rc, -1);
    if (!strstr(err, "not a regular file"))
        fail_msg("%s", err);
    assert_int_equal(entries(dir), 1); /* no output, no temporary */
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* Confined to a root (a service's --data-dir), a conversion opens nothing outside it, whatever
 * link leads there: a weights file that is a symlink out of the root is refused. */
static void a_confined_conversion_reads_nothing_outside_its_root(void **state)
{
    char dir[] = "/tmp/quantd-root-XXXXXX", root[64], p[160], out[128], err[512], cmd[128], real[4096];
    assert_non_null(mkdtemp(dir));
    snprintf(root, sizeof root, "%s/data", dir);
    assert_int_equal(mkdir(root, 0755), 0);
    snprintf(p, sizeof p, "cp tests/checkpoint/fuzz_seeds/small.safetensors %s/outside.safetensors", dir);
    assert_int_equal(system(p), 0);
    snprintf(p, sizeof p, "%s/model.safetensors", root);
    char target[96];
    snprintf(target, sizeof target, "%s/outside.safetensors", dir);
    assert_int_equal(symlink(target, p), 0);
    snprintf(out, sizeof out, "%s/out.safetensors", root);
    assert_non_null(realpath(root, real));
    struct qd_convert_opts o = {.src = p, .dst = out, .f = qd_format_find("nf4"), .backend = &cpu, .worker = worker,
                                .root = real};
    qd_params_default(o.f, &o.params);
    struct qd_convert_summary s;
    enum qd_status st;
    int rc = qd_convert(&o, &s, &st, err, sizeof err);
    free(s.layout_config);
    assert_int_equal(rc, -1);
    if (!strstr(err, "outside"))
        fail_msg("%s", err);
    assert_int_equal(access(out, F_OK), -1);
    o.root = NULL; /* the CLI's own files: followed */
    rc = qd_convert(&o, &s, &st, err, sizeof err);
    free(s.layout_config);
    if (rc)
        fail_msg("%s", err);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* A forced stop removes every temporary, and none is renamed into place after it. (Last: the
 * stop holds for the rest of the process.) */
static void a_forced_stop_removes_temporaries_and_commits_nothing(void **state)
{
    char dir[] = "/tmp/quantd-forced-XXXXXX", p[96], d[96], err[256];
    assert_non_null(mkdtemp(dir));
    snprintf(p, sizeof p, "%s/out.gguf", dir);
    snprintf(d, sizeof d, "%s/model", dir);
    struct qd_outfile f;
    struct qd_outdir od;
    assert_int_equal(qd_outfile_open(&f, p, err, sizeof err), 0);
    assert_int_equal(qd_outfile_write(&f, "data", 4, err, sizeof err), 0);
    assert_int_equal(qd_outdir_open(&od, d, err, sizeof err), 0);
    assert_int_equal(entries(dir), 2); /* the two temporaries */
    assert_int_equal(qd_convert_remove_temporaries(), 2);
    assert_int_equal(entries(dir), 0);
    assert_int_equal(qd_outfile_commit(&f, err, sizeof err), -1);
    assert_int_equal(qd_outdir_commit(&od, err, sizeof err), -1);
    assert_int_equal(entries(dir), 0);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(cancelled_gguf_conversion_leaves_nothing),
        cmocka_unit_test(cancelled_safetensors_conversion_leaves_nothing),
        cmocka_unit_test(misaligned_tensors_give_the_same_bytes),
        cmocka_unit_test(gguf_pieces_give_the_same_file),
        cmocka_unit_test(several_workers_give_the_same_file),
        cmocka_unit_test(a_conversion_spreads_over_three_streams_a_device),
        cmocka_unit_test(a_fifo_in_a_model_directory_is_refused_not_waited_on),
        cmocka_unit_test(a_confined_conversion_reads_nothing_outside_its_root),
        cmocka_unit_test(a_forced_stop_removes_temporaries_and_commits_nothing),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
