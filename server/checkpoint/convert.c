/* The conversion engine's shared parts (convert.h): mapped input, atomic output files, one tensor
 * through a backend worker, and the dispatch to a target (name filters: name_filter.c). */
#include "checkpoint/convert.h"
#include "checkpoint/pipeline.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint/gguf.h"
#include "checkpoint/gguf_recipe.h"
#include "checkpoint/hf_layout.h"

int qd_map_file(const char *path, struct qd_mapped *m, char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    int fd = qd_open_input(path, err, errlen);
    struct stat st;
    if (fd < 0)
        return -1;
    if (fstat(fd, &st) < 0) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
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
    qd_temp_add(tmp, 0);
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
    if (qd_temp_rename(f->tmp, f->path) < 0) {
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
    if (f->tmp) {
        unlink(f->tmp);
        qd_temp_forget(f->tmp);
    }
    free(f->tmp);
    free(f->path);
    memset(f, 0, sizeof *f);
    f->fd = -1;
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

const struct qd_format *qd_convert_format_named(const char *name)
{
    for (int i = 0; name && i < qd_format_count; i++)
        if (!strcasecmp(qd_formats[i].name, name))
            return qd_convert_format(&qd_formats[i]);
    return NULL;
}

const struct qd_gguf_recipe *qd_convert_recipe_named(const char *name)
{
    const struct qd_gguf_recipe *r = qd_gguf_recipe_find(name);
    char upper[16];
    size_t n = name ? strlen(name) : 0;
    if (r || !n || n >= sizeof upper)
        return r;
    for (size_t i = 0; i <= n; i++) /* llama-quantize spells them in capitals, but for the K */
        upper[i] = (char)toupper((unsigned char)name[i]);
    return qd_gguf_recipe_find(upper);
}

/* ---- layouts: what each format writes, and from what ------------------------------------- */

#define TAKES(k) (1u << (k))
#define TAKES_HF (TAKES(QD_INPUT_HF_DIR) | TAKES(QD_INPUT_SAFETENSORS) | TAKES(QD_INPUT_OTHER))

/* The layout table: a format converts through the first entry naming its family (or the format
 * itself). GGUF out needs a llama.cpp file type (q8_1 has none). Another OTHER file goes to the
 * HF reader, whose message names what is wrong with its header; a GGUF reader names a bad magic.
 * Adding a Hugging Face layout: its file (hf_layout.h says what it defines) and one row here
 * naming it in .hf. */
static const struct layout {
    const char *family, *name;
    const char *writes;
    unsigned takes; /* TAKES(input kinds) */
    int (*run)(const struct qd_convert_opts *o, struct qd_convert_summary *s, enum qd_status *status, char *err,
               size_t errlen);
    const struct qd_hf_layout_desc *hf; /* a Hugging Face layout (run NULL) */
} layouts[] = {
    {"ggml", NULL, "llama.cpp GGUF (llama-quantize --pure)", TAKES(QD_INPUT_GGUF) | TAKES(QD_INPUT_OTHER),
     qd_convert_gguf, NULL},
    {"kquant", NULL, "llama.cpp GGUF (llama-quantize --pure)", TAKES(QD_INPUT_GGUF) | TAKES(QD_INPUT_OTHER),
     qd_convert_gguf, NULL},
    {"bnb4", NULL, "transformers + bitsandbytes", TAKES_HF, NULL, &qd_hf_bnb},
    {"ctint", NULL, "compressed-tensors (llm-compressor W4A16, W8A16; int8 is w8a16)", TAKES_HF, NULL, &qd_hf_ct_int},
    {NULL, "nvfp4", "compressed-tensors NVFP4A16", TAKES_HF, NULL, &qd_hf_ct_nvfp4},
    {NULL, "mxfp4", "compressed-tensors MXFP4A16", TAKES_HF, NULL, &qd_hf_ct_mxfp4},
    {"awq", NULL, "AutoAWQ GEMM", TAKES_HF, NULL, &qd_hf_awq},
    {"fp8", NULL, "compressed-tensors FP8_DYNAMIC, FP8_BLOCK, W8A8; FineGrainedFP8", TAKES_HF, NULL, &qd_hf_ct_fp8},
};

static const struct layout *layout_of(const struct qd_format *f)
{
    for (size_t i = 0; f && i < sizeof layouts / sizeof *layouts; i++) {
        const struct layout *l = &layouts[i];
        if (l->name ? !strcmp(l->name, f->name) : !strcmp(l->family, f->family))
            return l->run == qd_convert_gguf && !f->gguf_file_type ? NULL : l;
    }
    return NULL;
}

/* The names of the formats whose layout takes input kind in (or, with in < 0, writes what l
 * writes), registry order, space-separated. */
static void format_names(int in, const struct layout *l, char *out, size_t len)
{
    size_t n = 0;
    out[0] = 0;
    for (int k = 0; k < qd_format_count && n < len; k++) {
        const struct layout *fl = layout_of(qd_convert_format(&qd_formats[k]));
        if (fl && (in >= 0 ? (fl->takes & TAKES(in)) && in != QD_INPUT_OTHER : fl->writes == l->writes))
            n += (size_t)snprintf(out + n, len - n, "%s%s", n ? " " : "", qd_formats[k].name);
    }
}

static char formats_from[QD_INPUT_SPECIAL + 1][256], layouts_text[1536];

static void describe_layouts(void)
{
    for (int in = 0; in <= QD_INPUT_SPECIAL; in++)
        format_names(in, NULL, formats_from[in], sizeof formats_from[in]);
    size_t at = 0;
    for (int gguf = 1; gguf >= 0; gguf--) {
        at += (size_t)snprintf(layouts_text + at, sizeof layouts_text - at, "    from %s:\n",
                               gguf ? "a GGUF file (F32, F16 or BF16 weights)"
                                    : "a Hugging Face directory, or one .safetensors file");
        for (size_t i = 0; i < sizeof layouts / sizeof *layouts && at < sizeof layouts_text; i++) {
            const struct layout *l = &layouts[i];
            if (!!(l->takes & TAKES(QD_INPUT_GGUF)) != gguf || (i && l->writes == layouts[i - 1].writes))
                continue; /* (the K-quants write the legacy blocks' file) */
            char names[160];
            format_names(-1, l, names, sizeof names);
            const int w = (int)strlen(names);
            at += w > 20 ? (size_t)snprintf(layouts_text + at, sizeof layouts_text - at, "      %s\n      %20s  %s\n",
                                            names, "", l->writes)
                         : (size_t)snprintf(layouts_text + at, sizeof layouts_text - at, "      %-20s  %s\n", names,
                                            l->writes);
        }
    }
}

static pthread_once_t described = PTHREAD_ONCE_INIT;

const char *qd_convert_formats_from(enum qd_convert_input in)
{
    pthread_once(&described, describe_layouts);
    return in <= QD_INPUT_SPECIAL ? formats_from[in] : "";
}

const char *qd_convert_layouts_text(void)
{
    pthread_once(&described, describe_layouts);
    return layouts_text;
}

/* What the input is, against what the format reads: 0, or -1 with the message. */
static int check_input(const struct qd_convert_opts *o, const struct layout *l, enum qd_convert_input in,
                       enum qd_status *status, char *err, size_t errlen)
{
    const char *fmt = o->recipe ? o->recipe : o->f->name, *src = o->src;
    const int gguf_out = l->run == qd_convert_gguf;
    static const char hf_model[] = "a Hugging Face model (a directory with config.json and .safetensors weights, "
                                   "or one .safetensors file)";
    *status = QD_EINVAL;
    switch (in) {
    case QD_INPUT_MISSING:
        snprintf(err, errlen, "%s: %s", src, strerror(errno));
        *status = errno == ENOENT ? QD_ENOTFOUND : QD_EINVAL;
        return -1;
    case QD_INPUT_SPECIAL:
        snprintf(err, errlen, "%s is not a regular file or a directory (a FIFO, device or socket): quantd reads "
                 "model files", src);
        return -1;
    case QD_INPUT_HF_DIR:
        if (!gguf_out) {
            char config[4200];
            struct stat st;
            snprintf(config, sizeof config, "%s/config.json", src);
            if (stat(config, &st) < 0 || !S_ISREG(st.st_mode)) {
                snprintf(err, errlen, "%s has no config.json: a Hugging Face model directory holds config.json beside "
                         "its .safetensors weights (or give one .safetensors file)", src);
                return -1;
            }
            return 0;
        }
        snprintf(err, errlen, "%s is a directory (a Hugging Face model); %s writes a GGUF from a GGUF file: make "
                 "one with llama.cpp's convert_hf_to_gguf.py (python convert_hf_to_gguf.py %s --outtype f16 "
                 "--outfile model-f16.gguf), then convert that. From this directory quantd writes %s", src, fmt, src,
                 qd_convert_formats_from(QD_INPUT_HF_DIR));
        return -1;
    case QD_INPUT_SAFETENSORS:
        if (gguf_out) {
            snprintf(err, errlen, "%s is a safetensors file; %s writes a GGUF from a GGUF file (llama.cpp's "
                     "convert_hf_to_gguf.py makes one from the model's directory). From a safetensors file quantd "
                     "writes %s", src, fmt, qd_convert_formats_from(QD_INPUT_SAFETENSORS));
            return -1;
        }
        return 0;
    case QD_INPUT_GGUF:
        if (!gguf_out) {
            snprintf(err, errlen, "%s is a GGUF file; %s writes %s from %s. From a GGUF quantd writes %s, or a "
                     "llama-quantize mix (recipe: %s)", src, fmt, l->writes, hf_model,
                     qd_convert_formats_from(QD_INPUT_GGUF), qd_gguf_recipe_names());
            return -1;
        }
        return 0;
    case QD_INPUT_OTHER: /* the reader names what is wrong with the header */
        return 0;
    }
    return 0;
}

int qd_convert_check(const struct qd_convert_opts *o, struct qd_convert_dest *d, enum qd_status *status, char *err,
                     size_t errlen)
{
    memset(d, 0, sizeof *d);
    *status = QD_EINVAL;
    const struct qd_gguf_recipe *r = o->recipe ? qd_gguf_recipe_find(o->recipe) : NULL;
    if (o->recipe && !r) {
        snprintf(err, errlen, "convert: unknown recipe '%.40s' (quantd writes %s)", o->recipe, qd_gguf_recipe_names());
        return -1;
    }
    const struct qd_format *f = r ? qd_format_find(r->fmt) : o->f;
    const struct layout *l = layout_of(f);
    if (!l && f && f->gguf_type) {
        snprintf(err, errlen, "convert: %s has no llama.cpp file type (llama-quantize does not write it); use %s",
                 f->name, qd_convert_formats_from(QD_INPUT_GGUF));
        return -1;
    }
    if (!l) {
        snprintf(err, errlen, "convert: no checkpoint layout for format %s; quantd convert writes:\n%s",
                 f ? f->name : "(none)", qd_convert_layouts_text());
        return -1;
    }
    if (l->hf && l->hf->pick && !l->hf->pick(f, &o->params, err, errlen))
        return -1;
    const enum qd_convert_input in = qd_convert_input_kind(o->src);
    if (check_input(o, l, in, status, err, errlen))
        return -1;
    return qd_convert_check_dest(o->src, o->dst, in, o->overwrite, d, status, err, errlen);
}

int qd_convert(const struct qd_convert_opts *o, struct qd_convert_summary *s, enum qd_status *status, char *err,
               size_t errlen)
{
    memset(s, 0, sizeof *s);
    *status = QD_EINVAL;
    struct qd_convert_dest d;
    if (qd_convert_check(o, &d, status, err, errlen))
        return -1;
    *status = QD_EINVAL; /* (a target's failure that sets none is the input's) */
    if (o->cancel && *o->cancel) {
        snprintf(err, errlen, "convert: cancelled before it started");
        *status = QD_ECANCELED;
        return -1;
    }
    struct qd_convert_opts run = *o;
    run.dst = d.path;
    if (o->recipe) { /* a llama-quantize mix: GGUF out, its default type as the format */
        run.f = qd_format_find(qd_gguf_recipe_find(o->recipe)->fmt);
        qd_params_default(run.f, &run.params);
    }
    qd_convert_confine(o->root);
    const struct layout *l = layout_of(run.f);
    const struct qd_hf_layout_desc *hf = l->hf && l->hf->pick ? l->hf->pick(run.f, &run.params, err, errlen) : l->hf;
    int rc = hf ? qd_convert_hf(hf, &run, s, status, err, errlen) : l->run(&run, s, status, err, errlen);
    qd_convert_confine(NULL);
    return rc;
}
