/* The conversion engine (convert.h) that every target uses: one tensor through a backend worker,
 * and a conversion spread over the devices (files: convert_files.c; the pipeline: pipeline.c;
 * name filters: name_filter.c; the layout table and the dispatch to a target: convert_layouts.c). */
#include "checkpoint/convert.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


enum qd_status qd_convert_quantize(const struct qd_convert_opts *o, const void *src, enum qd_dtype dtype,
                                   int64_t rows, int64_t cols, void *out, int64_t out_bytes, double *nmse,
                                   struct qd_params *resolved, char *err, size_t errlen)
{
    struct qd_work w;
    memset(&w, 0, sizeof w);
    if (errlen)
        err[0] = 0;
    w.req.op = QD_OP_QUANTIZE;
    w.req.report_error = o->report_error;
    w.f = o->f;
    w.p = o->params;
    int64_t shape[2] = {rows, cols};
    w.in.dtype = dtype;
    if (qd_tensor_set_shape(&w.in, 2, shape) != QD_OK) {
        snprintf(err, errlen, "bad shape %lld x %lld", (long long)rows, (long long)cols);
        return QD_ESHAPE;
    }
    /* kernels load and store whole elements: a file may place a tensor, and a layout a
     * component, at any byte, so a misaligned one goes through an aligned copy */
    size_t in_size = qd_dtype_size(dtype);
    void *in_copy = NULL;
    if ((uintptr_t)src % in_size) {
        size_t n = (size_t)(rows * cols) * in_size;
        if (!(in_copy = malloc(n ? n : 1)))
            return QD_ENOMEM;
        memcpy(in_copy, src, n);
    }
    w.in.data = in_copy ? in_copy : (void *)src;
    w.nc = qd_format_layout(o->f, &w.p, &w.in, w.comps, err, errlen);
    if (w.nc < 0) {
        free(in_copy);
        return QD_ESHAPE;
    }
    int64_t at = 0;
    void *dest[QD_MAX_COMPONENTS] = {0};
    enum qd_status s = QD_OK;
    for (int i = 0; i < w.nc; i++) {
        dest[i] = (char *)out + at;
        w.comp[i] = dest[i];
        if ((uintptr_t)dest[i] % qd_dtype_size(w.comps[i].dtype) &&
            !(w.comp[i] = malloc(w.comps[i].bytes ? (size_t)w.comps[i].bytes : 1)))
            s = QD_ENOMEM;
        at += w.comps[i].bytes;
    }
    if (s == QD_OK && at != out_bytes) {
        snprintf(err, errlen, "internal: %s components take %lld bytes, the plan %lld", o->f->name, (long long)at,
                 (long long)out_bytes);
        s = QD_EINVAL;
    }
    if (s == QD_OK)
        s = o->backend->run(o->worker, &w, err, errlen);
    for (int i = 0; i < w.nc; i++)
        if (w.comp[i] && w.comp[i] != dest[i]) {
            if (s == QD_OK)
                memcpy(dest[i], w.comp[i], (size_t)w.comps[i].bytes);
            free(w.comp[i]);
        }
    free(in_copy);
    if (s == QD_ENOMEM && !err[0])
        snprintf(err, errlen, "out of memory");
    if (s == QD_OK && w.has_report && nmse)
        *nmse = w.report.nmse;
    if (resolved)
        *resolved = w.p;
    return s;
}

/* Streams per device: a second one copies the next piece in (and the last one out) while the
 * first one's kernel runs, where one stream alone leaves the GPU idle for every copy. A third
 * made the GPU-bound 8B IQ mixes 4-10 % faster than two on the medians (four no faster than
 * three; the disk-bound mixes and an HF nf4 conversion unchanged: docs/BENCHMARKS.md).
 * QUANTD_CONVERT_STREAMS (1..QD_MAX_STREAMS) overrides, for measuring. */
#define QD_STREAMS_PER_DEVICE 3
#define QD_MAX_STREAMS 4

static int streams_per_device(void)
{
    const char *v = getenv("QUANTD_CONVERT_STREAMS");
    int n = v ? atoi(v) : 0;
    return n >= 1 && n <= QD_MAX_STREAMS ? n : QD_STREAMS_PER_DEVICE;
}

int qd_convert_spread(struct qd_convert_opts *o, char *err, size_t errlen)
{
    struct qd_backend *b = o->backend;
    struct qd_backend_stats bs = {0};
    if (b->stats)
        b->stats(b, &bs);
    o->nworkers = 0;
    int streams = streams_per_device();
    if (bs.devices < 1 || bs.devices * streams < 2)
        return 0;
    int mine = b->worker_slot ? b->worker_slot(o->worker) : 0, left_out = 0;
    o->workers[o->nworkers++] = o->worker;
    /* stream by stream: with fewer lanes than devices x streams, each device still gets one */
    for (int k = 0; k < streams; k++)
        for (int slot = 0; slot < bs.devices && o->nworkers < QD_MAX_DEVICES; slot++) {
            char name[32];
            if ((k == 0 && slot == mine) || !bs.device_healthy[slot])
                continue;
            if ((o->workers[o->nworkers] = b->worker_open(b, slot, name, sizeof name, err, errlen)))
                o->nworkers++;
            else
                left_out += k == 0;
        }
    return left_out;
}

void qd_convert_unspread(struct qd_convert_opts *o)
{
    for (int w = 1; w < o->nworkers; w++)
        o->backend->worker_close(o->workers[w]);
    o->nworkers = 0;
}
