/* The plan of a GGUF conversion (gguf_plan.h): which tensors, their names and types, the
 * importance each gets, the metadata llama-quantize adds and the files gguf-split cuts it into. */
#include "checkpoint/gguf_plan.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/gguf_recipe.h"

/* tensor_allows_quantization: names containing any of these stay as they are. */
static const char *const keep_if_contains[] = {
    "_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel",
    "per_layer_model_proj", "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight",
    "indexer.q_proj.weight", "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight",
    "time_mix_w2.weight", "time_mix_v0.weight", "time_mix_v1.weight", "time_mix_v2.weight",
    "time_mix_a0.weight", "time_mix_a1.weight", "time_mix_a2.weight", "time_mix_g1.weight",
    "time_mix_g2.weight", "time_mix_decay_w1.weight", "time_mix_decay_w2.weight",
    "time_mix_lerp_fused.weight", "attn_rel_b.weight", ".position_embd", "sam.pos_embd",
    "sam.neck.", "sam.net_", ".rel_pos", ".patch_embd", ".patch_merger", "a.rvq.codebook",
    "mm.a.code_embd", NULL};
/* ... and these whole names (positional embeddings, BERT's token types) */
static const char *const keep_if_named[] = {"position_embd.weight", "token_types.weight", NULL};
int qd_gguf_allows_quantization(const struct qd_gguf_tensor *t, const struct qd_gguf_arch *arch,
                                const struct qd_gguf_options *opt)
{
    size_t n = strlen(t->name);
    if (qd_gguf_n_dims(t->ne) < 2 || n < 6 || strcmp(t->name + n - 6, "weight"))
        return 0;
    if (opt && opt->leave_output_tensor && !strcmp(t->name, "output.weight"))
        return 0;
    for (const char *const *k = keep_if_named; *k; k++)
        if (!strcmp(t->name, *k))
            return 0;
    if (qd_gguf_arch_names_any(t->name, keep_if_contains))
        return 0;
    return !qd_gguf_arch_names_any(t->name, arch->keep);
}

/* llama_model_loader's weights_map order: by the layer number of "blk.%d." (-1 for others),
 * then by name. */
static int layer_of(const char *name)
{
    int layer = -1;
    sscanf(name, "blk.%d.", &layer);
    return layer;
}

int qd_gguf_loader_order(const void *a, const void *b)
{
    const struct qd_gguf_tensor *x = *(const struct qd_gguf_tensor *const *)a, *y = *(const struct qd_gguf_tensor *const *)b;
    int lx = layer_of(x->name), ly = layer_of(y->name);
    return lx != ly ? (lx < ly ? -1 : 1) : strcmp(x->name, y->name);
}

static int is_float(uint32_t type) { return type == QD_GGML_F32 || type == QD_GGML_F16 || type == QD_GGML_BF16; }

/* remap_layer (--prune-layers): where "blk.N." first occurs in name, as llama.cpp's regex
 * search finds it; -1 when nowhere. */
static int find_block(const char *name, const char **digits, int *ndigits)
{
    for (const char *p = strstr(name, "blk."); p; p = strstr(p + 1, "blk.")) {
        const char *d = p + 4;
        int k = 0;
        while (d[k] >= '0' && d[k] <= '9')
            k++;
        if (k && d[k] == '.' && k < 9) {
            *digits = d, *ndigits = k;
            return atoi(d);
        }
    }
    return -1;
}

/* The plan's tensors in the loader's order, without the pruned layers' and with the blocks
 * after a pruned one renumbered (llama-quant.cpp remap_layer: blocks below the first pruned
 * keep their number, the others take the next free one in the order met). *kept tensors,
 * *n_blocks the block count after pruning. */
int qd_gguf_plan_prune(const struct qd_gguf_tensor *const *order, int n, const struct qd_gguf_options *opt,
                       struct qd_gguf_plan *plan, int *kept, int *n_blocks, char *err, size_t errlen)
{
    const int np = opt ? opt->n_prune : 0;
    int max_blk = -1;
    for (int i = 0; i < n; i++) {
        const char *d;
        int k, b = find_block(order[i]->name, &d, &k);
        max_blk = b > max_blk ? b : max_blk;
    }
    int *mapped = malloc(sizeof *mapped * (size_t)(max_blk + 2)), next_id = 0;
    if (!mapped) {
        snprintf(err, errlen, "no memory");
        return -1;
    }
    for (int b = 0; b <= max_blk; b++)
        mapped[b] = -2; /* not met yet; -1: pruned */
    *kept = 0;
    for (int i = 0; i < n; i++) {
        struct qd_gguf_plan *p = &plan[*kept];
        p->src = order[i];
        p->out = *order[i];
        const char *d;
        int k, b = np ? find_block(order[i]->name, &d, &k) : -1;
        if (b >= 0) {
            if (mapped[b] == -2) {
                int pruned = 0;
                for (int j = 0; j < np; j++)
                    pruned |= opt->prune[j] == b;
                if (pruned)
                    mapped[b] = -1;
                else if (b < opt->prune[0])
                    mapped[b] = b, next_id = b + 1;
                else
                    mapped[b] = next_id++;
            }
            if (mapped[b] < 0)
                continue;
            snprintf(p->out.name, sizeof p->out.name, "%.*s%d%s", (int)(d - order[i]->name), order[i]->name,
                     mapped[b], d + k);
        }
        (*kept)++;
    }
    *n_blocks = next_id;
    free(mapped);
    return 0;
}

/* What the plan does with a tensor of ggml type `target`: copy it (its own type), cast it to
 * F32, F16 or BF16, or quantize it with the registry's format for that type. -1 with err when quantd does
 * not write that type or the tensor cannot become it. */
int qd_gguf_plan_target(struct qd_gguf_plan *p, uint32_t target, const struct qd_gguf_options *opt, char *err, size_t errlen)
{
    const struct qd_ggml_type *t = qd_ggml_type(target);
    if (target == QD_GGUF_TYPE_NONE) {
        snprintf(err, errlen, "tensor '%s': its rows of %" PRId64 " fit no block of the type chosen, and llama.cpp "
                 "defines no fallback for it (llama-quantize stops there too)", p->out.name, p->src->ne[0]);
        return -1;
    }
    if (target == p->src->type)
        return 0;
    if (p->src->ne[0] % t->block_elems) {
        snprintf(err, errlen, "tensor '%s': rows of %" PRId64 " do not divide into %s blocks of %d (give a type "
                 "with smaller blocks for it)", p->out.name, p->src->ne[0], t->name, t->block_elems);
        return -1;
    }
    if (!is_float(p->src->type)) {
        const struct qd_format *from = qd_gguf_format_of(p->src->type);
        if (!opt || !opt->allow_requantize) {
            snprintf(err, errlen, "tensor '%s' is %s: requantizing it is refused without --allow-requantize (as "
                     "llama-quantize refuses it; it loses more than quantizing from F32, F16 or BF16)", p->out.name,
                     qd_ggml_type(p->src->type)->name);
            return -1;
        }
        if (!from || !from->backend[QD_BACKEND_CPU].dequantize) {
            snprintf(err, errlen, "tensor '%s' is %s, which quantd does not dequantize: it cannot be requantized",
                     p->out.name, qd_ggml_type(p->src->type)->name);
            return -1;
        }
        p->requant = from;
    }
    p->f = is_float(target) ? NULL : qd_gguf_format_of(target);
    if (!is_float(target) && !p->f) {
        snprintf(err, errlen, "tensor '%s': quantd does not write ggml type %s (it writes f32, f16, bf16, q4_0, q4_1, "
                 "q5_0, q5_1, q8_0, q2_K ... q6_K, iq4_nl, iq4_xs, iq3_s, iq3_xxs, iq2_xxs, iq2_xs, iq2_s, iq1_s, iq1_m, "
                 "tq1_0, tq2_0, mxfp4)", p->out.name, t->name);
        return -1;
    }
    p->action = is_float(target) ? QD_CONVERT_CAST : QD_CONVERT_QUANTIZE;
    p->out.type = target;
    p->out.bytes = qd_ggml_nbytes(target, p->out.ne);
    return 0;
}

/* The tensor's entry of the importance matrix im (NULL: none), as llama-quantize picks it: by
 * its name before --prune-layers renumbered it, ne[0] values per matrix, another length refused
 * (but for the token embedding, whose entry is ignored then). A tensor that requires one and
 * has none is refused. */
int qd_gguf_plan_importance(struct qd_gguf_plan *p, const struct qd_imatrix *im, int requires, char *err, size_t errlen)
{
    const struct qd_imatrix_entry *e = im ? qd_imatrix_find(im, p->src->name) : NULL;
    const int64_t want = p->src->ne[0] * p->src->ne[2];
    if (e && e->n != want) {
        if (strcmp(p->src->name, "token_embd.weight") && strcmp(p->src->name, "per_layer_token_embd.weight")) {
            snprintf(err, errlen, "the importance matrix's entry for %s has %lld values, the tensor %lld (columns x "
                     "experts): it was made for another model", p->src->name, (long long)e->n, (long long)want);
            return -1;
        }
        e = NULL;
    }
    if (!e && requires) {
        snprintf(err, errlen, "the importance matrix has no entry for tensor %s, which %s needs one for "
                 "(llama-quantize refuses it too)", p->src->name, qd_ggml_type(p->out.type)->name);
        return -1;
    }
    if (!e && p->action == QD_CONVERT_QUANTIZE && p->f->importance_required) { /* token_embd, output */
        if (!im)
            snprintf(err, errlen, "this quantization requires an importance matrix (--imatrix FILE, made by "
                     "llama-imatrix): tensor '%s' would be %s", p->src->name, p->f->name);
        else
            snprintf(err, errlen, "tensor %s would be %s, which quantizes only with an importance, and the importance "
                     "matrix has no entry for it (llama-quantize aborts here): give it another type (--tensor-type, "
                     "--output-tensor-type, --token-embedding-type)", p->src->name, p->f->name);
        return -1;
    }
    if (e && p->action == QD_CONVERT_QUANTIZE && !p->f->importance) {
        snprintf(err, errlen, "tensor %s: quantd's %s does not take an importance matrix yet", p->src->name,
                 p->f->name);
        return -1;
    }
    p->importance = e && p->action == QD_CONVERT_QUANTIZE ? e->values : NULL;
    return 0;
}

int qd_gguf_plan_coverage(const struct qd_gguf_plan *plan, int n, const struct qd_imatrix *im,
                          const struct qd_gguf_options *opt, struct qd_convert_summary *s, char *err, size_t errlen)
{
    s->imatrix = opt->imatrix;
    s->imatrix_entries = im->n;
    s->imatrix_covered = s->imatrix_missing = 0;
    s->imatrix_first_missing[0] = 0;
    for (int i = 0; i < n; i++) {
        if (plan[i].action != QD_CONVERT_QUANTIZE)
            continue;
        if (plan[i].importance)
            s->imatrix_covered++;
        else if (!s->imatrix_missing++)
            snprintf(s->imatrix_first_missing, sizeof s->imatrix_first_missing, "%s", plan[i].src->name);
    }
    if (s->imatrix_covered || !s->imatrix_missing || opt->imatrix_uncovered_ok)
        return 0;
    /* llama-quantize quantizes on without it, a line per tensor, and records the file in the
     * output as if it had been used: a wrong file goes unnoticed */
    if (!im->n)
        snprintf(err, errlen, "the importance matrix %.200s has no entry left after --include-weights / "
                 "--exclude-weights, so it covers none of the %d tensors to quantize: give names that keep some",
                 opt->imatrix, s->imatrix_missing);
    else
        snprintf(err, errlen, "the importance matrix %.200s covers none of the %d tensors to quantize (none of its %d "
                 "entries names one; %s has none): it was made for another model. Make one for this model with "
                 "llama-imatrix (quantd llama-quantize, as llama-quantize does, only warns)", opt->imatrix,
                 s->imatrix_missing, im->n, s->imatrix_first_missing);
    return -1;
}

/* gguf-split's split strategy over the output's tensors, in order: a new file every
 * split_max_tensors tensors, or before a tensor that would take the tensors' padded bytes past
 * split_max_bytes (a file never empty: a first tensor larger than that is refused, as
 * gguf-split refuses it). The number of files, or -1 with err. */
int qd_gguf_plan_splits(const struct qd_gguf_plan *plan, int n, const struct qd_gguf_options *opt, int *split_of, char *err,
                         size_t errlen)
{
    int k = 0, in_split = 0;
    uint64_t bytes = 0;
    for (int i = 0; i < n; i++) {
        const uint64_t padded = (plan[i].out.bytes + QD_GGUF_DEFAULT_ALIGNMENT - 1) / QD_GGUF_DEFAULT_ALIGNMENT *
                                QD_GGUF_DEFAULT_ALIGNMENT;
        int cut = opt->split_max_tensors ? i > 0 && i % opt->split_max_tensors == 0
                                         : bytes + padded > opt->split_max_bytes;
        if (cut) {
            if (!in_split) {
                snprintf(err, errlen, "--split-max-size: tensor '%s' (%" PRIu64 " bytes) alone is larger than a split "
                         "may be; give a larger size", plan[i].out.name, padded);
                return -1;
            }
            k++, in_split = 0, bytes = 0;
        }
        bytes += padded;
        in_split++;
        split_of[i] = k;
    }
    return k + 1;
}

/* llama-quantize --keep-split: each tensor in the file of the shard it came from (the plan in
 * shard order); the number of files, or -1 with err where a shard has
 * no tensor left (--prune-layers took them all: llama-quantize stops on an assertion there). */
int qd_gguf_plan_keep_split(const struct qd_gguf_plan *plan, int n, int *split_of, char *err, size_t errlen)
{
    int n_split = 1;
    for (int i = 0; i < n; i++) {
        split_of[i] = plan[i].src->file;
        n_split = split_of[i] + 1 > n_split ? split_of[i] + 1 : n_split;
    }
    for (int k = 0, i = 0; k < n_split; k++) {
        while (i < n && split_of[i] < k)
            i++;
        if (i == n || split_of[i] != k) {
            snprintf(err, errlen, "--keep-split: no tensor of shard %d is left (--prune-layers took them all), so "
                     "its file would be empty: prune fewer layers or leave out --keep-split", k + 1);
            return -1;
        }
    }
    return n_split;
}

/* llama_split_path's order for --keep-split: by shard, then by place in the shard's file. */
int qd_gguf_shard_order(const void *a, const void *b)
{
    const struct qd_gguf_tensor *x = ((const struct qd_gguf_plan *)a)->src, *y = ((const struct qd_gguf_plan *)b)->src;
    if (x->file != y->file)
        return x->file < y->file ? -1 : 1;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* The name of file k of n: DST without ".gguf", then -0000K-of-0000N.gguf (llama_split_path). */
void qd_gguf_split_path(const char *dst, int k, int n, char *out, size_t len)
{
    size_t stem = strlen(dst);
    if (stem > 5 && !strcmp(dst + stem - 5, ".gguf"))
        stem -= 5;
    snprintf(out, len, "%.*s-%05d-of-%05d.gguf", (int)stem, dst, k + 1, n);
}

/* An --override-kv as gguf_set_val_* writes it: an int as u32 of its magnitude. */
struct qd_gguf_new_kv qd_gguf_kv_of_override(const struct qd_gguf_kv_override *k)
{
    switch (k->tag) {
    case QD_KVO_INT: return (struct qd_gguf_new_kv){k->key, QD_GGUF_U32, .i = (uint32_t)llabs(k->i)};
    case QD_KVO_FLOAT: return (struct qd_gguf_new_kv){k->key, QD_GGUF_F32, .f = k->f};
    case QD_KVO_BOOL: return (struct qd_gguf_new_kv){k->key, QD_GGUF_BOOL, .i = k->b};
    default: return (struct qd_gguf_new_kv){k->key, QD_GGUF_STRING, .s = k->s};
    }
}

/* Appends e, first removing an earlier extra of the same key (gguf_set_val_*). */
int qd_gguf_kv_append(struct qd_gguf_new_kv *extra, int n, struct qd_gguf_new_kv e)
{
    int k = 0;
    for (int i = 0; i < n; i++)
        if (strcmp(extra[i].key, e.key))
            extra[k++] = extra[i];
    extra[k++] = e;
    return k;
}

int qd_gguf_imatrix_load(const char *path, struct qd_imatrix *m, char *err, size_t errlen)
{
    struct qd_mapped f;
    char why[768];
    memset(m, 0, sizeof *m);
    if (qd_map_file(path, &f, why, sizeof why)) {
        snprintf(err, errlen, "--imatrix: %s", why);
        return -1;
    }
    int rc = qd_imatrix_parse(f.data, f.size, m, why, sizeof why);
    qd_unmap_file(&f);
    if (rc)
        snprintf(err, errlen, "--imatrix %s: %s", path, why);
    return rc;
}
