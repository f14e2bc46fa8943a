/* A Hugging Face safetensors model in -> a quantized Hugging Face checkpoint out, shard for
 * shard, in one of the layouts of hf_layout.h (bitsandbytes: hf_bnb.c, compressed-tensors:
 * hf_ct.c, AutoAWQ: hf_awq.c); this file is what they share.
 * Which weights each tool quantizes depends on the model class: config.json's model_type picks
 * an entry of the architecture table (arch.h, generated from what the tools wrote); a model type
 * it lacks, or a weight its entry does not list, goes by the generic rule (qd_arch_generic:
 * every 2-D float "<m>.weight" but embeddings and the head, the nn.Linear set of Llama-like
 * models), and the summary and progress lines say so.
 * A weight the layout quantizes becomes the layout's tensors (named by it), then its trailer
 * where it has one; everything else is copied bit for bit (or cast, as the tool does);
 * config.json gains quantization_config; the other files of the directory (tokenizer,
 * generation config) are copied; a sharded model keeps its shard names and gets a new
 * model.safetensors.index.json.
 * A single .safetensors file in gives a single file out, its quantization_config in the
 * __metadata__ (for clients that write config.json themselves). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../kernels/fp.h"
#include "checkpoint/arch.h"
#include "checkpoint/convert.h"
#include "checkpoint/hf_config.h"
#include "checkpoint/hf_layout.h"
#include "checkpoint/pipeline.h"
#include "checkpoint/safetensors.h"

const char *qd_hf_torch_dtype(const char *st) /* str(torch dtype).strip("torch.") */
{
    return !strcmp(st, "F32") ? "float32" : !strcmp(st, "F16") ? "float16" : "bfloat16";
}

/* F32, F16 or BF16: the tensors the layouts quantize or cast */
static int float_dtype(const char *dt) { return !strcmp(dt, "F32") || !strcmp(dt, "F16") || !strcmp(dt, "BF16"); }

/* Whether the layout's tool quantizes t: as the architecture's rules say where they list it (a
 * listed weight that is not 2-D float is copied), else by the generic rule, which then sets
 * *generic when it decides to quantize (rules NULL: every tensor goes by the generic rule). */
static int quantized_weight(const struct qd_arch_rules *rules, const struct qd_st_entry *t, int *generic)
{
    const int generic_says = qd_arch_generic(t->name, t->ndim, t->dtype);
    const enum qd_arch_decision d = rules ? qd_arch_decide(rules, t->name) : QD_ARCH_UNLISTED;
    *generic = !rules || (d == QD_ARCH_UNLISTED && generic_says);
    if (d == QD_ARCH_UNLISTED)
        return generic_says;
    return d == QD_ARCH_QUANTIZE && t->ndim == 2 && float_dtype(t->dtype);
}

static uint64_t ew_out_bytes(enum qd_hf_elementwise ew, uint64_t in_bytes, int elem_bits)
{
    const uint64_t n = in_bytes * 8 / (uint64_t)elem_bits;
    return ew == QD_EW_F16 ? n * 2 : ew == QD_EW_F32 ? n * 4 : in_bytes;
}

static int add(struct qd_hf_shard *sh, int *cap, struct qd_hf_out t)
{
    if (sh->n == *cap) {
        int nc = *cap ? *cap * 2 : 64;
        struct qd_hf_out *p = realloc(sh->t, (size_t)nc * sizeof *p);
        if (!p)
            return -1;
        sh->t = p, *cap = nc;
    }
    sh->t[sh->n++] = t;
    return t.name ? 0 : -1;
}

/* a, sep and b in a new string (a path, or a tensor name and its suffix) */
char *qd_hf_concat(const char *a, const char *sep, const char *b)
{
    size_t n = strlen(a) + strlen(sep) + strlen(b) + 1;
    char *s = malloc(n);
    if (s)
        snprintf(s, n, "%s%s%s", a, sep, b);
    return s;
}

static char *join(const char *dir, const char *name) { return qd_hf_concat(dir, "/", name); }

/* The bytes of the trailer after a quantized weight's components (0: none, AutoAWQ). */
static uint64_t trailer_bytes(const struct qd_hf_out *t, const struct qd_hf_out *end)
{
    for (const struct qd_hf_out *k = t + 1; k < end && !k[0].quantize; k++)
        if (k->trailer)
            return k->bytes;
    return 0;
}

enum qd_dtype qd_hf_st_to_dtype(const char *st)
{
    return !strcmp(st, "F32") ? QD_F32 : !strcmp(st, "F16") ? QD_F16 : QD_BF16;
}

const char *qd_hf_dtype_to_st(enum qd_dtype d)
{
    switch (d) {
    case QD_U8: return "U8";
    case QD_I32: return "I32";
    case QD_F16: return "F16";
    case QD_BF16: return "BF16";
    default: return "F32";
    }
}

/* <m>.weight -> <m><suffix> (compressed-tensors' names replace the weight) */
char *qd_hf_module_name(const char *weight, const char *suffix)
{
    size_t n = strlen(weight) - strlen("weight");
    char *s = malloc(n + strlen(suffix) + 1);
    if (s)
        snprintf(s, n + strlen(suffix) + 1, "%.*s%s", (int)n, weight, suffix);
    return s;
}

void qd_hf_module_component(const struct qd_convert_opts *o, const struct qd_st_entry *t,
                            const struct qd_component *c, int k, struct qd_hf_out *out)
{
    out->name = qd_hf_module_name(t->name, c->name);
    out->dtype = qd_hf_dtype_to_st(c->dtype);
    out->ndim = 2;
    out->shape[0] = c->shape[0], out->shape[1] = c->shape[1];
}

/* The plan of one shard: its output tensors, from its header alone. */
static int plan_shard(const struct qd_hf_layout_desc *l, const struct qd_convert_opts *o, const cJSON *config,
                      struct qd_hf_shard *sh, const struct qd_arch_rules *rules, const struct qd_name_filter *nf,
                      char *err, size_t errlen)
{
    int cap = 0;
    for (int i = 0; i < sh->st.n; i++) {
        const struct qd_st_entry *t = &sh->st.t[i];
        int generic = 0, back = 0;
        struct qd_hf_out f = {0};
        if (l->plan_tensor && (back = l->plan_tensor(o, config, sh, i, &f, err, errlen)) < 0)
            return -1;
        if (back == 2) { /* a scale: part of its weight */
            sh->dropped++;
            sh->dropped_bytes += t->end - t->begin;
            continue;
        }
        if (back == 1) { /* a quantized weight, back to float */
            f.src = t, f.quantize = 1, f.qbytes = f.bytes;
            if (add(sh, &cap, f))
                goto nomem;
            continue;
        }
        if (l->plan_tensor || !quantized_weight(rules, t, &generic) || !qd_name_filter_keeps(nf, t->name)) {
            struct qd_hf_out c = {.name = strdup(t->name), .dtype = t->dtype, .ndim = t->ndim, .bytes = t->end - t->begin,
                                   .src = t, .generic = !rules};
            const int is_float = float_dtype(t->dtype);
            if (l->cast_f16 && is_float && strcmp(t->dtype, "F16"))
                c.ew = QD_EW_F16, c.dtype = "F16";
            else if (rules && is_float && strcmp(t->dtype, "F32") && qd_arch_find_pattern(rules->to_f32, t->name) >= 0)
                c.ew = QD_EW_F32, c.dtype = "F32";
            else if (rules && !l->plain_norms && is_float && qd_arch_find_pattern(rules->offset_norm, t->name) >= 0)
                c.ew = QD_EW_OFFSET_NORM;
            c.bytes = ew_out_bytes(c.ew, t->end - t->begin, t->elem_bits);
            if (t->ndim > 2) { /* copied tensors keep their shape: only 2 dims fit the plan */
                c.ndim = -1;
            } else
                memcpy(c.shape, t->shape, sizeof c.shape);
            if (add(sh, &cap, c))
                goto nomem;
            continue;
        }
        struct qd_tensor in = {.dtype = qd_hf_st_to_dtype(t->dtype)};
        struct qd_component comps[QD_MAX_COMPONENTS];
        /* W [in, out] where the tool quantizes the Linear's [out, in] weight transposed */
        int64_t shape[2] = {t->shape[l->transpose], t->shape[!l->transpose]};
        qd_tensor_set_shape(&in, 2, shape);
        struct qd_params p = o->params;
        int nc = qd_format_layout(o->f, &p, &in, comps, err, errlen);
        if (nc < 0)
            return -1;
        /* the layout's names for quantd's components, in quantd's order, then its trailer */
        uint64_t qbytes = 0;
        for (int k = 0; k < nc; k++) {
            struct qd_hf_out c = {.bytes = (uint64_t)comps[k].bytes, .src = t, .quantize = k == 0, .generic = generic};
            l->component(o, t, &comps[k], k, &c);
            qbytes += c.bytes;
            if (add(sh, &cap, c))
                goto nomem;
        }
        sh->t[sh->n - nc].qbytes = qbytes;
        struct qd_hf_out tr;
        if (l->trailer && l->trailer(o, t, &p, &tr)) {
            tr.src = t, tr.trailer = 1;
            if (add(sh, &cap, tr))
                goto nomem;
        }
    }
    return 0;
nomem:
    snprintf(err, errlen, "no memory for the plan");
    return -1;
}

/* A tensor transformed element by element (cast to f16 ...) goes through the pipeline in pieces
 * of at most this many source bytes, so the pipeline's (pinned) buffers do not grow to an 8B
 * model's 1 GB embedding. */
#define CAST_PIECE (64u << 20)

/* The pipeline's view of one shard (pipeline.h): item i (> 0) is (a piece of) src[i]. */
struct shard_job {
    const struct qd_hf_layout_desc *l;
    const struct qd_convert_opts *o;
    struct qd_hf_shard *sh;
    const struct qd_hf_out **src; /* per item: the first output tensor of that source tensor */
    const struct qd_pipe_item *items;
    const char *last_piece;        /* per item: the last piece of its tensor */
    void *scratch;                 /* the transposed weight (the largest one fits) */
    struct qd_convert_summary *s;
    int *index, count;
    uint64_t in_total;
    double last, nmse;
};

/* out[c][r] = in[r][c] for a rows x cols matrix of es-byte elements, on all cores, in tiles. */
struct transpose_part {
    const char *in;
    char *out;
    int64_t rows, cols, c0, c1;
    size_t es;
};

static void *transpose_part(void *arg)
{
    const struct transpose_part *t = arg;
    for (int64_t r0 = 0; r0 < t->rows; r0 += 64)
        for (int64_t c0 = t->c0; c0 < t->c1; c0 += 64)
            for (int64_t r = r0; r < t->rows && r < r0 + 64; r++)
                for (int64_t c = c0; c < t->c1 && c < c0 + 64; c++) {
                    if (t->es == 2)
                        memcpy(t->out + (size_t)(c * t->rows + r) * 2, t->in + (size_t)(r * t->cols + c) * 2, 2);
                    else
                        memcpy(t->out + (size_t)(c * t->rows + r) * 4, t->in + (size_t)(r * t->cols + c) * 4, 4);
                }
    return NULL;
}

static void transpose(const void *in, void *out, int64_t rows, int64_t cols, size_t es)
{
    enum { MAX_PARTS = 32 };
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int n = cores < 1 ? 1 : cores > MAX_PARTS ? MAX_PARTS : (int)cores;
    struct transpose_part parts[MAX_PARTS];
    pthread_t th[MAX_PARTS];
    int started[MAX_PARTS] = {0};
    for (int k = 0; k < n; k++) {
        parts[k] = (struct transpose_part){.in = in, .out = out, .rows = rows, .cols = cols, .es = es,
                                           .c0 = cols * k / n, .c1 = cols * (k + 1) / n};
        started[k] = k > 0 && pthread_create(&th[k], NULL, transpose_part, &parts[k]) == 0;
        if (k > 0 && !started[k])
            transpose_part(&parts[k]); /* no thread: this one does it */
    }
    transpose_part(&parts[0]);
    for (int k = 1; k < n; k++)
        if (started[k])
            pthread_join(th[k], NULL);
}

static enum qd_status process_weight(void *ctx, int lane, int item, const void *in, void *out, char *err,
                                     size_t errlen)
{
    struct shard_job *j = ctx;
    const struct qd_hf_out *t = j->src[item];
    const struct qd_st_entry *e = t->src;
    struct qd_params p;
    if (t->quantize && j->l->process) { /* back to float */
        enum qd_status st = j->l->process(t, in, out, err, errlen);
        if (st != QD_OK) {
            char msg[600];
            snprintf(msg, sizeof msg, "tensor '%s': %s", e->name, err);
            snprintf(err, errlen, "%s", msg);
        }
        return st;
    }
    enum qd_dtype dt = qd_hf_st_to_dtype(e->dtype);
    if (t->ew) { /* torch's .half() / .float() / the offset-norm round trip, each step rounded to nearest even;
                    element by element through memcpy: a piece sits at any byte offset of its buffers */
        const uint64_t n = j->items[item].src_bytes * 8 / (uint64_t)e->elem_bits;
        const size_t in_size = (size_t)e->elem_bits / 8, out_size = t->ew == QD_EW_F16 ? 2 : t->ew == QD_EW_F32 ? 4 : in_size;
        for (uint64_t k = 0; k < n; k++) {
            float x, y;
            uint16_t h;
            if (dt == QD_F32)
                memcpy(&x, (const char *)in + k * 4, 4);
            else {
                memcpy(&h, (const char *)in + k * 2, 2);
                x = dt == QD_F16 ? qd_f16_to_f32(h) : qd_bf16_to_f32(h);
            }
            if (t->ew == QD_EW_F16)
                h = qd_f32_to_f16(x);
            else if (t->ew == QD_EW_F32)
                y = x;
            else if (dt == QD_F32)
                y = (1.0f + x) - 1.0f;
            else if (dt == QD_F16)
                h = qd_f32_to_f16(qd_f16_to_f32(qd_f32_to_f16(1.0f + x)) - 1.0f);
            else
                h = qd_f32_to_bf16(qd_bf16_to_f32(qd_f32_to_bf16(1.0f + x)) - 1.0f);
            memcpy((char *)out + k * out_size, out_size == 4 ? (const void *)&y : (const void *)&h, out_size);
        }
        return QD_OK;
    }
    if (j->l->transpose) { /* W [in, out] = weight^T (the layout AutoAWQ's from_linear packs) */
        transpose(in, j->scratch, e->shape[0], e->shape[1], dt == QD_F32 ? 4 : 2);
        in = j->scratch;
    }
    struct qd_convert_opts ot = *j->o; /* nvfp4: the module's (fused) global scale */
    qd_convert_use_lane(&ot, lane);
    if (t->has_gs) {
        ot.params.global_scale = t->gs;
        ot.params.has_global_scale = 1;
    }
    enum qd_status st = qd_convert_quantize(&ot, in, dt, e->shape[j->l->transpose], e->shape[!j->l->transpose], out,
                                            (int64_t)t->qbytes, &j->nmse, &p, err, errlen);
    if (st != QD_OK) {
        char msg[600];
        snprintf(msg, sizeof msg, "tensor '%s': %s", e->name, err);
        snprintf(err, errlen, "%s", msg);
        return st;
    }
    if (!j->l->fill_trailer)
        return QD_OK;
    const struct qd_hf_out *tr = t;
    while (!tr->trailer)
        tr++;
    return j->l->fill_trailer(j->o, e, &p, (char *)out + t->qbytes, tr->bytes, err, errlen);
}

/* A transpose goes through one staging buffer: one lane there. */
static int hf_lanes(const struct qd_hf_layout_desc *l, const struct qd_convert_opts *o)
{
    return l->transpose ? 1 : qd_convert_lanes(o);
}

static void weight_handed(void *ctx, int item)
{
    struct shard_job *j = ctx;
    if (item == 0 || !j->last_piece[item])
        return;
    const struct qd_hf_out *t = j->src[item];
    const struct qd_st_entry *e = t->src;
    struct qd_convert_summary *s = j->s;
    uint64_t bytes = e->end - e->begin;
    s->bytes_in += bytes;
    if (t->quantize) {
        s->quantized++;
        s->params_quantized += (uint64_t)(e->shape[0] * e->shape[1]);
    } else if (t->ew == QD_EW_F16)
        s->cast++;
    else
        s->copied++;
    (*j->index)++;
    double now = qd_pipe_clock_s();
    if (j->o->progress) {
        struct qd_convert_event ev = {.index = *j->index, .count = j->count, .name = e->name,
                                      .action = t->quantize ? QD_CONVERT_QUANTIZE : QD_CONVERT_COPY,
                                      .fmt = j->o->f ? j->o->f->name : j->o->to_float,
                                      .rule = j->l->plan_tensor ? NULL : t->generic ? "generic" : "table",
                                      .ndim = e->ndim, .ms = (now - j->last) * 1e3, .has_nmse = j->o->report_error && t->quantize,
                                      .nmse = j->nmse, .in_done = s->bytes_in, .in_total = j->in_total};
        for (int d = 0; d < e->ndim && d < 4; d++)
            ev.shape[d] = e->shape[d];
        j->o->progress(j->o->progress_ctx, &ev);
    }
    j->last = now;
}

/* Writes one shard front to back through the pipeline. */
static int write_shard(const struct qd_hf_layout_desc *l, const struct qd_convert_opts *o, struct qd_hf_shard *sh, const char *path, const cJSON *metadata,
                       struct qd_pipe_pool *pool, void *scratch, struct qd_convert_summary *s, int *index, int count,
                       uint64_t in_total, enum qd_status *status, char *err, size_t errlen)
{
    size_t nitems = (size_t)sh->st.n + 1;
    for (int i = 0; i < sh->n; i++)
        if (sh->t[i].ew)
            nitems += (sh->t[i].src->end - sh->t[i].src->begin) / CAST_PIECE + 1;
    struct qd_st_out *h = calloc((size_t)(sh->n ? sh->n : 1), sizeof *h);
    struct qd_pipe_item *items = calloc(nitems, sizeof *items);
    const struct qd_hf_out **src = calloc(nitems, sizeof *src);
    char *last = calloc(nitems, 1);
    uint8_t *header = NULL;
    int rc = -1, fd = -1;
    struct qd_outfile out = {.fd = -1};
    if (!h || !items || !src || !last) {
        *status = QD_ENOMEM;
        snprintf(err, errlen, "no memory");
        goto done;
    }
    int ni = 1;
    for (int i = 0; i < sh->n; i++) {
        const struct qd_hf_out *t = &sh->t[i];
        h[i] = (struct qd_st_out){.name = t->name, .dtype = t->dtype, .ndim = t->ndim, .bytes = t->bytes};
        if (t->ndim < 0) { /* copied as listed */
            h[i].ndim = t->src->ndim;
            memcpy(h[i].shape, t->src->shape, sizeof h[i].shape);
        } else
            memcpy(h[i].shape, t->shape, sizeof t->shape);
        if (t->quantize || (!t->trailer && !strcmp(t->name, t->src->name))) {
            uint64_t json = t->quantize ? trailer_bytes(t, sh->t + sh->n) : 0;
            const uint64_t base = (uint64_t)(t->src->data - sh->m.data), bytes = t->src->end - t->src->begin;
            if (t->ew) { /* elementwise: in pieces */
                for (uint64_t off = 0; off < bytes || off == 0; off += CAST_PIECE) {
                    const uint64_t nb = bytes - off < CAST_PIECE ? bytes - off : CAST_PIECE;
                    src[ni] = t;
                    last[ni] = off + nb == bytes;
                    items[ni++] = (struct qd_pipe_item){.kind = QD_PIPE_PROCESS, .src_offset = base + off,
                                                        .src_bytes = nb,
                                                        .out_bytes = ew_out_bytes(t->ew, nb, t->src->elem_bits)};
                    if (nb == 0)
                        break;
                }
                continue;
            }
            src[ni] = t;
            last[ni] = 1;
            items[ni++] = (struct qd_pipe_item){.kind = t->quantize ? QD_PIPE_PROCESS : QD_PIPE_COPY,
                                                .src_offset = base, .src_bytes = bytes,
                                                .out_bytes = t->quantize ? t->qbytes + json : t->bytes};
        }
    }
    size_t hlen;
    if (!(header = qd_st_header(h, sh->n, metadata, &hlen))) {
        *status = QD_ENOMEM;
        snprintf(err, errlen, "no memory");
        goto done;
    }
    items[0] = (struct qd_pipe_item){.kind = QD_PIPE_BYTES, .bytes = header, .out_bytes = hlen};
    if ((fd = qd_open_input(sh->in_path, err, errlen)) < 0 || qd_outfile_open(&out, path, err, errlen)) {
        *status = QD_EIO;
        goto done;
    }
    struct shard_job job = {.l = l, .o = o, .sh = sh, .src = src, .items = items, .last_piece = last, .scratch = scratch, .s = s,
                            .index = index, .count = count, .in_total = in_total,
                            .last = qd_pipe_clock_s()};
    struct qd_pipe pipe = {.src_fd = fd, .out = &out, .items = items, .n = ni, .process = process_weight,
                           .handed = weight_handed, .ctx = &job, .pool = pool, .cancel = o->cancel,
                           .stats = &s->stages, .lanes = hf_lanes(l, o)};
    double t0 = qd_pipe_clock_s();
    if (qd_pipe_run(&pipe, status, err, errlen)) {
        qd_outfile_abort(&out);
        goto done;
    }
    double t1 = qd_pipe_clock_s();
    qd_pipe_trace("shard", -1, t0, t1, out.written);
    s->bytes_out += out.written;
    if (qd_outfile_commit(&out, err, errlen)) {
        *status = qd_status_of_write(errno);
        goto done;
    }
    qd_pipe_trace("commit", -1, t1, qd_pipe_clock_s(), 0);
    rc = 0;
done:
    if (fd >= 0)
        close(fd);
    if (rc && out.fd >= 0)
        qd_outfile_abort(&out);
    free(header);
    free(src);
    free(items);
    free(last);
    free(h);
    return rc;
}

static int write_text(const char *path, const char *text, char *err, size_t errlen)
{
    struct qd_outfile out;
    if (qd_outfile_open(&out, path, err, errlen))
        return -1;
    if (qd_outfile_write(&out, text, strlen(text), err, errlen) || qd_outfile_commit(&out, err, errlen)) {
        qd_outfile_abort(&out);
        return -1;
    }
    return 0;
}

static int is_weights_file(const char *name)
{
    static const char *const ends[] = {".safetensors", ".safetensors.index.json", ".bin", ".pt", ".pth", ".ckpt",
                                       ".h5", ".msgpack", ".bin.index.json", NULL};
    if (!strcmp(name, "config.json"))
        return 1;
    size_t n = strlen(name);
    for (const char *const *e = ends; *e; e++)
        if (n >= strlen(*e) && !strcmp(name + n - strlen(*e), *e))
            return 1;
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The architecture table's rules for config.json's model_type and this layout, or NULL for the
 * generic rule; fills the summary's arch, rule and rule_why. */
static const struct qd_arch_rules *arch_rules(const struct qd_hf_layout_desc *l, const cJSON *config,
                                              struct qd_convert_summary *s)
{
    const enum qd_hf_layout layout = l->arch;
    const char *model_type = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(config, "model_type"));
    const struct qd_arch *a = qd_arch_find(model_type);
    snprintf(s->arch, sizeof s->arch, "%s", model_type ? model_type : "");
    if (l->plan_tensor) /* back to float: the input's scales say which weights were quantized */
        return NULL;
    s->rule = "generic";
    if (!config)
        snprintf(s->rule_why, sizeof s->rule_why, "a single .safetensors file carries no config.json (no "
                 "model_type): the generic rule chose the weights to quantize");
    else if (!a)
        snprintf(s->rule_why, sizeof s->rule_why, "model_type '%.60s' is not in quantd's architecture table "
                 "(docs/convert.md): the generic rule chose the weights to quantize", model_type ? model_type : "");
    else if (a->layout[layout].none)
        snprintf(s->rule_why, sizeof s->rule_why, "no %s rule for %s (%.120s): the generic rule chose the "
                 "weights to quantize", l->tool, a->model_type, a->layout[layout].none);
    else {
        s->rule = "table";
        return &a->layout[layout];
    }
    return NULL;
}

static int cmp_out_name(const void *a, const void *b)
{
    return strcmp((*(const struct qd_hf_out *const *)a)->name, (*(const struct qd_hf_out *const *)b)->name);
}

/* The pipeline's buffers, for the largest weight: in, out, and the transposed weight. */
static void pipeline_caps(const struct qd_hf_shard *sh, int nshards, uint64_t *in_cap, uint64_t *out_cap,
                          uint64_t *scratch_cap)
{
    *in_cap = *out_cap = *scratch_cap = 0;
    for (int k = 0; k < nshards; k++)
        for (int i = 0; i < sh[k].n; i++)
            if (sh[k].t[i].quantize || sh[k].t[i].ew) {
                const struct qd_hf_out *t = &sh[k].t[i];
                uint64_t ib = t->src->end - t->src->begin;
                if (t->ew && ib > CAST_PIECE)
                    ib = CAST_PIECE;
                const uint64_t ob = t->quantize ? t->qbytes + trailer_bytes(t, sh[k].t + sh[k].n)
                                                : ew_out_bytes(t->ew, ib, t->src->elem_bits);
                *in_cap = ib > *in_cap ? ib : *in_cap;
                *out_cap = ob > *out_cap ? ob : *out_cap;
                if (t->quantize)
                    *scratch_cap = ib > *scratch_cap ? ib : *scratch_cap;
            }
}

/* Weights the architecture table's entry does not list: the generic rule decided them, and the
 * summary says how many. */
static void note_unlisted(const struct qd_hf_shard *sh, int nshards, struct qd_convert_summary *s)
{
    int unlisted = 0;
    for (int k = 0; k < nshards; k++)
        for (int i = 0; i < sh[k].n; i++)
            unlisted += sh[k].t[i].quantize && sh[k].t[i].generic;
    if (unlisted)
        snprintf(s->rule_why, sizeof s->rule_why, "%d weight%s that the %s entry of the architecture table "
                 "does not list went by the generic rule", unlisted, unlisted == 1 ? "" : "s", s->arch);
}

/* model.safetensors.index.json in dir, its weight_map (wm, consumed) sorted by name as transformers
 * writes it: 0, or -1 with err. */
static int write_index(const char *dir, const struct qd_hf_shard *sh, int nshards, cJSON *wm, char *err, size_t errlen)
{
    uint64_t total = 0;
    int n = 0;
    for (int k = 0; k < nshards; k++)
        n += sh[k].n;
    const struct qd_hf_out **all = malloc((size_t)(n ? n : 1) * sizeof *all);
    n = 0;
    for (int k = 0; all && k < nshards; k++)
        for (int i = 0; i < sh[k].n; i++) {
            all[n++] = &sh[k].t[i];
            total += sh[k].t[i].bytes;
        }
    qsort(all, (size_t)n, sizeof *all, cmp_out_name);
    for (int i = 0; all && i < n; i++)
        for (int k = 0; k < nshards; k++)
            if (all[i] >= sh[k].t && all[i] < sh[k].t + sh[k].n)
                cJSON_AddStringToObject(wm, all[i]->name, sh[k].out_name);
    free(all);
    cJSON *ix = cJSON_CreateObject(), *md = cJSON_AddObjectToObject(ix, "metadata");
    cJSON_AddNumberToObject(md, "total_size", (double)total);
    cJSON_AddItemToObject(ix, "weight_map", wm);
    char *text = qd_json_py_text(ix), *p = join(dir, "model.safetensors.index.json");
    int r = text && p ? write_text(p, text, err, errlen) : -1;
    free(text), free(p);
    cJSON_Delete(ix);
    return r;
}

/* config.json in dir: the source's members as they were spelled, quantization_config (qc) and
 * the layout's own keys set. 0, or -1 with err. */
static int write_config(const struct qd_hf_layout_desc *l, const char *dir, const cJSON *config, const char *config_text,
                        size_t config_n, const cJSON *qc, char *err, size_t errlen)
{
    struct qd_config_set sets[2 + QD_HF_MAX_CONFIG_KEYS] = {{"quantization_config", l->plan_tensor ? NULL : qc}};
    cJSON *values[QD_HF_MAX_CONFIG_KEYS] = {0};
    const char *extra_key = NULL;
    cJSON *extra = l->config_extra ? l->config_extra(config, &extra_key) : NULL;
    int nsets = 1, parsed = 1;
    if (extra)
        sets[nsets++] = (struct qd_config_set){extra_key, extra};
    for (int k = 0; k < l->nconfig_keys; k++)
        if (!l->config_keys[k].if_present || cJSON_GetObjectItemCaseSensitive(config, l->config_keys[k].key)) {
            parsed &= (values[k] = cJSON_Parse(l->config_keys[k].json)) != NULL;
            sets[nsets++] = (struct qd_config_set){l->config_keys[k].key, values[k]};
        }
    char *ctext = parsed ? qd_hf_config_rewrite(config_text, config_n, sets, nsets, l->config_newline, err, errlen) : NULL;
    char *cpath = join(dir, "config.json");
    for (int k = 0; k < l->nconfig_keys; k++)
        cJSON_Delete(values[k]);
    cJSON_Delete(extra);
    if (!parsed)
        snprintf(err, errlen, "no memory for config.json");
    int r = ctext && cpath ? write_text(cpath, ctext, err, errlen) : -1;
    free(ctext), free(cpath);
    return r;
}

/* The other files of the model's directory (tokenizer, generation config, ...) into dir. */
static int copy_others(const char *src, const char *dir, char *err, size_t errlen)
{
    DIR *d = opendir(src);
    struct dirent *e;
    int r = 0;
    while (d && !r && (e = readdir(d))) {
        char *from = join(src, e->d_name), *to = join(dir, e->d_name);
        struct stat fs;
        int copy = from && to && e->d_name[0] != '.' && !is_weights_file(e->d_name) && stat(from, &fs) == 0 &&
                   S_ISREG(fs.st_mode);
        r = copy ? qd_copy_file(from, to, err, errlen) : 0;
        free(from), free(to);
    }
    if (d)
        closedir(d);
    return r;
}

int qd_convert_hf(const struct qd_hf_layout_desc *l, const struct qd_convert_opts *request, struct qd_convert_summary *s,
                  enum qd_status *status, char *err, size_t errlen)
{
    double t0 = qd_pipe_clock_s();
    struct qd_convert_opts run = *request;
    if (l->prepare)
        l->prepare(&run);
    const struct qd_convert_opts *o = &run;
    struct stat st;
    if (stat(o->src, &st) < 0) {
        snprintf(err, errlen, "%s: %s", o->src, strerror(errno));
        *status = QD_ENOTFOUND;
        return -1;
    }
    int dir_in = S_ISDIR(st.st_mode), rc = -1, nshards = 0;
    struct qd_hf_shard *sh = NULL;
    struct qd_name_filter *own_nf = o->filter ? NULL : qd_name_filter_new(o->skip, o->only, err, errlen);
    const struct qd_name_filter *nf = o->filter ? o->filter : own_nf;
    cJSON *config = NULL, *index = NULL, *qc = NULL;
    char *tmpdir = NULL, **names = NULL, *config_text = NULL;
    size_t config_n = 0;
    struct qd_outdir od = {0};
    struct qd_pipe_pool *pool = NULL;
    void *scratch = NULL; /* awq: the transposed weight */
    if (!nf)
        goto done;
    /* the shards: from the index, or the one file */
    if (dir_in) {
        char *ip = join(o->src, "model.safetensors.index.json"), *cp = join(o->src, "config.json");
        struct qd_mapped m;
        char e2[256];
        if (!qd_map_file(cp, &m, e2, sizeof e2)) {
            config = cJSON_ParseWithLength((const char *)m.data, m.size);
            if ((config_text = malloc(m.size + 1)))
                memcpy(config_text, m.data, m.size), config_n = m.size;
            qd_unmap_file(&m);
        }
        if (!config || !cJSON_IsObject(config)) {
            snprintf(err, errlen, "%s: a readable JSON config.json is needed beside the weights", cp);
            free(ip), free(cp);
            goto done;
        }
        if (!qd_map_file(ip, &m, e2, sizeof e2)) {
            index = cJSON_ParseWithLength((const char *)m.data, m.size);
            qd_unmap_file(&m);
            const cJSON *wm = cJSON_GetObjectItemCaseSensitive(index, "weight_map"), *it;
            int cap = cJSON_GetArraySize(wm);
            names = calloc((size_t)(cap ? cap : 1), sizeof *names);
            if (!cJSON_IsObject(wm) || !names) {
                snprintf(err, errlen, "%s: no weight_map object", ip);
                free(ip), free(cp);
                goto done;
            }
            cJSON_ArrayForEach(it, wm) {
                const char *f = cJSON_GetStringValue(it);
                if (!f || strchr(f, '/') || f[0] == '.') {
                    snprintf(err, errlen, "%s: weight_map['%.100s'] is not a file name beside it", ip, it->string);
                    free(ip), free(cp);
                    goto done;
                }
                int seen = 0;
                for (int k = 0; k < nshards; k++)
                    seen |= !strcmp(names[k], f);
                if (!seen)
                    names[nshards++] = (char *)f;
            }
            qsort(names, (size_t)nshards, sizeof *names, cmp_str);
        } else {
            names = calloc(1, sizeof *names);
            if (names)
                names[nshards++] = "model.safetensors";
        }
        free(ip), free(cp);
    } else {
        names = calloc(1, sizeof *names);
        if (names)
            names[nshards++] = (char *)o->src;
    }
    const struct qd_arch_rules *rules = arch_rules(l, config, s);
    sh = calloc((size_t)(nshards ? nshards : 1), sizeof *sh);
    if (!names || !sh) {
        snprintf(err, errlen, "no memory");
        *status = QD_ENOMEM;
        goto done;
    }
    uint64_t in_total = 0;
    int count = 0;
    const char *compute_dtype = NULL;
    for (int k = 0; k < nshards; k++) {
        sh[k].in_path = dir_in ? join(o->src, names[k]) : strdup(names[k]);
        sh[k].out_name = strdup(dir_in ? names[k] : "");
        if (!sh[k].in_path || !sh[k].out_name) {
            snprintf(err, errlen, "no memory");
            goto done;
        }
        if (qd_map_file(sh[k].in_path, &sh[k].m, err, errlen)) {
            *status = QD_ENOTFOUND;
            goto done;
        }
        if (qd_st_parse(sh[k].m.data, sh[k].m.size, o->max_header_bytes, sh[k].in_path, &sh[k].st, err, errlen) ||
            plan_shard(l, o, config, &sh[k], rules, nf, err, errlen))
            goto done;
        for (int i = 0; i < sh[k].st.n; i++) {
            in_total += sh[k].st.t[i].end - sh[k].st.t[i].begin;
            count++;
            s->params_total += (sh[k].st.t[i].end - sh[k].st.t[i].begin) * 8 / (uint64_t)sh[k].st.t[i].elem_bits;
        }
        count -= sh[k].dropped; /* (the progress counts what each tensor written reads) */
        in_total -= sh[k].dropped_bytes;
        for (int i = 0; !compute_dtype && i < sh[k].n; i++)
            if (sh[k].t[i].quantize)
                compute_dtype = qd_hf_torch_dtype(sh[k].t[i].src->dtype);
    }
    if (l->prepass && l->prepass(sh, nshards) < 0) {
        snprintf(err, errlen, "no memory for an aligned copy of a weight (the fused global scales)");
        *status = QD_ENOMEM;
        goto done;
    }
    uint64_t in_cap, out_cap, scratch_cap;
    pipeline_caps(sh, nshards, &in_cap, &out_cap, &scratch_cap);
    if (rules)
        note_unlisted(sh, nshards, s);
    qc = l->quantization_config(o, rules, sh, nshards, compute_dtype ? compute_dtype : "float32");
    s->layout_config = qc && !l->plan_tensor ? cJSON_PrintUnformatted(qc) : NULL;
    pool = qd_pipe_pool_new(o->backend, in_cap, out_cap, hf_lanes(l, o));
    if (l->transpose && scratch_cap) /* pinned where the backend has it: the GPU reads it directly */
        scratch = o->backend && o->backend->host_alloc ? o->backend->host_alloc(scratch_cap) : malloc(scratch_cap);
    if (!qc || !pool || (l->transpose && scratch_cap && !scratch)) {
        snprintf(err, errlen, "no memory for the pipeline's buffers (%" PRIu64 " + %" PRIu64 " bytes each)", in_cap,
                 out_cap);
        *status = QD_ENOMEM;
        goto done;
    }
    int done_tensors = 0;
    if (!dir_in) {
        cJSON *meta = cJSON_CreateObject();
        char *qtext = cJSON_PrintUnformatted(qc);
        cJSON_AddStringToObject(meta, "format", "pt");
        cJSON_AddStringToObject(meta, "quantization_config", qtext ? qtext : "{}");
        free(qtext);
        rc = write_shard(l, o, &sh[0], o->dst, meta, pool, scratch, s, &done_tensors, count, in_total, status, err, errlen);
        cJSON_Delete(meta);
        goto done;
    }
    /* a directory: everything into a temporary one, moved into place when complete */
    if (qd_outdir_open(&od, o->dst, err, errlen)) {
        *status = QD_EIO;
        goto done;
    }
    tmpdir = od.tmp;
    cJSON *meta = cJSON_CreateObject();
    cJSON_AddStringToObject(meta, "format", "pt");
    cJSON *wm = index ? cJSON_CreateObject() : NULL;
    for (int k = 0; k < nshards; k++) {
        char *path = join(tmpdir, sh[k].out_name);
        int r = path ? write_shard(l, o, &sh[k], path, meta, pool, scratch, s, &done_tensors, count, in_total, status, err,
                                  errlen)
                      : -1;
        free(path);
        if (r) {
            cJSON_Delete(meta), cJSON_Delete(wm);
            goto fail_dir;
        }
    }
    cJSON_Delete(meta);
    if (wm && write_index(tmpdir, sh, nshards, wm, err, errlen))
        goto fail_dir;
    if (write_config(l, tmpdir, config, config_text, config_n, qc, err, errlen))
        goto fail_dir;
    if (copy_others(o->src, tmpdir, err, errlen))
        goto fail_dir;
    if (qd_outdir_commit(&od, err, errlen)) {
        *status = QD_EIO;
        goto done;
    }
    rc = 0;
    goto done;
fail_dir:
    if (*status == QD_EINVAL)
        *status = QD_EIO;
    qd_outdir_abort(&od);
done:
    if (rc == 0)
        *status = QD_OK;
    s->seconds = qd_pipe_clock_s() - t0;
    qd_pipe_pool_free(pool);
    if (scratch)
        o->backend && o->backend->host_alloc && o->backend->host_free ? o->backend->host_free(scratch) : free(scratch);
    for (int k = 0; sh && k < nshards; k++) {
        for (int i = 0; i < sh[k].n; i++)
            free(sh[k].t[i].name);
        free(sh[k].t);
        qd_st_free(&sh[k].st);
        qd_unmap_file(&sh[k].m);
        free(sh[k].in_path);
        free(sh[k].out_name);
    }
    free(sh);
    free(names);
    cJSON_Delete(qc);
    cJSON_Delete(config);
    free(config_text);
    cJSON_Delete(index);
    qd_name_filter_free(own_nf);
    return rc;
}
