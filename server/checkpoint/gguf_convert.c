/* GGUF in -> GGUF out for the GGML block formats: the file `llama-quantize --pure <TYPE>` writes
 * (llama.cpp src/llama-quant.cpp, as vendored in llama-cpp-python 0.3.36), byte for byte:
 * - tensors in the loader's order (blk.N.* by layer N, the others first, then by name);
 * - which tensors are quantized: tensor_allows_quantization (2-D+, name ends in "weight", not
 *   a norm, and the exclusions below), narrowed by --skip/--only; output.weight is quantized
 *   (quantize_output_tensor defaults to true);
 * - a row length the type's block does not divide falls back as tensor_type_fallback says: the
 *   K-quants (256-blocks) to a 32-block type, then to F16 where 32 does not divide it either;
 * - every input key/value in order, general.quantization_version (2) and general.file_type
 *   re-set (removed and appended, as gguf_set_val does), split.* removed;
 * - data aligned to 32 (GGUF_DEFAULT_ALIGNMENT), each tensor zero-padded to it;
 * - a split input (its first shard) read as one model (gguf_shards.c); the output one file, cut
 *   as gguf-split cuts it (--split-max-*), or one per input shard (--keep-split). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../kernels/fp.h"
#include "checkpoint/convert.h"
#include "checkpoint/gguf.h"
#include "checkpoint/gguf_options.h"
#include "checkpoint/gguf_plan.h"
#include "checkpoint/imatrix.h"
#include "checkpoint/gguf_recipe.h"
#include "checkpoint/gguf_shards.h"
#include "checkpoint/pipeline.h"

static enum qd_dtype float_dtype(uint32_t type)
{
    return type == QD_GGML_F32 ? QD_F32 : type == QD_GGML_F16 ? QD_F16 : QD_BF16;
}

/* ggml_validate_row_data: llama-quantize refuses a quantized row whose block scale (and min)
 * is not finite; F16 output is checked value by value. */
static int first_nonfinite_f16(const uint8_t *p, uint64_t n_blocks, int block_bytes, int at, int fields)
{
    for (uint64_t b = 0; b < n_blocks; b++)
        for (int k = 0; k < fields; k++) {
            uint16_t h;
            memcpy(&h, p + b * (uint64_t)block_bytes + at + 2 * k, 2);
            if ((h & 0x7c00) == 0x7c00)
                return 1;
        }
    return 0;
}

/* Where a block type keeps its f16 scale (d, and dmin: fields 2), as ggml's structs lay them out
 * (ternary: d after the codes; MXFP4: an E8M0 exponent instead, and IQ1_M's d spread over its
 * scales: fields 0, checked apart). */
static void f16_fields(uint32_t type, int *at, int *fields)
{
    *at = type == QD_GGML_Q2_K ? 80 : type == QD_GGML_Q3_K ? 108 : type == QD_GGML_Q6_K ? 208
        : type == 34 /* tq1_0 */ ? 52 : type == 35 /* tq2_0 */ ? 64 : 0;
    *fields = type == 39 /* mxfp4 */ || type == 29 /* iq1_m */ ? 0 : type == QD_GGML_Q4_1 || type == QD_GGML_Q5_1 || type == QD_GGML_Q2_K ||
              type == QD_GGML_Q4_K || type == QD_GGML_Q5_K ? 2 : 1;
}

/* MXFP4's validation: no block exponent 0xff (E8M0's NaN); IQ1_M's: its d (the top 4 bits of
 * each of the 4 scale words at byte 48) finite. */
static int invalid_e8m0(uint32_t type, const uint8_t *p, uint64_t n_blocks, int block_bytes)
{
    for (uint64_t b = 0; type == 39 && b < n_blocks; b++)
        if (p[b * (uint64_t)block_bytes] == 0xff)
            return 1;
    for (uint64_t b = 0; type == 29 && b < n_blocks; b++) {
        const uint8_t *sc = p + b * (uint64_t)block_bytes + 48;
        const unsigned d = (unsigned)(sc[1] >> 4 | (sc[3] & 0xf0) | (sc[5] >> 4) << 8 | (sc[7] & 0xf0) << 8);
        if ((d & 0x7c00) == 0x7c00)
            return 1;
    }
    return 0;
}


static int same_file(const char *a, const char *b)
{
    struct stat x, y;
    return stat(a, &x) == 0 && stat(b, &y) == 0 && x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

/* The pipeline's view of a conversion (pipeline.h): item i + 1 is plan[i]. */
/* A pipeline item after the header: whole rows of one tensor. A large processed tensor is cut
 * into pieces of at most piece_bytes of input (its rows are independent in every GGML type), so
 * the pipeline's buffers (pinned on a GPU, several of them) are sized by the pieces, not by the
 * largest tensor (an 8B model's 1 GB embedding and head: 8 GB of pinned buffers took seconds
 * to allocate). The CUDA driver pins one buffer after another, about 65 ms per 128 MiB, at the
 * start and again to free them at the end: 32 MiB pieces made the 8B IQ2_XXS conversion on an
 * H200 0.4 s shorter than 128 MiB ones (16 MiB: no better; the CPU backend: no change; see
 * docs/BENCHMARKS.md). */
#define PIECE_BYTES (32u << 20)
#define PIECE_MB_MAX 1024

/* The piece size: the caller's, else QUANTD_CONVERT_PIECE_MB (1..1024, for measuring), else
 * PIECE_BYTES. */
static uint64_t piece_cap(const struct qd_convert_opts *o)
{
    if (o->piece_bytes)
        return o->piece_bytes;
    const char *v = getenv("QUANTD_CONVERT_PIECE_MB");
    const int mb = v ? atoi(v) : 0;
    return mb >= 1 && mb <= PIECE_MB_MAX ? (uint64_t)mb << 20 : PIECE_BYTES;
}
struct piece {
    int plan;           /* the tensor */
    int64_t row0, rows; /* its rows in this piece */
    int last;           /* the tensor's last piece: progress and counts happen here */
};

struct job {
    const struct qd_convert_opts *o;
    const struct qd_gguf_plan *plan;
    const struct piece *pieces; /* per item; [0] is the header's */
    struct qd_convert_summary *s;
    double t0, last, nmse;
    uint64_t in_total;
    int count;
};

static int64_t tensor_rows(const struct qd_gguf_plan *p)
{
    const struct qd_ggml_type *t = qd_ggml_type(p->src->type);
    if (p->src->ne[0] <= 0)
        return 0;
    return (int64_t)(p->src->bytes / (uint64_t)t->block_bytes * (uint64_t)t->block_elems) / p->src->ne[0];
}

/* Rows per piece: all of a copied tensor (or of any, with --report-error: its error is one
 * figure per tensor), else as many whole rows as the piece size holds (at least one). */
static int64_t rows_per_piece(const struct qd_gguf_plan *p, const struct qd_convert_opts *o)
{
    const int64_t rows = tensor_rows(p);
    if (p->action == QD_CONVERT_COPY || o->report_error || rows <= 1)
        return rows > 1 ? rows : 1;
    /* a requantized piece is held in f32 too: its size counts */
    const uint64_t row_in = p->requant ? (uint64_t)p->src->ne[0] * 4 : p->src->bytes / (uint64_t)rows;
    const uint64_t cap = piece_cap(o);
    int64_t per = cap / row_in > 0 ? (int64_t)(cap / row_in) : 1;
    if (p->importance && p->src->ne[2] > 1) { /* a piece within one expert: one importance vector */
        const int64_t matrix_rows = p->src->ne[1];
        if (per >= matrix_rows)
            return matrix_rows;
        while (matrix_rows % per)
            per--;
    }
    return per;
}

static enum qd_status requantized(struct job *j, const struct qd_gguf_plan *p, const struct piece *pc, int lane,
                                  const void *in, enum qd_dtype in_dtype, int64_t rows, void *out,
                                  uint64_t out_bytes, char *err, size_t errlen);

static enum qd_status process_tensor(void *ctx, int lane, int item, const void *in, void *out, char *err,
                                     size_t errlen)
{
    struct job *j = ctx;
    const struct piece *pc = &j->pieces[item];
    const struct qd_gguf_plan *p = &j->plan[pc->plan];
    const int64_t rows = pc->rows;
    const int64_t all = tensor_rows(p);
    const uint64_t out_bytes = all ? p->out.bytes / (uint64_t)all * (uint64_t)rows : 0;
    float *widened = NULL;
    enum qd_dtype in_dtype = p->requant ? QD_F32 : float_dtype(p->src->type);
    if (p->requant) { /* llama_tensor_dequantize_impl: the quantized rows to f32 first */
        struct qd_tensor t = {.dtype = QD_F32};
        int64_t shape[2] = {rows, p->src->ne[0]};
        struct qd_params dp;
        qd_params_default(p->requant, &dp);
        const void *comp[1] = {in};
        if (!(widened = malloc((size_t)(rows * p->src->ne[0]) * sizeof *widened)))
            return QD_ENOMEM;
        t.data = widened;
        enum qd_status st = qd_tensor_set_shape(&t, 2, shape);
        if (st == QD_OK)
            st = qd_dequantize(QD_BACKEND_CPU, p->requant, comp, &dp, &t, err, errlen);
        if (st != QD_OK) {
            free(widened);
            return st;
        }
        in = widened;
    }
    enum qd_status done = requantized(j, p, pc, lane, in, in_dtype, rows, out, out_bytes, err, errlen);
    free(widened);
    return done;
}

/* process_tensor's work on f32/f16/bf16 rows: the quantizer, or the cast to a float type, and llama's
 * validation of what they wrote. */
static enum qd_status requantized(struct job *j, const struct qd_gguf_plan *p, const struct piece *pc, int lane,
                                  const void *in, enum qd_dtype in_dtype, int64_t rows, void *out,
                                  uint64_t out_bytes, char *err, size_t errlen)
{
    const struct qd_ggml_type *ty = qd_ggml_type(p->out.type);
    if (p->action == QD_CONVERT_QUANTIZE) {
        struct qd_convert_opts o = *j->o;
        qd_convert_use_lane(&o, lane);
        if (p->f != o.f) { /* a fallback type: its own default parameters */
            o.f = p->f;
            qd_params_default(p->f, &o.params);
        }
        if (p->importance) { /* the vector of the piece's matrix (pieces never cross one) */
            o.params.importance = p->importance + pc->row0 / p->src->ne[1] * p->src->ne[0];
            o.params.importance_n = p->src->ne[0];
        }
        enum qd_status st = qd_convert_quantize(&o, in, in_dtype, rows, p->src->ne[0], out,
                                                (int64_t)out_bytes, &j->nmse, NULL, err, errlen);
        if (st != QD_OK) {
            char msg[512];
            snprintf(msg, sizeof msg, "tensor '%s': %s", p->src->name, err);
            snprintf(err, errlen, "%s", msg);
            return st;
        }
        int at, fields;
        f16_fields(p->out.type, &at, &fields);
        if (first_nonfinite_f16(out, out_bytes / (uint64_t)ty->block_bytes, ty->block_bytes, at, fields) ||
            invalid_e8m0(p->out.type, out, out_bytes / (uint64_t)ty->block_bytes, ty->block_bytes)) {
            snprintf(err, errlen, "tensor '%s': a block scale overflows f16 (llama-quantize stops there too: "
                     "\"quantized data validation failed\")", p->src->name);
            return QD_ENONFINITE;
        }
        return QD_OK;
    }
    /* QD_CONVERT_CAST: widened to f32 (exact), then ggml_quantize_chunk's conversion to the
     * float type; ggml_validate_row_data refuses a value that is not finite in it */
    const uint64_t count = out_bytes / (uint64_t)ty->block_bytes;
    int nonfinite = 0;
    for (uint64_t k = 0; k < count; k++) {
        const float v = in_dtype == QD_F32   ? ((const float *)in)[k]
                        : in_dtype == QD_F16 ? qd_f16_to_f32(((const uint16_t *)in)[k])
                                             : qd_bf16_to_f32(((const uint16_t *)in)[k]);
        if (p->out.type == QD_GGML_F32) {
            ((float *)out)[k] = v;
            nonfinite |= !isfinite(v);
        } else if (p->out.type == QD_GGML_BF16) {
            const uint16_t b = qd_f32_to_bf16(v);
            ((uint16_t *)out)[k] = b;
            nonfinite |= (b & 0x7f80) == 0x7f80;
        } else {
            const uint16_t h = qd_f32_to_f16(v);
            ((uint16_t *)out)[k] = h;
            nonfinite |= (h & 0x7c00) == 0x7c00;
        }
    }
    if (nonfinite) {
        snprintf(err, errlen, "tensor '%s': a value is not finite in %s (llama-quantize stops there too)",
                 p->src->name, ty->name);
        return QD_ENONFINITE;
    }
    return QD_OK;
}

static void tensor_handed(void *ctx, int item)
{
    struct job *j = ctx;
    if (item == 0 || !j->pieces[item].last)
        return;
    const struct qd_gguf_plan *p = &j->plan[j->pieces[item].plan];
    struct qd_convert_summary *s = j->s;
    s->bytes_in += p->src->bytes;
    if (p->action == QD_CONVERT_QUANTIZE) {
        s->quantized++;
        s->params_quantized += p->src->bytes / (uint64_t)qd_ggml_type(p->src->type)->block_bytes *
                               (uint64_t)qd_ggml_type(p->src->type)->block_elems;
    } else
        p->action == QD_CONVERT_CAST ? s->cast++ : s->copied++;
    double now = qd_pipe_clock_s();
    if (j->o->progress) {
        struct qd_convert_event ev = {.index = j->pieces[item].plan + 1, .count = j->count, .name = p->out.name, .action = p->action,
                                      .fmt = p->action == QD_CONVERT_CAST ? qd_ggml_type(p->out.type)->name
                                              : p->f ? p->f->name : j->o->f ? j->o->f->name : "", .ms = (now - (j->last ? j->last : j->t0)) * 1e3,
                                      .has_nmse = j->o->report_error && p->action == QD_CONVERT_QUANTIZE,
                                      .nmse = j->nmse, .in_done = s->bytes_in, .in_total = j->in_total,
                                      .no_importance = p->action == QD_CONVERT_QUANTIZE && !p->importance &&
                                                       j->o->gguf && j->o->gguf->imatrix_path};
        uint32_t nd = qd_gguf_n_dims(p->src->ne);
        ev.ndim = (int)nd;
        for (uint32_t d = 0; d < nd; d++) /* outermost first, as torch and safetensors list them */
            ev.shape[d] = p->src->ne[nd - 1 - d];
        j->o->progress(j->o->progress_ctx, &ev);
    }
    j->last = now;
}

/* COPY's file type: llama_model_loader's, general.file_type when the input has it, else its
 * guess from the type most tensors have (the first to reach the largest count, in the loader's
 * order), marked LLAMA_FTYPE_GUESSED (1024). */
static uint32_t input_file_type(const struct qd_gguf *g)
{
    const struct qd_gguf_kv *kv = qd_gguf_find(g, "general.file_type");
    if (kv && kv->type == QD_GGUF_U32) {
        uint32_t v;
        memcpy(&v, kv->value, 4);
        return v;
    }
    const int n = (int)g->n_tensors;
    const struct qd_gguf_tensor **order = calloc((size_t)(n ? n : 1), sizeof *order);
    uint32_t count[QD_GGML_TYPE_COUNT] = {0}, most = 0, type_max = QD_GGML_F32;
    for (int i = 0; order && i < n; i++)
        order[i] = &g->tensors[i];
    if (order)
        qsort(order, (size_t)n, sizeof *order, qd_gguf_loader_order);
    for (int i = 0; order && i < n; i++) {
        const uint32_t t = order[i]->type;
        if (t < QD_GGML_TYPE_COUNT && most < ++count[t])
            most = count[t], type_max = t;
    }
    free(order);
    return (uint32_t)qd_ggml_type(type_max)->ftype | 1024u;
}

/* One conversion's state, shared by its steps; convert_free releases all of it. */
struct convert {
    const struct qd_convert_opts *o;
    const struct qd_gguf_options *opt;
    struct qd_convert_summary *s;
    enum qd_status *status;
    char *err;
    size_t errlen;
    struct qd_gguf_model model; /* the input: one file or a split model's shards */
    char *arch;
    struct qd_gguf_plan *plan;
    const struct qd_gguf_tensor **order;
    int n, n_blocks; /* the tensors kept (after --prune-layers), the block count left */
    struct qd_name_filter *own_nf;
    const struct qd_name_filter *nf;
    struct qd_recipe_state rs;
    struct qd_imatrix im;
    const struct qd_gguf_kv **kv; /* the input's keys kept, in order */
    int nkv;
    struct qd_gguf_new_kv extra[2 + QD_GGUF_MAX_KV_OVERRIDES + 5]; /* the keys set, in order */
    int n_extra;
    char imatrix_file[128], imatrix_dataset[128]; /* llama-quantize's 127-byte values */
    char block_count_key[160];
    int n_split, *split_of;
    int split_names; /* the files are named DST-0000K-of-0000N.gguf (a split, or --keep-split) */
    uint8_t **metas; /* per file: its header */
    size_t *meta_lens;
    struct qd_outfile *outs;
    struct qd_pipe_item *items; /* per file: its header, then its tensors' pieces */
    struct piece *pieces;
    int *first; /* each file's first item; [n_split]: the end */
    struct qd_pipe_pool *pool;
    int *src_fds; /* per input file */
};

static int no_memory(struct convert *c)
{
    snprintf(c->err, c->errlen, "no memory");
    *c->status = QD_ENOMEM;
    return -1;
}

/* The plan: every output tensor and its type, from the headers alone; the mix's rules, the
 * importance matrix (--imatrix, narrowed by --include-weights / --exclude-weights; none left is
 * none at all, as llama-quantize's prepare_imatrix has it) and the user's selection. */
static int plan_tensors(struct convert *c, const struct qd_gguf_recipe *recipe)
{
    const uint32_t default_type = recipe && !recipe->fmt ? recipe->type : (uint32_t)c->o->f->gguf_type;
    const int copy_all = recipe && recipe->copy; /* tensor_allows_quantization says no to every tensor */
    const struct qd_gguf_options *opt = c->opt;
    const int all = (int)c->model.g.n_tensors;
    c->plan = calloc((size_t)(all ? all : 1), sizeof *c->plan);
    c->order = calloc((size_t)(all ? all : 1), sizeof *c->order);
    c->kv = calloc((size_t)(c->model.g.n_kv ? c->model.g.n_kv : 1), sizeof *c->kv);
    c->own_nf = c->o->filter ? NULL : qd_name_filter_new(c->o->skip, c->o->only, c->err, c->errlen);
    c->nf = c->o->filter ? c->o->filter : c->own_nf;
    if (!c->plan || !c->order || !c->kv || !c->nf) {
        if (c->nf)
            snprintf(c->err, c->errlen, "no memory for %d tensors", all);
        *c->status = c->nf ? QD_ENOMEM : QD_EINVAL;
        return -1;
    }
    for (int i = 0; i < all; i++)
        c->order[i] = &c->model.g.tensors[i];
    qsort(c->order, (size_t)all, sizeof *c->order, qd_gguf_loader_order);
    if (qd_gguf_plan_prune(c->order, all, opt, c->plan, &c->n, &c->n_blocks, c->err, c->errlen)) {
        *c->status = QD_ENOMEM;
        return -1;
    }
    if (opt && opt->keep_split) /* each shard's tensors together, in its file's order; the mix counts them so */
        qsort(c->plan, (size_t)c->n, sizeof *c->plan, qd_gguf_shard_order);
    const char **names = calloc((size_t)(c->n ? c->n : 1), sizeof *names);
    if (!names) {
        snprintf(c->err, c->errlen, "no memory for %d tensors", all);
        *c->status = QD_ENOMEM;
        return -1;
    }
    for (int i = 0; i < c->n; i++)
        names[i] = c->plan[i].out.name;
    qd_recipe_init(&c->rs, recipe, default_type, opt, &c->model.g, names, c->n);
    free(names);
    if (opt && opt->imatrix_path) {
        if (qd_gguf_imatrix_load(opt->imatrix_path, &c->im, c->err, c->errlen)) {
            *c->status = QD_EINVAL;
            return -1;
        }
        qd_imatrix_filter(&c->im, (const char *const *)opt->include_weights, opt->n_include,
                          (const char *const *)opt->exclude_weights, opt->n_exclude);
        c->rs.has_imatrix = c->im.n > 0;
    }
    const int dry = opt && opt->dry_run;
    for (int i = 0; i < c->n; i++) {
        struct qd_gguf_plan *p = &c->plan[i];
        const struct qd_ggml_type *src = qd_ggml_type(p->src->type);
        p->action = QD_CONVERT_COPY;
        c->s->params_total += p->src->bytes / (uint64_t)src->block_bytes * (uint64_t)src->block_elems;
        if (copy_all || !qd_gguf_allows_quantization(&p->out, c->rs.arch, opt))
            continue;
        /* the mix's counters advance over every tensor it types, kept or not by --skip/--only */
        const uint32_t target = qd_recipe_type(&c->rs, p->src, p->out.name);
        const int requires = qd_recipe_requires_imatrix(&c->rs, p->out.name, target);
        if (requires && !c->rs.has_imatrix && !dry) {
            snprintf(c->err, c->errlen, "this quantization requires an importance matrix (--imatrix FILE, made by "
                     "llama-imatrix): tensor '%s' would be %s", p->out.name, qd_ggml_type(target)->name);
            return -1;
        }
        if (!qd_name_filter_keeps(c->nf, p->out.name))
            continue;
        if (qd_gguf_plan_target(p, target, opt, c->err, c->errlen))
            return -1;
        if (p->action != QD_CONVERT_COPY &&
            qd_gguf_plan_importance(p, c->rs.has_imatrix ? &c->im : NULL, requires && !dry, c->err, c->errlen))
            return -1;
    }
    if (opt && opt->imatrix_path && qd_gguf_plan_coverage(c->plan, c->n, &c->im, opt, c->s, c->err, c->errlen)) {
        *c->status = QD_EINVAL;
        return -1;
    }
    return 0;
}

/* The keys: gguf_set_val_* removes a key and appends it, so the keys set (quantization version,
 * file type, the overrides in order, what llama-quantize records of the importance matrix, the
 * block count after --prune-layers) follow the input's others, which keep their order. */
static void plan_keys(struct convert *c, uint32_t file_type)
{
    const struct qd_gguf_options *opt = c->opt;
    struct qd_gguf_new_kv *extra = c->extra;
    int n = 0;
    extra[n++] = (struct qd_gguf_new_kv){"general.quantization_version", QD_GGUF_U32, .i = 2};
    extra[n++] = (struct qd_gguf_new_kv){"general.file_type", QD_GGUF_U32, .i = file_type};
    for (int i = 0; opt && i < opt->n_kv_overrides; i++)
        n = qd_gguf_kv_append(extra, n, qd_gguf_kv_of_override(&opt->kv_overrides[i]));
    /* what llama-quantize records of the importance matrix; not where it covered none of the
     * tensors quantized (quantd llama-quantize, which goes on): none of them used it */
    if (c->rs.has_imatrix && !(c->s->imatrix_missing && !c->s->imatrix_covered)) {
        snprintf(c->imatrix_file, sizeof c->imatrix_file, "%s", opt->imatrix);
        n = qd_gguf_kv_append(extra, n, (struct qd_gguf_new_kv){"quantize.imatrix.file", QD_GGUF_STRING,
                                                                .s = c->imatrix_file});
        if (c->im.dataset) {
            snprintf(c->imatrix_dataset, sizeof c->imatrix_dataset, "%s", c->im.dataset);
            n = qd_gguf_kv_append(extra, n, (struct qd_gguf_new_kv){"quantize.imatrix.dataset", QD_GGUF_STRING,
                                                                    .s = c->imatrix_dataset});
        }
        n = qd_gguf_kv_append(extra, n, (struct qd_gguf_new_kv){"quantize.imatrix.entries_count", QD_GGUF_U32,
                                                                .i = c->im.n});
        if (c->im.chunk_count > 0)
            n = qd_gguf_kv_append(extra, n, (struct qd_gguf_new_kv){"quantize.imatrix.chunks_count", QD_GGUF_U32,
                                                                    .i = c->im.chunk_count});
    }
    if (opt && opt->n_prune) {
        snprintf(c->block_count_key, sizeof c->block_count_key, "%s.block_count", c->arch ? c->arch : "");
        n = qd_gguf_kv_append(extra, n, (struct qd_gguf_new_kv){c->block_count_key, QD_GGUF_U32, .i = c->n_blocks});
    }
    c->n_extra = n;
    static const char *const dropped[] = {"general.quantization_version", "general.file_type", "split.no",
                                          "split.count", "split.tensors.count", NULL};
    for (int64_t i = 0; i < c->model.g.n_kv; i++) {
        int drop = 0;
        for (const char *const *d = dropped; *d; d++)
            drop |= !strcmp(c->model.g.kv[i].key, *d);
        for (int e = 0; e < n; e++)
            drop |= !strcmp(c->model.g.kv[i].key, extra[e].key);
        if (!drop)
            c->kv[c->nkv++] = &c->model.g.kv[i];
    }
}

/* The output files, one or gguf-split's splits (--split-max-tensors / --split-max-size), and
 * each one's header. */
static int plan_files(struct convert *c)
{
    const struct qd_gguf_options *opt = c->opt;
    const int n = c->n;
    c->n_split = 1;
    if (!(c->split_of = calloc((size_t)(n ? n : 1), sizeof *c->split_of)))
        return no_memory(c);
    if (opt && opt->keep_split)
        c->n_split = qd_gguf_plan_keep_split(c->plan, n, c->split_of, c->err, c->errlen);
    else if (opt && (opt->split_max_tensors || opt->split_max_bytes))
        c->n_split = qd_gguf_plan_splits(c->plan, n, opt, c->split_of, c->err, c->errlen);
    if (c->n_split < 0) {
        c->n_split = 0;
        *c->status = QD_EINVAL;
        return -1;
    }
    c->split_names = c->n_split > 1 || (opt && opt->keep_split);
    const int n_split = c->n_split;
    if (!(c->metas = calloc((size_t)n_split, sizeof *c->metas)) ||
        !(c->meta_lens = calloc((size_t)n_split, sizeof *c->meta_lens)) ||
        !(c->outs = calloc((size_t)n_split, sizeof *c->outs)))
        return no_memory(c);
    for (int k = 0; k < n_split; k++)
        c->outs[k].fd = -1;
    struct qd_gguf_tensor *infos = malloc((size_t)(n ? n : 1) * sizeof *infos);
    for (int k = 0; infos && k < n_split; k++) {
        int ni = 0;
        for (int i = 0; i < n; i++)
            if (c->split_of[i] == k)
                infos[ni++] = c->plan[i].out;
        /* the first file holds every key; each then split.no, split.count and split.tensors.count:
         * llama-quantize --keep-split sets them in that order, gguf-split sets split.count first as
         * a placeholder and again last (no, tensors, count) */
        const int keep = c->opt && c->opt->keep_split;
        const struct qd_gguf_new_kv count = {"split.count", QD_GGUF_U16, .i = n_split},
                                    tensors = {"split.tensors.count", QD_GGUF_I32, .i = n};
        struct qd_gguf_new_kv split_kv[3] = {{"split.no", QD_GGUF_U16, .i = k}, keep ? count : tensors,
                                             keep ? tensors : count};
        struct qd_gguf_new_kv all[sizeof c->extra / sizeof *c->extra + 3];
        int n_all = 0;
        for (int e = 0; k == 0 && e < c->n_extra; e++)
            all[n_all++] = c->extra[e];
        for (int e = 0; n_split > 1 && e < 3; e++)
            all[n_all++] = split_kv[e];
        c->metas[k] = qd_gguf_write_meta(c->kv, k == 0 ? c->nkv : 0, all, n_all, infos, ni,
                                         QD_GGUF_DEFAULT_ALIGNMENT, &c->meta_lens[k]);
        if (!c->metas[k])
            break;
    }
    free(infos);
    for (int k = 0; k < n_split; k++)
        if (!c->metas[k]) {
            snprintf(c->err, c->errlen, "no memory for the output header");
            *c->status = QD_ENOMEM;
            return -1;
        }
    return 0;
}

/* --dry-run: each tensor's type (through the progress callback) and the file's size, no file. */
static int dry_run(struct convert *c)
{
    struct piece *each = calloc((size_t)c->n + 1, sizeof *each);
    if (!each)
        return no_memory(c);
    struct qd_convert_summary *s = c->s;
    struct job dry = {.o = c->o, .plan = c->plan, .pieces = each, .s = s, .t0 = qd_pipe_clock_s(), .count = c->n};
    for (int k = 0; k < c->n_split; k++)
        s->bytes_out += c->meta_lens[k];
    for (int i = 0; i < c->n; i++) {
        dry.in_total += c->plan[i].src->bytes;
        s->bytes_out += (c->plan[i].out.bytes + QD_GGUF_DEFAULT_ALIGNMENT - 1) / QD_GGUF_DEFAULT_ALIGNMENT *
                        QD_GGUF_DEFAULT_ALIGNMENT;
    }
    for (int i = 0; i < c->n; i++) {
        each[i + 1] = (struct piece){.plan = i, .rows = tensor_rows(&c->plan[i]), .last = 1};
        tensor_handed(&dry, i + 1);
    }
    free(each);
    s->dry_run = 1;
    *c->status = QD_OK;
    return 0;
}

/* The pipeline's items: per file its header, then each of its tensors (in pieces of whole rows
 * when it is processed and large; not with --report-error, whose error is one figure per
 * tensor) padded to the alignment; and the buffers the largest processed piece needs. */
static int plan_items(struct convert *c, struct job *job)
{
    const struct qd_convert_opts *o = c->o;
    const struct qd_gguf_plan *plan = c->plan;
    int nitems = c->n_split;
    for (int i = 0; i < c->n; i++) {
        const int64_t per = rows_per_piece(&plan[i], o);
        const int64_t rows = tensor_rows(&plan[i]);
        nitems += rows ? (int)((rows + per - 1) / per) : 1;
    }
    c->items = calloc((size_t)nitems, sizeof *c->items);
    c->pieces = calloc((size_t)nitems, sizeof *c->pieces);
    c->first = calloc((size_t)c->n_split + 1, sizeof *c->first);
    if (!c->items || !c->pieces || !c->first)
        return no_memory(c);
    if (!(c->src_fds = malloc((size_t)c->model.n_files * sizeof *c->src_fds)))
        return no_memory(c);
    for (int i = 0; i < c->model.n_files; i++)
        c->src_fds[i] = -1;
    for (int i = 0; i < c->model.n_files; i++)
        if ((c->src_fds[i] = qd_open_input(c->model.paths[i], c->err, c->errlen)) < 0) {
            *c->status = QD_EIO;
            return -1;
        }
    int k = 0;
    for (int sp = 0; sp < c->n_split; sp++) {
        c->first[sp] = k;
        c->items[k++] = (struct qd_pipe_item){.kind = QD_PIPE_BYTES, .bytes = c->metas[sp], .out_bytes = c->meta_lens[sp]};
        for (int i = 0; i < c->n; i++) {
            if (c->split_of[i] != sp)
                continue;
            job->in_total += plan[i].src->bytes;
            const int64_t rows = tensor_rows(&plan[i]), per = rows_per_piece(&plan[i], o);
            const uint64_t row_in = rows ? plan[i].src->bytes / (uint64_t)rows : 0;
            const uint64_t row_out = rows ? plan[i].out.bytes / (uint64_t)rows : 0;
            for (int64_t r = 0; r < rows || (rows == 0 && r == 0); r += per, k++) { /* an empty tensor: one item */
                const int64_t nr = rows - r < per ? rows - r : per;
                const int last = r + nr == rows;
                c->pieces[k] = (struct piece){.plan = i, .row0 = r, .rows = nr, .last = last};
                c->items[k] = (struct qd_pipe_item){
                    .kind = plan[i].action == QD_CONVERT_COPY ? QD_PIPE_COPY : QD_PIPE_PROCESS,
                    .src = plan[i].src->file,
                    .src_offset = (uint64_t)(plan[i].src->data - c->model.maps[plan[i].src->file].data) +
                                  (uint64_t)r * row_in,
                    .src_bytes = (uint64_t)nr * row_in, .out_bytes = (uint64_t)nr * row_out,
                    .pad_to = last ? QD_GGUF_DEFAULT_ALIGNMENT : 0};
            }
        }
    }
    c->first[c->n_split] = k;
    uint64_t in_cap = 0, out_cap = 0;
    for (int i = 0; i < nitems; i++)
        if (c->items[i].kind == QD_PIPE_PROCESS) {
            in_cap = c->items[i].src_bytes > in_cap ? c->items[i].src_bytes : in_cap;
            out_cap = c->items[i].out_bytes > out_cap ? c->items[i].out_bytes : out_cap;
        }
    if (!(c->pool = qd_pipe_pool_new(o->backend, in_cap, out_cap, qd_convert_lanes(o)))) {
        snprintf(c->err, c->errlen, "no memory for the pipeline's buffers (%" PRIu64 " + %" PRIu64 " bytes each)",
                 in_cap, out_cap);
        *c->status = QD_ENOMEM;
        return -1;
    }
    return 0;
}

/* Runs the pipeline into each file and commits them all once every one is written; on failure
 * none is left behind. */
static void file_path(const struct convert *c, int sp, char *path, size_t len)
{
    if (c->split_names)
        qd_gguf_split_path(c->o->dst, sp, c->n_split, path, len);
    else
        snprintf(path, len, "%s", c->o->dst);
}

/* Before anything is written: no output is one of the input's files, and none of a split's
 * is replaced without --force. */
static int check_files(struct convert *c)
{
    for (int sp = 0; sp < c->n_split; sp++) {
        char path[4200];
        struct stat st;
        file_path(c, sp, path, sizeof path);
        for (int f = 0; f < c->model.n_files; f++)
            if (same_file(path, c->model.paths[f])) {
                snprintf(c->err, c->errlen, "convert: the output %s is the input's %s: give another destination",
                         path, c->model.n_files > 1 ? "shard" : "file");
                *c->status = QD_EINVAL;
                return -1;
            }
        if (c->split_names && !c->o->overwrite && lstat(path, &st) == 0) {
            snprintf(c->err, c->errlen, "convert: %s exists (give --force to replace it)", path);
            *c->status = QD_EINVAL;
            return -1;
        }
    }
    return 0;
}

static int write_files(struct convert *c, struct job *job)
{
    const struct qd_convert_opts *o = c->o;
    for (int sp = 0; sp < c->n_split; sp++) {
        char path[4200];
        file_path(c, sp, path, sizeof path);
        if (qd_outfile_open(&c->outs[sp], path, c->err, c->errlen)) {
            *c->status = QD_EIO;
            goto fail;
        }
        job->pieces = c->pieces + c->first[sp]; /* the pipeline numbers this file's items from 0 */
        struct qd_pipe pipe = {.src_fds = c->src_fds, .n_src = c->model.n_files, .out = &c->outs[sp], .items = c->items + c->first[sp],
                               .n = c->first[sp + 1] - c->first[sp], .process = process_tensor,
                               .handed = tensor_handed, .ctx = job, .pool = c->pool, .cancel = o->cancel,
                               .stats = &c->s->stages, .lanes = qd_convert_lanes(o)};
        if (qd_pipe_run(&pipe, c->status, c->err, c->errlen))
            goto fail;
        c->s->bytes_out += c->outs[sp].written;
    }
    double t0 = qd_pipe_clock_s();
    for (int sp = 0; sp < c->n_split; sp++)
        if (qd_outfile_commit(&c->outs[sp], c->err, c->errlen)) {
            *c->status = qd_status_of_write(errno);
            goto fail;
        }
    qd_pipe_trace("commit", -1, t0, qd_pipe_clock_s(), 0);
    *c->status = QD_OK;
    return 0;
fail:
    for (int sp = 0; sp < c->n_split; sp++)
        qd_outfile_abort(&c->outs[sp]);
    return -1;
}

static void convert_free(struct convert *c)
{
    for (int sp = 0; c->metas && sp < c->n_split; sp++)
        free(c->metas[sp]);
    free(c->metas);
    free(c->meta_lens);
    free(c->outs);
    free(c->split_of);
    for (int i = 0; c->src_fds && i < c->model.n_files; i++)
        if (c->src_fds[i] >= 0)
            close(c->src_fds[i]);
    free(c->src_fds);
    qd_pipe_pool_free(c->pool);
    free(c->items);
    free(c->pieces);
    free(c->first);
    qd_name_filter_free(c->own_nf);
    free(c->kv);
    free(c->order);
    free(c->plan);
    free(c->arch);
    qd_imatrix_free(&c->im);
    qd_gguf_model_close(&c->model);
}

int qd_convert_gguf(const struct qd_convert_opts *o, struct qd_convert_summary *s, enum qd_status *status,
                    char *err, size_t errlen)
{
    double t0 = qd_pipe_clock_s();
    const struct qd_format *f = o->f;
    const struct qd_gguf_recipe *recipe = o->recipe ? qd_gguf_recipe_find(o->recipe) : NULL;
    uint32_t file_type = recipe ? (uint32_t)recipe->ftype : (uint32_t)f->gguf_file_type;
    if (!(recipe && !recipe->fmt) && !f->gguf_file_type) {
        snprintf(err, errlen, "convert: %s has no llama.cpp file type (llama-quantize does not write it); "
                 "use q4_0, q4_1, q5_0, q5_1, q8_0 or a K-quant (q2_K ... q6_K)", f->name);
        return -1;
    }
    if (same_file(o->src, o->dst)) {
        snprintf(err, errlen, "convert: the output %s is the input", o->dst);
        return -1;
    }
    struct convert *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(err, errlen, "no memory");
        *status = QD_ENOMEM;
        return -1;
    }
    *c = (struct convert){.o = o, .opt = o->gguf, .s = s, .status = status, .err = err, .errlen = errlen};
    if (qd_gguf_model_open(o->src, o->one_file, &c->model, o->cancel, status, err, errlen)) {
        convert_free(c);
        free(c);
        return -1;
    }
    c->arch = qd_gguf_string(&c->model.g, "general.architecture");
    if (recipe && recipe->copy)
        file_type = input_file_type(&c->model.g);
    int rc = plan_tensors(c, recipe);
    if (rc == 0) {
        plan_keys(c, file_type);
        rc = plan_files(c);
    }
    if (rc == 0 && c->opt && c->opt->dry_run)
        rc = dry_run(c);
    else if (rc == 0) {
        struct job job = {.o = o, .plan = c->plan, .s = s, .t0 = qd_pipe_clock_s(), .count = c->n};
        rc = check_files(c);
        if (rc == 0)
            rc = plan_items(c, &job);
        if (rc == 0)
            rc = write_files(c, &job);
    }
    s->seconds = qd_pipe_clock_s() - t0;
    convert_free(c);
    free(c);
    return rc;
}
