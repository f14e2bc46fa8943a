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
 * - data aligned to 32 (GGUF_DEFAULT_ALIGNMENT), each tensor zero-padded to it. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
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
 * (ternary: d after the codes; MXFP4: an E8M0 exponent instead, fields 0). */
static void f16_fields(uint32_t type, int *at, int *fields)
{
    *at = type == QD_GGML_Q2_K ? 80 : type == QD_GGML_Q3_K ? 108 : type == QD_GGML_Q6_K ? 208
        : type == 34 /* tq1_0 */ ? 52 : type == 35 /* tq2_0 */ ? 64 : 0;
    *fields = type == 39 /* mxfp4 */ ? 0 : type == QD_GGML_Q4_1 || type == QD_GGML_Q5_1 || type == QD_GGML_Q2_K ||
              type == QD_GGML_Q4_K || type == QD_GGML_Q5_K ? 2 : 1;
}

/* MXFP4's validation: no block exponent 0xff (E8M0's NaN). */
static int invalid_e8m0(uint32_t type, const uint8_t *p, uint64_t n_blocks, int block_bytes)
{
    for (uint64_t b = 0; type == 39 && b < n_blocks; b++)
        if (p[b * (uint64_t)block_bytes] == 0xff)
            return 1;
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
 * to allocate). */
#define PIECE_BYTES (128u << 20)
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
    const uint64_t cap = o->piece_bytes ? o->piece_bytes : PIECE_BYTES;
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

/* process_tensor's work on f32/f16/bf16 rows: the quantizer, or the cast to F16, and llama's
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
    uint64_t count = out_bytes / 2; /* QD_CONVERT_CAST_F16 */
    uint16_t *h = out;
    for (uint64_t k = 0; k < count; k++)
        h[k] = qd_f32_to_f16(in_dtype == QD_F32 ? ((const float *)in)[k] : qd_bf16_to_f32(((const uint16_t *)in)[k]));
    if (first_nonfinite_f16(out, count, 2, 0, 1)) {
        snprintf(err, errlen, "tensor '%s': a value is not finite in f16 (llama-quantize stops there too)",
                 p->src->name);
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
        p->action == QD_CONVERT_CAST_F16 ? s->cast++ : s->copied++;
    double now = qd_pipe_clock_s();
    if (j->o->progress) {
        struct qd_convert_event ev = {.index = j->pieces[item].plan + 1, .count = j->count, .name = p->out.name, .action = p->action,
                                      .fmt = p->f ? p->f->name : j->o->f->name, .ms = (now - (j->last ? j->last : j->t0)) * 1e3,
                                      .has_nmse = j->o->report_error && p->action == QD_CONVERT_QUANTIZE,
                                      .nmse = j->nmse, .in_done = s->bytes_in, .in_total = j->in_total};
        uint32_t nd = qd_gguf_n_dims(p->src->ne);
        ev.ndim = (int)nd;
        for (uint32_t d = 0; d < nd; d++) /* outermost first, as torch and safetensors list them */
            ev.shape[d] = p->src->ne[nd - 1 - d];
        j->o->progress(j->o->progress_ctx, &ev);
    }
    j->last = now;
}

int qd_convert_gguf(const struct qd_convert_opts *o, struct qd_convert_summary *s, enum qd_status *status,
                    char *err, size_t errlen)
{
    double t0 = qd_pipe_clock_s();
    const struct qd_format *f = o->f;
    const struct qd_gguf_recipe *recipe = o->recipe ? qd_gguf_recipe_find(o->recipe) : NULL;
    const uint32_t file_type = recipe ? (uint32_t)recipe->ftype : (uint32_t)f->gguf_file_type;
    if (!f->gguf_file_type) {
        snprintf(err, errlen, "convert: %s has no llama.cpp file type (llama-quantize does not write it); "
                 "use q4_0, q4_1, q5_0, q5_1, q8_0 or a K-quant (q2_K ... q6_K)", f->name);
        return -1;
    }
    if (same_file(o->src, o->dst)) {
        snprintf(err, errlen, "convert: the output %s is the input", o->dst);
        return -1;
    }
    struct qd_mapped in;
    if (qd_map_file(o->src, &in, err, errlen)) {
        *status = QD_ENOTFOUND;
        return -1;
    }
    struct qd_gguf g;
    if (qd_gguf_parse(in.data, in.size, &g, o->cancel, err, errlen)) {
        if (o->cancel && *o->cancel)
            *status = QD_ECANCELED;
        qd_unmap_file(&in);
        return -1;
    }
    int rc = -1, n = (int)g.n_tensors;
    char *arch = qd_gguf_string(&g, "general.architecture");
    struct qd_gguf_plan *plan = calloc((size_t)(n ? n : 1), sizeof *plan);
    const struct qd_gguf_tensor **order = calloc((size_t)(n ? n : 1), sizeof *order);
    const struct qd_gguf_kv **kv = calloc((size_t)(g.n_kv ? g.n_kv : 1), sizeof *kv);
    struct qd_name_filter *own_nf = o->filter ? NULL : qd_name_filter_new(o->skip, o->only, err, errlen);
    const struct qd_name_filter *nf = o->filter ? o->filter : own_nf;
    struct qd_pipe_item *items = NULL;
    struct piece *pieces = NULL;
    struct qd_pipe_pool *pool = NULL;
    int src_fd = -1;
    struct qd_imatrix im = {0};
    int n_split = 1, *split_of = NULL;
    uint8_t **metas = NULL;
    size_t *meta_lens = NULL;
    struct qd_outfile *outs = NULL;
    if (!plan || !order || !kv || !nf) {
        if (nf)
            snprintf(err, errlen, "no memory for %d tensors", n);
        *status = nf ? QD_ENOMEM : QD_EINVAL;
        goto done;
    }
    /* the plan: every output tensor, from the headers alone */
    for (int i = 0; i < n; i++)
        order[i] = &g.tensors[i];
    qsort(order, (size_t)n, sizeof *order, qd_gguf_loader_order);
    const struct qd_gguf_options *opt = o->gguf;
    int kept = 0, n_blocks = 0;
    if (qd_gguf_plan_prune(order, n, opt, plan, &kept, &n_blocks, err, errlen)) {
        *status = QD_ENOMEM;
        goto done;
    }
    const char **names = calloc((size_t)(kept ? kept : 1), sizeof *names);
    if (!names) {
        snprintf(err, errlen, "no memory for %d tensors", n);
        *status = QD_ENOMEM;
        goto done;
    }
    for (int i = 0; i < kept; i++)
        names[i] = plan[i].out.name;
    struct qd_recipe_state rs;
    qd_recipe_init(&rs, recipe, (uint32_t)f->gguf_type, opt, &g, names, kept);
    free(names);
    n = kept;
    /* the importance matrix (--imatrix), narrowed by --include-weights / --exclude-weights; none
     * left is none at all (llama-quantize's prepare_imatrix) */
    if (opt && opt->imatrix_path) {
        if (qd_gguf_imatrix_load(opt->imatrix_path, &im, err, errlen)) {
            *status = QD_EINVAL;
            goto done;
        }
        qd_imatrix_filter(&im, (const char *const *)opt->include_weights, opt->n_include,
                          (const char *const *)opt->exclude_weights, opt->n_exclude);
        rs.has_imatrix = im.n > 0;
    }
    for (int i = 0; i < n; i++) {
        struct qd_gguf_plan *p = &plan[i];
        p->action = QD_CONVERT_COPY;
        s->params_total += p->src->bytes / (uint64_t)qd_ggml_type(p->src->type)->block_bytes *
                           (uint64_t)qd_ggml_type(p->src->type)->block_elems;
        if (!qd_gguf_allows_quantization(&p->out, rs.arch, opt))
            continue;
        /* the mix's counters advance over every tensor it types, kept or not by --skip/--only */
        const uint32_t target = qd_recipe_type(&rs, p->src, p->out.name);
        const int requires = qd_recipe_requires_imatrix(&rs, p->out.name, target);
        if (requires && !rs.has_imatrix && !(opt && opt->dry_run)) {
            snprintf(err, errlen, "this quantization requires an importance matrix (--imatrix FILE, made by "
                     "llama-imatrix): tensor '%s' would be %s", p->out.name, qd_ggml_type(target)->name);
            goto done;
        }
        if (!qd_name_filter_keeps(nf, p->out.name))
            continue;
        if (qd_gguf_plan_target(p, target, opt, err, errlen))
            goto done;
        if (p->action != QD_CONVERT_COPY &&
            qd_gguf_plan_importance(p, rs.has_imatrix ? &im : NULL, requires && !(opt && opt->dry_run), err, errlen))
            goto done;
    }
    int nkv = 0;
    static const char *const dropped[] = {"general.quantization_version", "general.file_type", "split.no",
                                          "split.count", "split.tensors.count", NULL};
    /* gguf_set_val_* removes the key and appends it: quantization version, file type, the
     * overrides in order, the block count after --prune-layers */
    struct qd_gguf_new_kv extra[2 + QD_GGUF_MAX_KV_OVERRIDES + 5];
    int n_extra = 0;
    extra[n_extra++] = (struct qd_gguf_new_kv){"general.quantization_version", QD_GGUF_U32, .i = 2};
    extra[n_extra++] = (struct qd_gguf_new_kv){"general.file_type", QD_GGUF_U32, .i = file_type};
    for (int i = 0; opt && i < opt->n_kv_overrides; i++)
        n_extra = qd_gguf_kv_append(extra, n_extra, qd_gguf_kv_of_override(&opt->kv_overrides[i]));
    if (rs.has_imatrix) { /* what llama-quantize records of the importance matrix, after the user's */
        static char file[128], dataset[128]; /* (its 127-byte values) */
        snprintf(file, sizeof file, "%s", opt->imatrix);
        n_extra = qd_gguf_kv_append(extra, n_extra, (struct qd_gguf_new_kv){"quantize.imatrix.file", QD_GGUF_STRING, .s = file});
        if (im.dataset) {
            snprintf(dataset, sizeof dataset, "%s", im.dataset);
            n_extra = qd_gguf_kv_append(extra, n_extra,
                                (struct qd_gguf_new_kv){"quantize.imatrix.dataset", QD_GGUF_STRING, .s = dataset});
        }
        n_extra = qd_gguf_kv_append(extra, n_extra, (struct qd_gguf_new_kv){"quantize.imatrix.entries_count", QD_GGUF_U32,
                                                                    .i = im.n});
        if (im.chunk_count > 0)
            n_extra = qd_gguf_kv_append(extra, n_extra, (struct qd_gguf_new_kv){"quantize.imatrix.chunks_count", QD_GGUF_U32,
                                                                        .i = im.chunk_count});
    }
    char block_count[160];
    if (opt && opt->n_prune) {
        snprintf(block_count, sizeof block_count, "%s.block_count", arch ? arch : "");
        n_extra = qd_gguf_kv_append(extra, n_extra, (struct qd_gguf_new_kv){block_count, QD_GGUF_U32, .i = n_blocks});
    }
    for (int64_t i = 0; i < g.n_kv; i++) {
        int drop = 0;
        for (const char *const *d = dropped; *d; d++)
            drop |= !strcmp(g.kv[i].key, *d);
        for (int e = 0; e < n_extra; e++)
            drop |= !strcmp(g.kv[i].key, extra[e].key);
        if (!drop)
            kv[nkv++] = &g.kv[i];
    }
    /* the output files: one, or gguf-split's splits (--split-max-tensors / --split-max-size) */
    if (!(split_of = calloc((size_t)(n ? n : 1), sizeof *split_of))) {
        snprintf(err, errlen, "no memory");
        *status = QD_ENOMEM;
        goto done;
    }
    if (opt && (opt->split_max_tensors || opt->split_max_bytes) &&
        (n_split = qd_gguf_plan_splits(plan, n, opt, split_of, err, errlen)) < 0) {
        *status = QD_EINVAL;
        goto done;
    }
    if (!(metas = calloc((size_t)n_split, sizeof *metas)) || !(meta_lens = calloc((size_t)n_split, sizeof *meta_lens)) ||
        !(outs = calloc((size_t)n_split, sizeof *outs))) {
        snprintf(err, errlen, "no memory");
        *status = QD_ENOMEM;
        goto done;
    }
    for (int k = 0; k < n_split; k++)
        outs[k].fd = -1;
    struct qd_gguf_tensor *infos = malloc((size_t)(n ? n : 1) * sizeof *infos);
    for (int k = 0; infos && k < n_split; k++) {
        int ni = 0;
        for (int i = 0; i < n; i++)
            if (split_of[i] == k)
                infos[ni++] = plan[i].out;
        /* gguf-split: the first split holds every key; each split then split.no, split.count (a
         * placeholder, set again last) and split.tensors.count: no, tensors, count */
        struct qd_gguf_new_kv split_kv[3] = {{"split.no", QD_GGUF_U16, .i = k},
                                             {"split.tensors.count", QD_GGUF_I32, .i = n},
                                             {"split.count", QD_GGUF_U16, .i = n_split}};
        struct qd_gguf_new_kv all[sizeof extra / sizeof *extra + 3];
        int n_all = 0;
        for (int e = 0; k == 0 && e < n_extra; e++)
            all[n_all++] = extra[e];
        for (int e = 0; n_split > 1 && e < 3; e++)
            all[n_all++] = split_kv[e];
        metas[k] = qd_gguf_write_meta(kv, k == 0 ? nkv : 0, all, n_all, infos, ni, QD_GGUF_DEFAULT_ALIGNMENT,
                                      &meta_lens[k]);
        if (!metas[k])
            break;
    }
    free(infos);
    for (int k = 0; k < n_split; k++)
        if (!metas[k]) {
            snprintf(err, errlen, "no memory for the output header");
            *status = QD_ENOMEM;
            goto done;
        }
    if (opt && opt->dry_run) { /* each tensor's type and the file's size, no file */
        struct piece *each = calloc((size_t)n + 1, sizeof *each);
        if (!each) {
            snprintf(err, errlen, "no memory");
            *status = QD_ENOMEM;
            goto done;
        }
        struct job dry = {.o = o, .plan = plan, .pieces = each, .s = s, .t0 = qd_pipe_clock_s(), .count = n};
        for (int k = 0; k < n_split; k++)
            s->bytes_out += meta_lens[k];
        for (int i = 0; i < n; i++) {
            dry.in_total += plan[i].src->bytes;
            s->bytes_out += (plan[i].out.bytes + QD_GGUF_DEFAULT_ALIGNMENT - 1) / QD_GGUF_DEFAULT_ALIGNMENT *
                            QD_GGUF_DEFAULT_ALIGNMENT;
        }
        for (int i = 0; i < n; i++) {
            each[i + 1] = (struct piece){.plan = i, .rows = tensor_rows(&plan[i]), .last = 1};
            tensor_handed(&dry, i + 1);
        }
        free(each);
        s->dry_run = 1;
        rc = 0;
        *status = QD_OK;
        goto done;
    }
    /* the items: per file its header, then each of its tensors (in pieces of whole rows when it
     * is processed and large; not with --report-error, whose error is one figure per tensor)
     * padded to the alignment */
    int nitems = n_split;
    for (int i = 0; i < n; i++) {
        const int64_t per = rows_per_piece(&plan[i], o);
        const int64_t rows = tensor_rows(&plan[i]);
        nitems += rows ? (int)((rows + per - 1) / per) : 1;
    }
    items = calloc((size_t)nitems, sizeof *items);
    pieces = calloc((size_t)nitems, sizeof *pieces);
    int *first = calloc((size_t)n_split + 1, sizeof *first); /* each file's first item */
    src_fd = items && pieces && first ? qd_open_input(o->src, err, errlen) : -1;
    if (!items || !pieces || !first || src_fd < 0) {
        if (!items || !pieces || !first)
            snprintf(err, errlen, "no memory");
        *status = items && pieces && first ? QD_EIO : QD_ENOMEM;
        free(first);
        goto fail;
    }
    struct job job = {.o = o, .plan = plan, .s = s, .t0 = qd_pipe_clock_s(), .count = n};
    int k = 0;
    for (int sp = 0; sp < n_split; sp++) {
        first[sp] = k;
        items[k++] = (struct qd_pipe_item){.kind = QD_PIPE_BYTES, .bytes = metas[sp], .out_bytes = meta_lens[sp]};
        for (int i = 0; i < n; i++) {
            if (split_of[i] != sp)
                continue;
            job.in_total += plan[i].src->bytes;
            const int64_t rows = tensor_rows(&plan[i]), per = rows_per_piece(&plan[i], o);
            const uint64_t row_in = rows ? plan[i].src->bytes / (uint64_t)rows : 0;
            const uint64_t row_out = rows ? plan[i].out.bytes / (uint64_t)rows : 0;
            for (int64_t r = 0; r < rows || (rows == 0 && r == 0); r += per, k++) { /* an empty tensor: one item */
                const int64_t nr = rows - r < per ? rows - r : per;
                const int last = r + nr == rows;
                pieces[k] = (struct piece){.plan = i, .row0 = r, .rows = nr, .last = last};
                items[k] = (struct qd_pipe_item){
                    .kind = plan[i].action == QD_CONVERT_COPY ? QD_PIPE_COPY : QD_PIPE_PROCESS,
                    .src_offset = (uint64_t)(plan[i].src->data - in.data) + (uint64_t)r * row_in,
                    .src_bytes = (uint64_t)nr * row_in, .out_bytes = (uint64_t)nr * row_out,
                    .pad_to = last ? QD_GGUF_DEFAULT_ALIGNMENT : 0};
            }
        }
    }
    first[n_split] = k;
    uint64_t in_cap = 0, out_cap = 0;
    for (int i = 0; i < nitems; i++)
        if (items[i].kind == QD_PIPE_PROCESS) {
            in_cap = items[i].src_bytes > in_cap ? items[i].src_bytes : in_cap;
            out_cap = items[i].out_bytes > out_cap ? items[i].out_bytes : out_cap;
        }
    if (!(pool = qd_pipe_pool_new(o->backend, in_cap, out_cap, qd_convert_lanes(o)))) {
        snprintf(err, errlen, "no memory for the pipeline's buffers (%" PRIu64 " + %" PRIu64 " bytes each)", in_cap,
                 out_cap);
        *status = QD_ENOMEM;
        free(first);
        goto fail;
    }
    for (int sp = 0; sp < n_split; sp++) {
        char path[4200];
        qd_gguf_split_path(o->dst, sp, n_split, path, sizeof path);
        struct stat st;
        if (n_split > 1 && !o->overwrite && lstat(path, &st) == 0) {
            snprintf(err, errlen, "convert: %s exists (give --force to replace it)", path);
            *status = QD_EINVAL;
            free(first);
            goto fail;
        }
        if (qd_outfile_open(&outs[sp], path, err, errlen)) {
            *status = QD_EIO;
            free(first);
            goto fail;
        }
        job.pieces = pieces + first[sp]; /* the pipeline numbers this file's items from 0 */
        struct qd_pipe pipe = {.src_fd = src_fd, .out = &outs[sp], .items = items + first[sp],
                               .n = first[sp + 1] - first[sp], .process = process_tensor, .handed = tensor_handed,
                               .ctx = &job, .pool = pool, .cancel = o->cancel, .stats = &s->stages,
                               .lanes = qd_convert_lanes(o)};
        if (qd_pipe_run(&pipe, status, err, errlen)) {
            free(first);
            goto fail;
        }
        s->bytes_out += outs[sp].written;
    }
    free(first);
    for (int sp = 0; sp < n_split; sp++)
        if (qd_outfile_commit(&outs[sp], err, errlen)) {
            *status = qd_status_of_write(errno);
            goto fail;
        }
    rc = 0;
    *status = QD_OK;
    goto done;
fail:
    for (int sp = 0; outs && sp < n_split; sp++)
        qd_outfile_abort(&outs[sp]);
done:
    for (int sp = 0; metas && sp < n_split; sp++)
        free(metas[sp]);
    free(metas);
    free(meta_lens);
    free(outs);
    free(split_of);
    if (src_fd >= 0)
        close(src_fd);
    qd_pipe_pool_free(pool);
    free(items);
    free(pieces);
    s->seconds = qd_pipe_clock_s() - t0;
    qd_name_filter_free(own_nf);
    free(kv);
    free(order);
    free(plan);
    free(arch);
    qd_imatrix_free(&im);
    qd_gguf_free(&g);
    qd_unmap_file(&in);
    return rc;
}
