/* The conversion engine's shared parts (convert.h): mapped input, atomic output files, name
 * filters, one tensor through a backend worker, and the dispatch to a target. */
#include "checkpoint/convert.h"
#include "checkpoint/pipeline.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <regex.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint/gguf.h"
#include "checkpoint/gguf_recipe.h"

int qd_map_file(const char *path, struct qd_mapped *m, char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s: not a regular file", path);
        close(fd);
        return -1;
    }
    m->size = (size_t)st.st_size;
    if (m->size) {
        void *p = mmap(NULL, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            snprintf(err, errlen, "%s: mmap: %s", path, strerror(errno));
            close(fd);
            return -1;
        }
        madvise(p, m->size, MADV_SEQUENTIAL); /* one pass, front to back */
        m->data = p;
    }
    close(fd);
    return 0;
}

void qd_unmap_file(struct qd_mapped *m)
{
    if (m->data)
        munmap((void *)m->data, m->size);
    memset(m, 0, sizeof *m);
}

void qd_release_pages(const void *p, size_t n)
{
    if (!n)
        return;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), lo = (uintptr_t)p / page * page;
    uintptr_t hi = ((uintptr_t)p + n + page - 1) / page * page; /* (a mapping's last page is whole) */
    madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

int qd_outfile_open(struct qd_outfile *f, const char *path, char *err, size_t errlen)
{
    memset(f, 0, sizeof *f);
    f->fd = -1;
    /* the temporary name sits in the destination's directory: the rename stays on one file
     * system, and a crash leaves a name that says what it is */
    char *dir = strdup(path), *base = strdup(path);
    size_t n = strlen(path) + 32;
    char *tmp = malloc(n);
    f->path = strdup(path);
    if (!dir || !base || !tmp || !f->path) {
        snprintf(err, errlen, "no memory");
        free(dir), free(base), free(tmp);
        qd_outfile_abort(f);
        return -1;
    }
    snprintf(tmp, n, "%s/.%s.quantd-XXXXXX", dirname(dir), basename(base));
    free(dir), free(base);
    f->fd = mkstemp(tmp);
    if (f->fd < 0) {
        snprintf(err, errlen, "%s: cannot create a file there: %s", path, strerror(errno));
        free(tmp);
        qd_outfile_abort(f);
        return -1;
    }
    f->tmp = tmp;
    fchmod(f->fd, 0644);
    return 0;
}

int qd_outfile_write(struct qd_outfile *f, const void *p, size_t n, char *err, size_t errlen)
{
    const char *c = p;
    while (n) {
        ssize_t w = write(f->fd, c, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            snprintf(err, errlen, "%s: write: %s", f->path, w < 0 ? strerror(errno) : "no progress");
            return -1;
        }
        c += w, n -= (size_t)w;
        f->written += (uint64_t)w;
    }
    return 0;
}

int qd_outfile_pad(struct qd_outfile *f, uint32_t alignment, char *err, size_t errlen)
{
    static const uint8_t zeros[256];
    size_t pad = (alignment - f->written % alignment) % alignment;
    return pad ? qd_outfile_write(f, zeros, pad, err, errlen) : 0;
}

enum qd_status qd_status_of_write(int err_no)
{
    return err_no == ENOSPC || err_no == EDQUOT || err_no == EFBIG ? QD_ENOSPC : QD_EIO;
}

int qd_outfile_commit(struct qd_outfile *f, char *err, size_t errlen)
{
    if (fsync(f->fd) < 0 || close(f->fd) < 0) {
        int e = errno;
        snprintf(err, errlen, "%s: %s", f->path, strerror(e));
        f->fd = -1;
        qd_outfile_abort(f);
        errno = e; /* (for qd_status_of_write) */
        return -1;
    }
    f->fd = -1;
    if (rename(f->tmp, f->path) < 0) {
        snprintf(err, errlen, "%s: rename: %s", f->path, strerror(errno));
        qd_outfile_abort(f);
        return -1;
    }
    /* the directory entry too, so the renamed file survives a crash */
    char *dir = strdup(f->path);
    int dfd = dir ? open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    free(dir);
    free(f->tmp);
    free(f->path);
    f->tmp = f->path = NULL;
    return 0;
}

void qd_outfile_abort(struct qd_outfile *f)
{
    if (f->fd >= 0)
        close(f->fd);
    if (f->tmp)
        unlink(f->tmp);
    free(f->tmp);
    free(f->path);
    memset(f, 0, sizeof *f);
    f->fd = -1;
}

struct qd_name_filter {
    int has_skip, has_only;
    regex_t skip, only;
};

struct qd_name_filter *qd_name_filter_new(const char *skip, const char *only, char *err, size_t errlen)
{
    struct qd_name_filter *nf = calloc(1, sizeof *nf);
    if (!nf) {
        snprintf(err, errlen, "no memory");
        return NULL;
    }
    const char *re[2] = {skip, only};
    regex_t *slot[2] = {&nf->skip, &nf->only};
    int *has[2] = {&nf->has_skip, &nf->has_only};
    for (int i = 0; i < 2; i++) {
        if (!re[i])
            continue;
        int rc = regcomp(slot[i], re[i], REG_EXTENDED | REG_NOSUB);
        if (rc) {
            char msg[128];
            regerror(rc, slot[i], msg, sizeof msg);
            snprintf(err, errlen, "--%s '%s': %s", i ? "only" : "skip", re[i], msg);
            qd_name_filter_free(nf);
            return NULL;
        }
        *has[i] = 1;
    }
    return nf;
}

int qd_name_filter_keeps(const struct qd_name_filter *nf, const char *name)
{
    if (nf->has_skip && !regexec(&nf->skip, name, 0, NULL, 0))
        return 0;
    return !nf->has_only || !regexec(&nf->only, name, 0, NULL, 0);
}

void qd_name_filter_free(struct qd_name_filter *nf)
{
    if (!nf)
        return;
    if (nf->has_skip)
        regfree(&nf->skip);
    if (nf->has_only)
        regfree(&nf->only);
    free(nf);
}

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

int qd_convert_lanes(const struct qd_convert_opts *o)
{
    int n = o->nworkers > QD_PIPE_MAX_LANES ? QD_PIPE_MAX_LANES : o->nworkers;
    return n > 1 && !o->report_error ? n : 1;
}

void qd_convert_use_lane(struct qd_convert_opts *o, int lane)
{
    if (o->nworkers > 1 && lane < o->nworkers)
        o->worker = o->workers[lane];
}

int qd_convert_spread(struct qd_convert_opts *o, char *err, size_t errlen)
{
    struct qd_backend *b = o->backend;
    struct qd_backend_stats bs = {0};
    if (b->stats)
        b->stats(b, &bs);
    o->nworkers = 0;
    if (bs.devices < 2)
        return 0;
    int mine = b->worker_slot ? b->worker_slot(o->worker) : 0, left_out = 0;
    o->workers[o->nworkers++] = o->worker;
    for (int slot = 0; slot < bs.devices && o->nworkers < QD_MAX_DEVICES; slot++) {
        char name[32];
        if (slot == mine || !bs.device_healthy[slot])
            continue;
        if ((o->workers[o->nworkers] = b->worker_open(b, slot, name, sizeof name, err, errlen)))
            o->nworkers++;
        else
            left_out++;
    }
    return left_out;
}

void qd_convert_unspread(struct qd_convert_opts *o)
{
    for (int w = 1; w < o->nworkers; w++)
        o->backend->worker_close(o->workers[w]);
    o->nworkers = 0;
}

const struct qd_format *qd_convert_format(const struct qd_format *f)
{
    return f && !strcmp(f->name, "int8") ? qd_format_find("w8a16") : f;
}

int qd_convert(const struct qd_convert_opts *o, struct qd_convert_summary *s, enum qd_status *status, char *err,
               size_t errlen)
{
    memset(s, 0, sizeof *s);
    *status = QD_EINVAL;
    if (o->recipe) { /* a llama-quantize mix: GGUF out, its default type as the format */
        const struct qd_gguf_recipe *r = qd_gguf_recipe_find(o->recipe);
        if (!r) {
            snprintf(err, errlen, "convert: unknown recipe '%.40s' (quantd writes %s)", o->recipe,
                     qd_gguf_recipe_names());
            return -1;
        }
        struct qd_convert_opts mix = *o;
        mix.f = qd_format_find(r->fmt);
        qd_params_default(mix.f, &mix.params);
        return qd_convert_gguf(&mix, s, status, err, errlen);
    }
    if (!strcmp(o->f->family, "ggml") || !strcmp(o->f->family, "kquant"))
        return qd_convert_gguf(o, s, status, err, errlen);
    if (!strcmp(o->f->family, "bnb4") || !strcmp(o->f->family, "ctint") || !strcmp(o->f->family, "awq"))
        return qd_convert_hf(o, s, status, err, errlen);
    if (!strcmp(o->f->name, "nvfp4") || !strcmp(o->f->name, "mxfp4")) {
        /* compressed-tensors' layouts fix the arithmetic: llm-compressor's NVFP4A16 / MXFP4A16,
         * linear scales, each module's global scale computed from its fused group */
        struct qd_convert_opts ct = *o;
        ct.params.scale_layout = QD_LAYOUT_LINEAR;
        if (!strcmp(o->f->name, "nvfp4")) {
            ct.params.flow = QD_FLOW_COMPRESSED_TENSORS;
            ct.params.two_level = 1;
            ct.params.has_global_scale = ct.params.has_per_tensor_scale = 0;
        } else
            ct.params.scale_rounding = QD_ROUND_EVEN;
        return qd_convert_hf(&ct, s, status, err, errlen);
    }
    snprintf(err, errlen, "convert: no checkpoint layout for format %s yet (GGML block formats and K-quants: GGUF "
             "in, GGUF out; nf4/fp4: a Hugging Face safetensors model in, transformers + bitsandbytes out; w4a16/w8a16: "
             "compressed-tensors out; nvfp4/mxfp4: compressed-tensors NVFP4A16/MXFP4A16 out; awq: AutoAWQ GEMM out)", o->f->name);
    return -1;
}
