/* Back to float from transformers + bitsandbytes 4-bit (quant_method "bitsandbytes",
 * load_in_4bit): what hf_bnb.c writes and transformers' save_pretrained of a
 * BitsAndBytesConfig(load_in_4bit=True) model holds. Per weight <m>.weight (u8, two codes a
 * byte, the first in the high nibble, of the flattened weight), <m>.weight.absmax (f32 per block,
 * or with double quant u8 codes of the 256-entry <m>.weight.nested_quant_map times
 * <m>.weight.nested_absmax per 256 blocks, plus nested_offset), <m>.weight.quant_map and
 * <m>.weight.quant_state.bitsandbytes__<nf4|fp4> (JSON: quant_type, blocksize, dtype, shape,
 * nested_offset).
 *
 * The peer is bitsandbytes 0.50's dequantize_4bit on the CPU, as transformers' dequantize runs it
 * (dequantize_bnb_weight, then .to(dtype)): the nested absmax as dequantize_blockwise computes it
 * (map[code] * nested_absmax in f32, then + offset in f32); each element the code's value (its
 * built-in nf4 / fp4 table, not the file's quant_map) times its block's absmax in f32, rounded to
 * nearest even to the quant_state's dtype; then that value cast to the output dtype. */
#include <stdio.h>
#include <string.h>

#include "../../kernels/bnb4.h"
#include "checkpoint/hf_dequant.h"

static const float nf4_values[16] = QD_NF4_VALUES;
static const float fp4_type_values[16] = QD_FP4_TYPE_VALUES; /* over 12: bitsandbytes' fp4 table */

static const char *const quant_types[] = {"nf4", "fp4"};

/* the component tensors beside <m>.weight, dropped with it */
static const char *const parts[] = {"absmax", "quant_map", "nested_absmax", "nested_quant_map"};

static const cJSON *member(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }

/* the tensor named <w><suffix>, or NULL */
static const struct qd_st_entry *part(const struct qd_hf_shard *sh, const char *w, const char *suffix)
{
    char name[1024];
    if ((size_t)snprintf(name, sizeof name, "%s%s", w, suffix) >= sizeof name)
        return NULL;
    return qd_hf_tensor_named(sh, name);
}

static int is_f32(const struct qd_st_entry *e, int64_t n)
{
    return e && !strcmp(e->dtype, "F32") && (int64_t)(e->end - e->begin) == n * 4;
}

/* The absmax of block b: dequantize_blockwise of its u8 code, then + offset, each in f32 (double
 * quant), or the f32 absmax itself. */
static float absmax_of(const struct qd_hf_out *t, int64_t b)
{
    float a;
    if (t->nested[0]) {
        float nmax, v;
        memcpy(&nmax, t->nested[0]->data + (size_t)(b / 256) * 4, 4);
        memcpy(&v, t->nested[1]->data + (size_t)t->scale->data[b] * 4, 4);
        return v * nmax + t->offset;
    }
    memcpy(&a, t->scale->data + (size_t)b * 4, 4);
    return a;
}

/* rows [r0, r1) of the weight: its elements, flat, in blocks of blocksize */
static int dequant(const struct qd_hf_out *t, const void *in, void *out, int64_t r0, int64_t r1)
{
    const int64_t cols = t->shape[1];
    const enum qd_dtype odt = qd_hf_st_to_dtype(t->dtype);
    const int mid = t->mid == QD_BF16 ? 2 : t->mid == QD_F16 ? 1 : 0; /* qd_ct_round's code */
    const uint8_t *q = in;
    int64_t block = -1;
    float absmax = 0.0f;
    for (int64_t e = r0 * cols; e < r1 * cols; e++) {
        if (e / t->blocksize != block)
            absmax = absmax_of(t, block = e / t->blocksize);
        const uint8_t code = e & 1 ? q[e / 2] & 15 : q[e / 2] >> 4;
        const float value = t->nf4 ? nf4_values[code] : fp4_type_values[code] / 12.0f;
        float v = value * absmax;
        v = mid == 2 ? qd_bf16_to_f32(qd_f32_to_bf16(v)) : mid == 1 ? qd_f16_to_f32(qd_f32_to_f16(v)) : v;
        qd_hf_store(out, (size_t)e, v, odt);
    }
    return 0;
}

static int plan(const cJSON *q, const struct qd_hf_shard *sh, int i, struct qd_hf_out *out, char *err, size_t errlen)
{
    const struct qd_st_entry *t = &sh->st.t[i];
    for (size_t k = 0; k < sizeof parts / sizeof *parts; k++)
        if (qd_hf_ends_with(t->name, parts[k]))
            return 2;
    if (strstr(t->name, ".quant_state.bitsandbytes__"))
        return 2;
    if (!qd_hf_ends_with(t->name, "weight") || strcmp(t->dtype, "U8"))
        return 0; /* not quantized: norms, embeddings, the head, a skipped module */
    const struct qd_st_entry *js = NULL;
    int nf4 = 0;
    for (int k = 0; k < 2 && !js; k++) {
        char sfx[64];
        snprintf(sfx, sizeof sfx, ".quant_state.bitsandbytes__%s", quant_types[k]);
        if ((js = part(sh, t->name, sfx)))
            nf4 = k == 0;
    }
    if (!js) {
        snprintf(err, errlen, "convert: tensor '%.200s' (U8) has no quant_state.bitsandbytes__nf4 or __fp4 beside it "
                 "in its shard: quantd reads a bitsandbytes weight's quant state from the same .safetensors file",
                 t->name);
        return -1;
    }
    cJSON *st = cJSON_ParseWithLength((const char *)js->data, (size_t)(js->end - js->begin));
    const cJSON *shape = member(st, "shape"), *bs = member(st, "blocksize"), *off = member(st, "nested_offset");
    const char *dtype = cJSON_GetStringValue(member(st, "dtype")), *qt = cJSON_GetStringValue(member(st, "quant_type"));
    static const char *const dtypes[][2] = {{"bfloat16", "BF16"}, {"float16", "F16"}, {"float32", "F32"}};
    const char *mid = NULL;
    for (size_t k = 0; dtype && k < 3; k++)
        if (!strcmp(dtype, dtypes[k][0]))
            mid = dtypes[k][1];
    int64_t rows = 0, cols = 0;
    if (cJSON_GetArraySize(shape) == 2 && cJSON_IsNumber(cJSON_GetArrayItem(shape, 0)) &&
        cJSON_IsNumber(cJSON_GetArrayItem(shape, 1))) {
        rows = (int64_t)cJSON_GetArrayItem(shape, 0)->valuedouble;
        cols = (int64_t)cJSON_GetArrayItem(shape, 1)->valuedouble;
    }
    const int blocksize = cJSON_IsNumber(bs) ? bs->valueint : 0;
    int ok = mid && qt && !strcmp(qt, quant_types[!nf4]) && rows > 0 && cols > 0 && rows <= (1LL << 31) &&
             cols <= (1LL << 31) && blocksize >= 32 && blocksize <= 4096 && !(blocksize & (blocksize - 1)) &&
             (int64_t)(t->end - t->begin) == (rows * cols + 1) / 2 && (!off || cJSON_IsNumber(off));
    const int64_t nblocks = ok ? (rows * cols + blocksize - 1) / blocksize : 0;
    const struct qd_st_entry *absmax = part(sh, t->name, ".absmax");
    if (ok && off) { /* double quant: u8 codes, their f32 scale per 256, the 256-entry map */
        out->nested[0] = part(sh, t->name, ".nested_absmax");
        out->nested[1] = part(sh, t->name, ".nested_quant_map");
        const cJSON *nbs = member(st, "nested_blocksize");
        ok = absmax && !strcmp(absmax->dtype, "U8") && (int64_t)(absmax->end - absmax->begin) == nblocks &&
             cJSON_IsNumber(nbs) && nbs->valueint == 256 && is_f32(out->nested[0], (nblocks + 255) / 256) &&
             is_f32(out->nested[1], 256);
        out->offset = ok ? (float)off->valuedouble : 0.0f;
    } else if (ok)
        ok = is_f32(absmax, nblocks);
    cJSON_Delete(st);
    if (!ok) {
        snprintf(err, errlen, "convert: tensor '%.200s': back to float reads a bitsandbytes 4-bit weight with its "
                 "quant_state JSON (quant_type nf4/fp4, blocksize 32..4096, dtype bfloat16/float16/float32, its "
                 "2-D shape) and its absmax (F32, or U8 with nested_absmax and nested_quant_map) beside it in the "
                 "same file", t->name);
        return -1;
    }
    out->name = strdup(t->name);
    out->shape[0] = rows, out->shape[1] = cols;
    out->scale = absmax;
    out->blocksize = blocksize;
    out->nf4 = nf4;
    out->mid = qd_hf_st_to_dtype(mid);
    out->dequant = dequant;
    return out->name ? 1 : -1;
}

const struct qd_hf_dequant_family qd_hf_dequant_bnb = {.plan = plan};
