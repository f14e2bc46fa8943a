/* The compressed-tensors layouts: what llm-compressor 0.14.0.1's data-free `oneshot` with a
 * QuantizationModifier (targets Linear, ignore lm_head) then
 * `save_pretrained(save_compressed=True)` writes, for its W4A16, W4A16_ASYM, W8A16 (integer,
 * pack-quantized), NVFP4A16 (nvfp4-pack-quantized) and MXFP4A16 (mxfp4-pack-quantized) presets:
 * per Linear weight <m>.weight_packed, .weight_scale, (.weight_zero_point, .weight_global_scale,)
 * and for the integer ones .weight_shape (int64 [out, in]) instead of <m>.weight; config.json's
 * quantization_config as compressed-tensors 0.19.0 serializes it, the file written back with
 * json.dump (no final newline). */
#include <stdlib.h>
#include <string.h>

#include "../../kernels/cpu/cpu.h"
#include "../../kernels/mx.h"
#include "checkpoint/hf_layout.h"

/* The 4-bit float presets differ in data only. */
struct ct_float {
    const char *format, *scale_dtype, *strategy;
    const char *scales_st; /* the scales' safetensors dtype, or NULL: as quantd's component */
};
static const struct ct_float nvfp4 = {"nvfp4-pack-quantized", "torch.float8_e4m3fn", "tensor_group", "F8_E4M3"};
static const struct ct_float mxfp4 = {"mxfp4-pack-quantized", "torch.uint8", "group", NULL};


/* The members every compressed-tensors quantization_config ends with, after config_groups (the
 * keys in the order json.dump sorts them; q is returned) */
cJSON *qd_hf_ct_config_close(cJSON *q, const char *format, cJSON *ignore)
{
    cJSON_AddStringToObject(q, "format", format);
    cJSON_AddNullToObject(q, "global_compression_ratio");
    cJSON_AddItemToObject(q, "ignore", ignore);
    cJSON_AddNullToObject(q, "kv_cache_scheme");
    cJSON_AddStringToObject(q, "quant_method", "compressed-tensors");
    cJSON_AddStringToObject(q, "quantization_status", "compressed");
    cJSON_AddObjectToObject(q, "sparsity_config");
    cJSON_AddObjectToObject(q, "transform_config");
    cJSON_AddStringToObject(q, "version", "0.19.0"); /* the compressed-tensors whose layout this is */
    return q;
}

cJSON *qd_hf_ct_ignore(const struct qd_arch_rules *rules, const struct qd_hf_shard *sh, int nshards)
{
    size_t n = 0;
    for (int k = 0; k < nshards; k++)
        n += (size_t)sh[k].st.n;
    const char **names = malloc((n ? n : 1) * sizeof *names);
    if (!names)
        return NULL;
    n = 0;
    for (int k = 0; k < nshards; k++)
        for (int i = 0; i < sh[k].st.n; i++)
            names[n++] = sh[k].st.t[i].name;
    cJSON *list = qd_arch_ignore_list(rules, names, n);
    free(names);
    return list;
}

/* compressed-tensors' quantization_config for llm-compressor's W4A16 / W4A16_ASYM / W8A16 /
 * NVFP4A16 / MXFP4A16, as it serializes it (keys sorted as json.dumps(sort_keys=True) writes them) */
static cJSON *quantization_config(const struct qd_convert_opts *o, const struct ct_float *fp,
                                  const struct qd_arch_rules *rules, const struct qd_hf_shard *sh, int nshards)
{
    cJSON *ignore = qd_hf_ct_ignore(rules, sh, nshards);
    if (!ignore)
        return NULL;
    const char *format = fp ? fp->format : "pack-quantized";
    cJSON *q = cJSON_CreateObject(), *groups = cJSON_AddObjectToObject(q, "config_groups");
    cJSON *g = cJSON_AddObjectToObject(groups, "group_0");
    cJSON_AddStringToObject(g, "format", format);
    cJSON_AddNullToObject(g, "input_activations");
    cJSON_AddNullToObject(g, "output_activations");
    cJSON_AddItemToObject(g, "targets", cJSON_CreateStringArray((const char *[]){"Linear"}, 1));
    cJSON *w = cJSON_AddObjectToObject(g, "weights");
    cJSON_AddNullToObject(w, "actorder");
    cJSON_AddNullToObject(w, "block_structure");
    cJSON_AddBoolToObject(w, "dynamic", 0);
    cJSON_AddNumberToObject(w, "group_size", fp ? o->f->block_elems : o->params.group_size);
    cJSON_AddNumberToObject(w, "num_bits", fp ? 4 : o->f->code); /* ctint: 4 or 8, the format's bits */
    cJSON_AddStringToObject(w, "observer", "memoryless_minmax");
    cJSON_AddObjectToObject(w, "observer_kwargs");
    if (fp)
        cJSON_AddStringToObject(w, "scale_dtype", fp->scale_dtype);
    else
        cJSON_AddNullToObject(w, "scale_dtype");
    cJSON_AddStringToObject(w, "strategy", fp ? fp->strategy : "group");
    cJSON_AddBoolToObject(w, "symmetric", fp || o->params.symmetric);
    cJSON_AddStringToObject(w, "type", fp ? "float" : "int");
    if (fp || o->params.symmetric)
        cJSON_AddNullToObject(w, "zp_dtype");
    else
        cJSON_AddStringToObject(w, "zp_dtype", "torch.int8");
    return qd_hf_ct_config_close(q, format, ignore);
}

#define CONFIG_OF(preset, fn)                                                                                   \
    static cJSON *fn(const struct qd_convert_opts *o, const struct qd_arch_rules *rules,                        \
                     const struct qd_hf_shard *sh, int nshards, const char *compute_dtype)                      \
    {                                                                                                           \
        return quantization_config(o, preset, rules, sh, nshards);                                              \
    }
CONFIG_OF(NULL, int_config)
CONFIG_OF(&nvfp4, nvfp4_config)
CONFIG_OF(&mxfp4, mxfp4_config)

/* ---- integers (pack-quantized): quantd's component names, then weight_shape --------------- */

static int weight_shape(const struct qd_convert_opts *o, const struct qd_st_entry *t, const struct qd_params *p,
                        struct qd_hf_out *out)
{
    *out = (struct qd_hf_out){.name = qd_hf_module_name(t->name, "weight_shape"), .dtype = "I64", .ndim = 1,
                              .shape = {2, 1}, .bytes = 16};
    return 1;
}

static enum qd_status fill_weight_shape(const struct qd_convert_opts *o, const struct qd_st_entry *t,
                                        const struct qd_params *p, void *out, uint64_t bytes, char *err, size_t errlen)
{
    int64_t shape[2] = {t->shape[0], t->shape[1]}; /* the original [out, in] as int64 */
    memcpy(out, shape, sizeof shape);
    return QD_OK;
}

const struct qd_hf_layout_desc qd_hf_ct_int = {
    .tool = "compressed-tensors",
    .arch = QD_HF_CT,
    .component = qd_hf_module_component,
    .trailer = weight_shape,
    .fill_trailer = fill_weight_shape,
    .quantization_config = int_config,
};

/* ---- 4-bit floats: compressed-tensors' component names, no weight_shape -------------------- */

static void float_component(const struct ct_float *fp, const struct qd_st_entry *t, const struct qd_component *c,
                            struct qd_hf_out *out)
{
    static const struct {
        const char *quantd, *ct;
        int scales;
    } names[] = {{"data", "weight_packed", 0}, {"scales", "weight_scale", 1}, {"global_scale", "weight_global_scale", 0}};
    const char *name = c->name;
    int scales = 0;
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (!strcmp(c->name, names[i].quantd))
            name = names[i].ct, scales = names[i].scales;
    out->name = qd_hf_module_name(t->name, name);
    /* the scales' e4m3 bytes as torch.float8_e4m3fn saves them, where the preset says so */
    out->dtype = fp->scales_st && scales ? fp->scales_st : qd_hf_dtype_to_st(c->dtype);
    out->ndim = c->ndim;
    out->shape[0] = c->shape[0], out->shape[1] = c->shape[1];
}

static void nvfp4_component(const struct qd_convert_opts *o, const struct qd_st_entry *t,
                            const struct qd_component *c, int k, struct qd_hf_out *out)
{
    float_component(&nvfp4, t, c, out);
}

static void mxfp4_component(const struct qd_convert_opts *o, const struct qd_st_entry *t,
                            const struct qd_component *c, int k, struct qd_hf_out *out)
{
    float_component(&mxfp4, t, c, out);
}

/* llm-compressor's FUSED_LAYER_NAMES: Linear layers vLLM runs as one GEMM, which share one
 * NVFP4 global scale (observers/helpers.py, fuse_weight_observers). */
static const char *const fused_groups[][4] = {
    {"gate_proj", "up_proj"}, {"q_proj", "k_proj", "v_proj"}, {"q_a_proj", "kv_a_proj_with_mqa"}, {"w1", "w3"}};

/* The quantized weight "<parent><member>.weight" anywhere in the model, or NULL. */
static struct qd_hf_out *find_weight(struct qd_hf_shard *sh, int nshards, const char *parent, size_t plen,
                                     const char *member)
{
    size_t mlen = strlen(member);
    for (int k = 0; k < nshards; k++)
        for (int i = 0; i < sh[k].n; i++) {
            const char *n = sh[k].t[i].quantize ? sh[k].t[i].src->name : NULL;
            if (n && !strncmp(n, parent, plen) && !strncmp(n + plen, member, mlen) &&
                !strcmp(n + plen + mlen, ".weight"))
                return &sh[k].t[i];
        }
    return NULL;
}

/* max |x| of a weight into *amax, on all cores (through an aligned copy where the file
 * misaligns it); -1 without memory for that copy */
static int weight_amax(const struct qd_st_entry *e, float *amax)
{
    struct qd_tensor x = {.dtype = qd_hf_st_to_dtype(e->dtype)};
    int64_t shape[2] = {e->shape[0], e->shape[1]};
    qd_tensor_set_shape(&x, 2, shape);
    size_t n = e->end - e->begin;
    int misaligned = (uintptr_t)e->data % qd_dtype_size(x.dtype) != 0;
    void *copy = misaligned ? malloc(n) : NULL;
    if (misaligned && !copy)
        return -1;
    if (copy)
        memcpy(copy, e->data, n);
    x.data = copy ? copy : (void *)e->data;
    float lo, hi;
    qd_cpu_minmax(&x, amax, &lo, &hi);
    free(copy);
    qd_release_pages(e->data, n); /* the pre-pass must not leave the fused weights resident */
    return 0;
}

/* nvfp4: the global scale of every quantized weight in a fused group, generate_gparam of the
 * group's largest |x| (in the weight's dtype), when all of the group's names are quantized
 * beside it, as fuse_weight_observers requires; the others compute their own. One read of the
 * group members before the pass. */
static int nvfp4_global_scales(struct qd_hf_shard *sh, int nshards)
{
    for (int k = 0; k < nshards; k++)
        for (int i = 0; i < sh[k].n; i++) {
            struct qd_hf_out *t = &sh[k].t[i];
            if (!t->quantize)
                continue;
            const char *name = t->src->name, *end = name + strlen(name) - strlen(".weight"), *last = end;
            while (last > name && last[-1] != '.')
                last--;
            for (size_t g = 0; g < sizeof fused_groups / sizeof fused_groups[0]; g++) {
                int member = 0;
                for (int m = 0; m < 4 && fused_groups[g][m]; m++)
                    member |= (size_t)(end - last) == strlen(fused_groups[g][m]) &&
                              !strncmp(last, fused_groups[g][m], (size_t)(end - last));
                if (!member)
                    continue;
                float amax = 0.0f;
                int all = 1;
                for (int m = 0; all && m < 4 && fused_groups[g][m]; m++) {
                    struct qd_hf_out *w = find_weight(sh, nshards, name, (size_t)(last - name), fused_groups[g][m]);
                    if (!w) {
                        all = 0;
                        break;
                    }
                    if (!w->has_amax && weight_amax(w->src, &w->amax) < 0)
                        return -1;
                    w->has_amax = 1;
                    amax = w->amax > amax || w->amax != w->amax ? w->amax : amax;
                }
                if (all)
                    t->gs = qd_ct_nvfp4_global_scale(amax, qd_hf_st_to_dtype(t->src->dtype)), t->has_gs = 1;
                break;
            }
        }
    return 0;
}

/* The presets fix the arithmetic: llm-compressor's linear scales; NVFP4A16's two-level scales
 * with each module's global scale computed from its fused group (prepass), MXFP4A16's scale
 * exponents rounded to nearest even. */
static void nvfp4_prepare(struct qd_convert_opts *o)
{
    o->params.scale_layout = QD_LAYOUT_LINEAR;
    o->params.flow = QD_FLOW_COMPRESSED_TENSORS;
    o->params.two_level = 1;
    o->params.has_global_scale = o->params.has_per_tensor_scale = 0;
}

static void mxfp4_prepare(struct qd_convert_opts *o)
{
    o->params.scale_layout = QD_LAYOUT_LINEAR;
    o->params.scale_rounding = QD_ROUND_EVEN;
}

const struct qd_hf_layout_desc qd_hf_ct_nvfp4 = {
    .tool = "compressed-tensors",
    .arch = QD_HF_CT,
    .prepare = nvfp4_prepare,
    .component = nvfp4_component,
    .prepass = nvfp4_global_scales,
    .quantization_config = nvfp4_config,
};

const struct qd_hf_layout_desc qd_hf_ct_mxfp4 = {
    .tool = "compressed-tensors",
    .arch = QD_HF_CT,
    .prepare = mxfp4_prepare,
    .component = mxfp4_component,
    .quantization_config = mxfp4_config,
};
