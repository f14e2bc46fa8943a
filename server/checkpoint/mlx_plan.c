/* The plan of an MLX conversion and the reading of each entry's source (mlx_plan.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/fp.h"
#include "checkpoint/mlx_plan.h"

static int ends_with(const char *s, const char *end)
{
    size_t n = strlen(s), m = strlen(end);
    return n >= m && !strcmp(s + n - m, end);
}




static enum qd_dtype st_float(const char *dt, int *is_float)
{
    *is_float = !strcmp(dt, "F32") || !strcmp(dt, "F16") || !strcmp(dt, "BF16");
    return !strcmp(dt, "F32") ? QD_F32 : !strcmp(dt, "F16") ? QD_F16 : QD_BF16;
}

const char *qd_mlx_dtype_st(enum qd_dtype d)
{
    return d == QD_F32 ? "F32" : d == QD_F16 ? "F16" : d == QD_BF16 ? "BF16" : d == QD_U8 ? "U8" : "U32";
}

static int cmp_entry(const void *a, const void *b) { return strcmp(((const struct qd_mlx_entry *)a)->name, ((const struct qd_mlx_entry *)b)->name); }

/* If name is expert E of a stacked weight, its stacked name (malloc'd) and E; else NULL. */
static char *stacked_name(const struct qd_mlx_stack *s, const char *name, long *expert)
{
    if (!s->moe)
        return NULL;
    char key[64];
    snprintf(key, sizeof key, "%sexperts.", s->moe);
    const char *at = strstr(name, key);
    if (!at)
        return NULL;
    char *end;
    const char *num = at + strlen(key);
    *expert = strtol(num, &end, 10);
    if (end == num || *end != '.')
        return NULL;
    for (int k = 0; s->names[k][0]; k++) {
        size_t fl = strlen(s->names[k][0]);
        if (!strncmp(end + 1, s->names[k][0], fl) && !strcmp(end + 1 + fl, ".weight")) {
            size_t n = (size_t)(at - name) + strlen(s->moe) + strlen("switch_mlp.") + strlen(s->names[k][1]) +
                       strlen(".weight") + 1;
            char *out = malloc(n);
            if (out)
                snprintf(out, n, "%.*s%sswitch_mlp.%s.weight", (int)(at - name), name, s->moe, s->names[k][1]);
            return out;
        }
    }
    return NULL;
}


static struct qd_mlx_entry *plan_add(struct qd_mlx_plan *p)
{
    if (p->n == p->cap) {
        int nc = p->cap ? p->cap * 2 : 64;
        struct qd_mlx_entry *e = realloc(p->e, (size_t)nc * sizeof *e);
        if (!e)
            return NULL;
        p->e = e, p->cap = nc;
    }
    memset(&p->e[p->n], 0, sizeof *p->e);
    return &p->e[p->n++];
}

static struct qd_mlx_entry *plan_find(struct qd_mlx_plan *p, const char *name)
{
    for (int i = 0; i < p->n; i++)
        if (!strcmp(p->e[i].name, name))
            return &p->e[i];
    return NULL;
}

/* DeepSeek-V3's kv_b_proj t as its two MultiLinear weights (mla: heads, nope, v, rank from the
 * config). */
static int plan_mla(struct qd_mlx_plan *p, const int64_t mla[4], const struct qd_st_entry *t, char *err, size_t errlen)
{
    if (t->ndim != 2 || mla[0] < 1 || mla[1] < 1 || mla[2] < 1 || t->shape[0] != mla[0] * (mla[1] + mla[2]) ||
        t->shape[1] != mla[3]) {
        snprintf(err, errlen, "'%s': shape is not [num_attention_heads * (qk_nope_head_dim + v_head_dim), "
                 "kv_lora_rank] of config.json", t->name);
        return -1;
    }
    static const char *const names[] = {"embed_q.weight", "unembed_out.weight"};
    for (int k = 0; k < 2; k++) {
        struct qd_mlx_entry *e = plan_add(p);
        if (!e || !(e->parts = calloc(1, sizeof *e->parts)) ||
            !(e->name = malloc(strlen(t->name) + strlen(names[k]) + 1)))
            goto nomem;
        snprintf(e->name, strlen(t->name) + strlen(names[k]) + 1, "%.*s%s",
                 (int)(strlen(t->name) - strlen("kv_b_proj.weight")), t->name, names[k]);
        e->parts[0].t = t, e->nparts = 1, e->split = k + 1;
        e->heads = mla[0], e->nope = mla[1], e->vdim = mla[2], e->rank = mla[3];
    }
    return 0;
nomem:
    snprintf(err, errlen, "no memory for the plan");
    return -1;
}

/* The entries of the model, from its headers: dropped, stacked, cast and quantized as mlx-lm's
 * load, convert and quantize_model do. */
int qd_mlx_plan_model(const struct qd_convert_opts *o, const struct qd_mlx_arch *a, int tied, int has_cast,
                      enum qd_dtype cast_to, const int64_t mla[4], struct qd_mlx_source *src, int nsrc,
                      const struct qd_name_filter *nf, struct qd_mlx_plan *p, char *err, size_t errlen)
{
    const int group = o->params.group_size;
    for (int k = 0; k < nsrc; k++)
        for (int i = 0; i < src[k].st.n; i++) {
            const struct qd_st_entry *t = &src[k].st.t[i];
            int dropped = (tied && a->tied_drops_head && !strcmp(t->name, "lm_head.weight")) ||
                          (a->drop_prefix && !strncmp(t->name, a->drop_prefix, strlen(a->drop_prefix)));
            for (int d = 0; a->drop && a->drop[d]; d++)
                dropped |= strstr(t->name, a->drop[d]) != NULL;
            if (dropped)
                continue;
            if (a->mla_split && ends_with(t->name, "self_attn.kv_b_proj.weight")) {
                if (plan_mla(p, mla, t, err, errlen))
                    return -1;
                continue;
            }
            long expert = 0;
            char *stacked = stacked_name(&a->stack, t->name, &expert);
            struct qd_mlx_entry *e = stacked ? plan_find(p, stacked) : NULL;
            if (e) {
                free(stacked);
            } else {
                if (!(e = plan_add(p))) {
                    free(stacked);
                    goto nomem;
                }
                e->name = stacked ? stacked : strdup(t->name);
                if (!e->name)
                    goto nomem;
            }
            if (expert >= 0 && expert >= e->nparts) {
                struct qd_mlx_part *np = realloc(e->parts, (size_t)(expert + 1) * sizeof *np);
                if (!np)
                    goto nomem;
                memset(np + e->nparts, 0, (size_t)(expert + 1 - e->nparts) * sizeof *np);
                e->parts = np, e->nparts = (int)expert + 1;
            }
            if (expert < 0 || e->parts[expert].t) {
                snprintf(err, errlen, "tensor '%s': expert %ld twice", t->name, expert);
                return -1;
            }
            e->parts[expert].t = t;
        }
    for (int i = 0; i < p->n; i++) {
        struct qd_mlx_entry *e = &p->e[i];
        const struct qd_st_entry *t0 = e->parts[0].t;
        for (int x = 0; x < e->nparts; x++) { /* the experts of one weight: all there, alike */
            const struct qd_st_entry *t = e->parts[x].t;
            if (!t || !t0 || strcmp(t->dtype, t0->dtype) || t->ndim != t0->ndim ||
                memcmp(t->shape, t0->shape, sizeof t->shape)) {
                snprintf(err, errlen, "'%s': the experts to stack (0..%d) are not all there with one dtype and "
                         "shape (expert %d)", e->name, e->nparts - 1, x);
                return -1;
            }
        }
        const int stacked = e->nparts > 1 || strstr(e->name, "switch_mlp.");
        e->ndim = t0->ndim + stacked;
        if (e->ndim > QD_ST_MAX_DIMS) {
            snprintf(err, errlen, "'%s': too many dimensions", e->name);
            return -1;
        }
        e->shape[0] = e->nparts;
        memcpy(e->shape + stacked, t0->shape, (size_t)t0->ndim * sizeof *e->shape);
        e->in_bytes = (t0->end - t0->begin) * (uint64_t)e->nparts;
        if (e->split) { /* [heads, rank, nope] or [heads, v, rank] */
            const int64_t rows = e->split == 1 ? e->nope : e->vdim;
            e->ndim = 3, e->shape[0] = e->heads;
            e->shape[1] = e->split == 1 ? e->rank : rows, e->shape[2] = e->split == 1 ? rows : e->rank;
            e->in_bytes = (uint64_t)(e->heads * rows * e->rank) * (uint64_t)t0->elem_bits / 8;
        }
        e->from = st_float(t0->dtype, &e->is_float);
        e->to = e->is_float && has_cast && !(a->no_cast && strstr(e->name, a->no_cast)) ? cast_to : e->from;
        e->st_dtype = e->is_float ? qd_mlx_dtype_st(e->to) : t0->dtype;
        const uint64_t elems = e->in_bytes * 8 / (uint64_t)t0->elem_bits;
        e->bytes = e->is_float ? elems * qd_dtype_size(e->to) : e->in_bytes;
        const int64_t cols = e->shape[e->ndim - 1];
        e->quantize = e->is_float && e->ndim >= 2 && ends_with(e->name, ".weight") && cols % group == 0 &&
                      qd_name_filter_keeps(nf, e->name);
        for (int k = 0; a->keep && a->keep[k]; k++)
            e->quantize &= !ends_with(e->name, a->keep[k]);
        for (int x = 0; e->quantize && x < e->nparts; x++) /* --skip / --only by the source's names too */
            e->quantize = qd_name_filter_keeps(nf, e->parts[x].t->name);
        if (!e->quantize)
            continue;
        e->f = o->f, e->params = o->params;
        const size_t module_len = strlen(e->name) - strlen(".weight");
        if (a->own.suffix && module_len >= strlen(a->own.suffix) &&
            !strncmp(e->name + module_len - strlen(a->own.suffix), a->own.suffix, strlen(a->own.suffix))) {
            e->own = 1, e->f = qd_format_find("mlx_affine");
            qd_params_default(e->f, &e->params);
            e->params.bits = a->own.bits, e->params.group_size = a->own.group_size;
        }
        struct qd_tensor in = {.dtype = e->to};
        int64_t shape[2] = {(int64_t)(elems / (uint64_t)cols), cols};
        qd_tensor_set_shape(&in, 2, shape);
        struct qd_params prm = e->params;
        if ((e->nc = qd_format_layout(e->f, &prm, &in, e->comps, err, errlen)) < 0) {
            char msg[512];
            snprintf(msg, sizeof msg, "'%s': %s", e->name, err);
            snprintf(err, errlen, "%s", msg);
            return -1;
        }
        e->bytes = 0;
        for (int c = 0; c < e->nc; c++)
            e->bytes += (uint64_t)e->comps[c].bytes;
    }
    qsort(p->e, (size_t)p->n, sizeof *p->e, cmp_entry);
    return 0;
nomem:
    snprintf(err, errlen, "no memory for the plan");
    return -1;
}

static float load_f32(enum qd_dtype d, const uint8_t *p, uint64_t k)
{
    uint16_t h;
    float x;
    if (d == QD_F32) {
        memcpy(&x, p + k * 4, 4);
        return x;
    }
    memcpy(&h, p + k * 2, 2);
    return d == QD_F16 ? qd_f16_to_f32(h) : qd_bf16_to_f32(h);
}

/* The source of e as one buffer of its written dtype: the mapping itself where that is it, else
 * its parts concatenated (and cast: mlx's astype, round to nearest even) into dst. */
static void store(enum qd_dtype d, uint8_t *p, uint64_t k, float v)
{
    if (d == QD_F32) {
        memcpy(p + k * 4, &v, 4);
        return;
    }
    const uint16_t h = d == QD_F16 ? qd_f32_to_f16(v) : qd_f32_to_bf16(v);
    memcpy(p + k * 2, &h, 2);
}

/* MLA: embed_q[h][r][n] = W[h * (nope + v) + n][r], unembed_out[h][j][r] = W[h * (nope + v) + nope + j][r]
 * (a float's bits pass through f32 unchanged, so copies stay exact) */
static void gather_mla(const struct qd_mlx_entry *e, uint8_t *o)
{
    const uint8_t *w = e->parts[0].t->data;
    const int64_t hd = e->nope + e->vdim;
    uint64_t k = 0;
    for (int64_t h = 0; h < e->heads; h++)
        if (e->split == 1)
            for (int64_t r = 0; r < e->rank; r++)
                for (int64_t n = 0; n < e->nope; n++)
                    store(e->to, o, k++, load_f32(e->from, w, (uint64_t)((h * hd + n) * e->rank + r)));
        else
            for (int64_t j = 0; j < e->vdim; j++)
                for (int64_t r = 0; r < e->rank; r++)
                    store(e->to, o, k++, load_f32(e->from, w, (uint64_t)((h * hd + e->nope + j) * e->rank + r)));
}

const void *qd_mlx_gather(const struct qd_mlx_entry *e, void *dst)
{
    if (e->split) {
        gather_mla(e, dst);
        return dst;
    }
    if (e->nparts == 1 && e->from == e->to)
        return e->parts[0].t->data;
    uint8_t *o = dst;
    for (int x = 0; x < e->nparts; x++) {
        const struct qd_st_entry *t = e->parts[x].t;
        const uint64_t nb = t->end - t->begin;
        if (!e->is_float || e->from == e->to) {
            memcpy(o, t->data, nb);
            o += nb;
            continue;
        }
        const uint64_t n = nb / qd_dtype_size(e->from);
        for (uint64_t k = 0; k < n; k++) {
            const float v = load_f32(e->from, t->data, k);
            if (e->to == QD_F32)
                memcpy(o + k * 4, &v, 4);
            else {
                const uint16_t h = e->to == QD_F16 ? qd_f32_to_f16(v) : qd_f32_to_bf16(v);
                memcpy(o + k * 2, &h, 2);
            }
        }
        o += n * qd_dtype_size(e->to);
    }
    return dst;
}

void qd_mlx_plan_free(struct qd_mlx_plan *p)
{
    for (int i = 0; i < p->n; i++)
        free(p->e[i].name), free(p->e[i].parts);
    free(p->e);
    p->e = NULL, p->n = p->cap = 0;
}
