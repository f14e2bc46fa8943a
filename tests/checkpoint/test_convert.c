/* server/checkpoint/convert.c and pipeline.c: a conversion cancelled midway (from its progress
 * callback, as DELETE /jobs/{id} does from another thread) stops with QD_ECANCELED and leaves
 * no output and no temporary file; one that completes leaves exactly its output. */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "checkpoint/convert.h"

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(cancelled_gguf_conversion_leaves_nothing),
        cmocka_unit_test(cancelled_safetensors_conversion_leaves_nothing),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
