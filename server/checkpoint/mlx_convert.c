/* A Hugging Face safetensors model in -> the directory `mlx_lm.convert --hf-path SRC --mlx-path DST
 * -q [--q-bits B --q-group-size G --q-mode M]` writes (mlx-lm 0.32.2, mlx 0.32.4), for the model
 * types of mlx_arch.c's table:
 * - mlx-lm loads the model class for config.json's model_type, whose sanitize drops or renames
 *   tensors (rotary inv_freq, a tied lm_head), stacks each MoE layer's experts into one 3-D
 *   SwitchLinear weight and splits DeepSeek-V3's kv_b_proj; the rules are data (mlx_arch.h), the
 *   plan they make is mlx_plan.c's.
 * - quantize_model quantizes every module with to_quantized (Linear, Embedding, SwitchLinear:
 *   here every float ".weight" of 2 or more dimensions, embeddings and the head included) whose
 *   last dimension the group size divides: <m>.weight (U32), <m>.scales, and for affine
 *   <m>.biases (the weight's dtype; the float modes' scales U8). The rest is copied.
 * - Before that, convert casts every float tensor to config.json's "torch_dtype" (float16,
 *   bfloat16 or float32) where it has one, then quantizes the cast weights.
 * - save writes model.safetensors (model-NNNNN-of-NNNNN.safetensors past 5 GiB) with
 *   __metadata__ {"format": "mlx"}, always model.safetensors.index.json (json.dump indent 4,
 *   metadata total_size and total_parameters), config.json (the source's, generation_config's
 *   eos_token_id, without _name_or_path and vision_config, quantization and quantization_config
 *   {"group_size", "bits", "mode"}; top-level keys sorted, indent 4, no final newline), the
 *   tokenizer, *.py, generation_config.json and a model card README.md.
 * Every tensor is read from the source's mapping by the process callback (stacked experts come
 * from several places, maybe several shards), so the pipeline's items carry no source range. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint/convert.h"
#include "checkpoint/hf_config.h"
#include "checkpoint/mlx_arch.h"
#include "checkpoint/mlx_plan.h"
#include "checkpoint/pipeline.h"
#include "checkpoint/safetensors.h"

/* mlx_lm.convert --q-mode and its (group_size, bits) per format */
static const struct mlx_mode {
    const char *fmt, *mode;
    int group_size, bits;
} mlx_modes[] = {
    {"mlx_affine", "affine", 0, 0}, {"mlx_mxfp4", "mxfp4", 32, 4}, {"mlx_nvfp4", "nvfp4", 16, 4},
    {"mlx_mxfp8", "mxfp8", 32, 8},
};

static const struct mlx_mode *mlx_mode_of(const char *fmt)
{
    for (size_t i = 0; i < sizeof mlx_modes / sizeof *mlx_modes; i++)
        if (!strcmp(mlx_modes[i].fmt, fmt))
            return &mlx_modes[i];
    return NULL;
}

static int ends_with(const char *s, const char *end)
{
    size_t n = strlen(s), m = strlen(end);
    return n >= m && !strcmp(s + n - m, end);
}

/* ---- writing ----------------------------------------------------------------------------------- */

#define MLX_SHARD_BYTES (5ull << 30) /* MAX_FILE_SIZE_GB */

struct mlx_job {
    const struct qd_convert_opts *o;
    struct qd_mlx_entry **items;  /* per pipeline item (0: the header) */
    void *scratch;         /* a stacked or cast weight, gathered */
    struct qd_convert_summary *s;
    int index, count;
    uint64_t in_total;
    double last, nmse;
};


static enum qd_status mlx_process(void *ctx, int lane, int item, const void *in, void *out, char *err, size_t errlen)
{
    (void)in;
    struct mlx_job *j = ctx;
    const struct qd_mlx_entry *e = j->items[item];
    const void *x = qd_mlx_gather(e, e->quantize ? j->scratch : out);
    enum qd_status st = QD_OK;
    if (!e->quantize) {
        if (x != out)
            memcpy(out, x, (size_t)e->bytes);
    } else {
        struct qd_convert_opts ot = *j->o;
        qd_convert_use_lane(&ot, lane);
        ot.f = e->f, ot.params = e->params;
        const int64_t cols = e->shape[e->ndim - 1];
        st = qd_convert_quantize(&ot, x, e->to, (int64_t)(e->in_bytes / qd_dtype_size(e->from)) / cols, cols, out,
                                 (int64_t)e->bytes, &j->nmse, NULL, err, errlen);
        if (st != QD_OK) {
            char msg[600];
            snprintf(msg, sizeof msg, "tensor '%s': %s", e->name, err);
            snprintf(err, errlen, "%s", msg);
        }
    }
    for (int k = 0; k < e->nparts && !(e->split == 1); k++) /* what was read stops counting as resident (a
                                                                 kv_b_proj after its second part) */
        qd_release_pages(e->parts[k].t->data, e->parts[k].t->end - e->parts[k].t->begin);
    return st;
}

static void mlx_handed(void *ctx, int item)
{
    struct mlx_job *j = ctx;
    if (item == 0)
        return;
    const struct qd_mlx_entry *e = j->items[item];
    struct qd_convert_summary *s = j->s;
    s->bytes_in += e->in_bytes;
    if (e->quantize) {
        s->quantized++;
        s->params_quantized += e->in_bytes / qd_dtype_size(e->from);
    } else if (e->from != e->to)
        s->cast++;
    else
        s->copied++;
    j->index++;
    const double now = qd_pipe_clock_s();
    if (j->o->progress) {
        struct qd_convert_event ev = {.index = j->index, .count = j->count, .name = e->name,
                                      .action = e->quantize ? QD_CONVERT_QUANTIZE : QD_CONVERT_COPY,
                                      .fmt = j->o->f->name, .rule = "table", .ndim = e->ndim < 4 ? e->ndim : 4,
                                      .ms = (now - j->last) * 1e3, .has_nmse = j->o->report_error && e->quantize,
                                      .nmse = j->nmse, .in_done = s->bytes_in, .in_total = j->in_total};
        for (int d = 0; d < ev.ndim; d++)
            ev.shape[d] = e->shape[d];
        j->o->progress(j->o->progress_ctx, &ev);
    }
    j->last = now;
}

/* "<m>.weight" -> "<m>.<component>" */
static char *component_name(const char *weight, const char *component)
{
    const size_t n = strlen(weight) - strlen("weight") + strlen(component) + 1;
    char *s = malloc(n);
    if (s)
        snprintf(s, n, "%.*s%s", (int)(strlen(weight) - strlen("weight")), weight, component);
    return s;
}

/* One output file: the entries of shard k. */
static int write_file(struct mlx_job *j, struct qd_mlx_plan *p, int k, int src_fd, const char *path,
                      struct qd_pipe_pool *pool, cJSON *wm, const char *file_name, enum qd_status *status, char *err,
                      size_t errlen)
{
    int n = 0, nt = 0, rc = -1;
    for (int i = 0; i < p->n; i++)
        if (p->e[i].shard == k)
            n++, nt += p->e[i].quantize ? p->e[i].nc : 1;
    struct qd_st_out *h = calloc((size_t)nt + 1, sizeof *h);
    char **names = calloc((size_t)nt + 1, sizeof *names);
    struct qd_pipe_item *items = calloc((size_t)n + 1, sizeof *items);
    struct qd_mlx_entry **of = calloc((size_t)n + 1, sizeof *of);
    uint8_t *header = NULL;
    struct qd_outfile out = {.fd = -1};
    if (!h || !names || !items || !of)
        goto nomem;
    int ni = 1, th = 0;
    for (int i = 0; i < p->n; i++) {
        struct qd_mlx_entry *e = &p->e[i];
        if (e->shard != k)
            continue;
        for (int c = 0; c < (e->quantize ? e->nc : 1); c++) {
            struct qd_st_out *t = &h[th];
            if (!e->quantize) {
                *t = (struct qd_st_out){.name = e->name, .dtype = e->st_dtype, .ndim = e->ndim, .bytes = e->bytes};
                memcpy(t->shape, e->shape, sizeof t->shape);
            } else { /* the weight's leading dimensions, then the component's last */
                const struct qd_component *q = &e->comps[c];
                if (!(names[th] = component_name(e->name, q->name)))
                    goto nomem;
                *t = (struct qd_st_out){.name = names[th], .dtype = qd_mlx_dtype_st(q->dtype), .ndim = e->ndim,
                                        .bytes = (uint64_t)q->bytes};
                memcpy(t->shape, e->shape, sizeof t->shape);
                t->shape[e->ndim - 1] = q->shape[1];
            }
            if (!cJSON_AddStringToObject(wm, t->name, file_name))
                goto nomem;
            th++;
        }
        of[ni] = e;
        items[ni++] = (struct qd_pipe_item){.kind = QD_PIPE_PROCESS, .out_bytes = e->bytes};
    }
    cJSON *meta = cJSON_CreateObject();
    if (!meta || !cJSON_AddStringToObject(meta, "format", "mlx")) {
        cJSON_Delete(meta);
        goto nomem;
    }
    size_t hlen;
    header = qd_st_header(h, nt, meta, &hlen);
    cJSON_Delete(meta);
    if (!header)
        goto nomem;
    items[0] = (struct qd_pipe_item){.kind = QD_PIPE_BYTES, .bytes = header, .out_bytes = hlen};
    if (qd_outfile_open(&out, path, err, errlen)) {
        *status = QD_EIO;
        goto done;
    }
    j->items = of;
    struct qd_pipe pipe = {.src_fd = src_fd, .out = &out, .items = items, .n = ni, .process = mlx_process,
                           .handed = mlx_handed, .ctx = j, .pool = pool, .cancel = j->o->cancel,
                           .stats = &j->s->stages, .lanes = 1};
    if (qd_pipe_run(&pipe, status, err, errlen))
        goto done;
    j->s->bytes_out += out.written;
    if (qd_outfile_commit(&out, err, errlen)) {
        *status = qd_status_of_write(errno);
        goto done;
    }
    rc = 0;
    goto done;
nomem:
    *status = QD_ENOMEM;
    snprintf(err, errlen, "no memory");
done:
    if (rc && out.fd >= 0)
        qd_outfile_abort(&out);
    for (int i = 0; names && i < nt; i++)
        free(names[i]);
    free(names), free(h), free(items), free(of), free(header);
    return rc;
}

static int write_text(const char *dir, const char *name, const char *text, char *err, size_t errlen)
{
    char p[4400];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    struct qd_outfile out;
    if (qd_outfile_open(&out, p, err, errlen))
        return -1;
    if (qd_outfile_write(&out, text, strlen(text), err, errlen) || qd_outfile_commit(&out, err, errlen)) {
        qd_outfile_abort(&out);
        return -1;
    }
    return 0;
}

static int copy_file(const char *from_dir, const char *to_dir, const char *name, char *err, size_t errlen)
{
    char from[4400], to[4400];
    snprintf(from, sizeof from, "%s/%s", from_dir, name);
    snprintf(to, sizeof to, "%s/%s", to_dir, name);
    return qd_copy_file(from, to, err, errlen);
}

/* Python's truth of a JSON value (generation_config's eos_token_id replaces the config's when
 * truthy: load_config) */
static int truthy(const cJSON *v)
{
    if (!v || cJSON_IsNull(v) || cJSON_IsFalse(v))
        return 0;
    if (cJSON_IsRaw(v))
        return strtod(v->valuestring, NULL) != 0.0;
    if (cJSON_IsString(v))
        return v->valuestring[0] != 0;
    if (cJSON_IsArray(v) || cJSON_IsObject(v))
        return cJSON_GetArraySize(v) > 0;
    return 1;
}

/* A module's place in the model's tree, as nn.quantize visits it: by layer number, then name. */
static long layer_of(const char *name)
{
    const char *l = strstr(name, "layers.");
    return l ? strtol(l + strlen("layers."), NULL, 10) : -1;
}

static int cmp_module(const void *a, const void *b)
{
    const struct qd_mlx_entry *x = *(const struct qd_mlx_entry *const *)a, *y = *(const struct qd_mlx_entry *const *)b;
    long lx = layer_of(x->name), ly = layer_of(y->name);
    return lx != ly ? (lx < ly ? -1 : 1) : strcmp(x->name, y->name);
}

/* config.json as save_config writes it; the modules with their own params follow the run's
 * {"group_size", "bits", "mode"} in quantization, each as the class's predicate returned them. */
static char *mlx_config_text(const char *src, cJSON *config, const struct mlx_mode *mm, const struct qd_params *p,
                             const struct qd_mlx_plan *plan)
{
    char e2[256];
    cJSON *gen = qd_mlx_read_json(src, "generation_config.json", e2, sizeof e2);
    cJSON *eos = cJSON_GetObjectItemCaseSensitive(gen, "eos_token_id");
    if (truthy(eos)) {
        cJSON_DeleteItemFromObjectCaseSensitive(config, "eos_token_id");
        cJSON_AddItemToObject(config, "eos_token_id", cJSON_Duplicate(eos, 1));
    }
    cJSON_Delete(gen);
    cJSON_DeleteItemFromObjectCaseSensitive(config, "_name_or_path");
    cJSON_DeleteItemFromObjectCaseSensitive(config, "vision_config");
    cJSON_DeleteItemFromObjectCaseSensitive(config, "quantization");
    cJSON_DeleteItemFromObjectCaseSensitive(config, "quantization_config");
    for (int k = 0; k < 2; k++) { /* {"group_size", "bits", "mode"}, in that order */
        cJSON *q = cJSON_AddObjectToObject(config, k ? "quantization_config" : "quantization");
        if (!q)
            return NULL;
        cJSON_AddNumberToObject(q, "group_size", mm->group_size ? mm->group_size : p->group_size);
        cJSON_AddNumberToObject(q, "bits", mm->bits ? mm->bits : p->bits);
        cJSON_AddStringToObject(q, "mode", mm->mode);
        const struct qd_mlx_entry **own = malloc((size_t)(plan->n ? plan->n : 1) * sizeof *own);
        int nown = 0;
        if (!own)
            return NULL;
        for (int i = 0; i < plan->n; i++)
            if (plan->e[i].quantize && plan->e[i].own)
                own[nown++] = &plan->e[i];
        qsort(own, (size_t)nown, sizeof *own, cmp_module);
        for (int i = 0; i < nown; i++) {
            char module[512];
            snprintf(module, sizeof module, "%.*s", (int)(strlen(own[i]->name) - strlen(".weight")), own[i]->name);
            cJSON *m = cJSON_AddObjectToObject(q, module);
            cJSON_AddNumberToObject(m, "group_size", own[i]->params.group_size);
            cJSON_AddNumberToObject(m, "bits", own[i]->params.bits);
        }
        free(own);
    }
    return qd_json_py_text_styled(config, 4, 1);
}

/* A config number (qd_json_py_read keeps numbers as their text), or 0 */
static int64_t raw_int(const cJSON *v)
{
    return cJSON_IsRaw(v) ? (int64_t)strtod(v->valuestring, NULL) : cJSON_IsNumber(v) ? (int64_t)v->valuedouble : 0;
}

static const char model_card[] = "---\nlanguage: en\nlibrary_name: mlx\npipeline_tag: text-generation\ntags:\n- mlx\n---\n";

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }
static int cmp_item(const void *a, const void *b)
{
    return strcmp((*(const cJSON *const *)a)->string, (*(const cJSON *const *)b)->string);
}

int qd_convert_mlx(const struct qd_convert_opts *o, struct qd_convert_summary *s, enum qd_status *status, char *err,
                   size_t errlen)
{
    const double t0 = qd_pipe_clock_s();
    const struct mlx_mode *mm = mlx_mode_of(o->f->name);
    struct qd_convert_opts run = *o;
    struct qd_mlx_source *src = NULL;
    int nsrc = 0, rc = -1;
    char **files = NULL;
    struct qd_mlx_plan plan = {0};
    cJSON *config = NULL, *index = NULL, *wm = NULL;
    struct qd_outdir od = {0};
    struct qd_pipe_pool *pool = NULL;
    void *scratch = NULL;
    struct qd_name_filter *own_nf = o->filter ? NULL : qd_name_filter_new(o->skip, o->only, err, errlen);
    const struct qd_name_filter *nf = o->filter ? o->filter : own_nf;
    *status = QD_EINVAL;
    if (!nf)
        goto done;
    if (qd_convert_mlx_check(o->src, qd_convert_input_kind(o->src), err, errlen))
        goto done;
    if (!mm || (mm->group_size && run.params.has_global_scale) || run.params.scale_dtype != QD_SCALE_AUTO) {
        snprintf(err, errlen, "%s: mlx_lm.convert writes no global_scale and keeps affine scales in the weight's "
                 "dtype (scale_dtype=auto)", o->f->name);
        goto done;
    }
    if (mm->group_size) /* the float modes' geometry is fixed */
        run.params.group_size = mm->group_size;
    if (!(config = qd_mlx_read_json(o->src, "config.json", err, errlen)))
        goto done;
    const char *mt = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(config, "model_type"));
    const struct qd_mlx_arch *a = qd_mlx_arch_find(mt);
    snprintf(s->arch, sizeof s->arch, "%s", mt);
    s->rule = "table";
    const int tied = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(config, "tie_word_embeddings"));
    /* convert's dtype: config's torch_dtype, else text_config's dtype; every float cast to it */
    const cJSON *td = cJSON_GetObjectItemCaseSensitive(config, "torch_dtype");
    if (!td || cJSON_IsNull(td))
        td = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(config, "text_config"), "dtype");
    const char *dt = cJSON_GetStringValue(td);
    const int has_cast = dt && (!strcmp(dt, "float16") || !strcmp(dt, "bfloat16") || !strcmp(dt, "float32"));
    const enum qd_dtype cast_to = !has_cast ? QD_F32 : !strcmp(dt, "float16") ? QD_F16 : !strcmp(dt, "bfloat16") ? QD_BF16 : QD_F32;
    /* the weight files: load_model reads every model*.safetensors of the directory */
    DIR *d = opendir(o->src);
    struct dirent *de;
    int cap = 0;
    while (d && (de = readdir(d)))
        if (!strncmp(de->d_name, "model", 5) && ends_with(de->d_name, ".safetensors")) {
            if (nsrc == cap) {
                cap = cap ? cap * 2 : 8;
                char **nfiles = realloc(files, (size_t)cap * sizeof *files);
                if (!nfiles)
                    break;
                files = nfiles;
            }
            if (!(files[nsrc] = strdup(de->d_name)))
                break;
            nsrc++;
        }
    if (d)
        closedir(d);
    if (!nsrc) {
        snprintf(err, errlen, "%s: no model*.safetensors weights (mlx-lm loads those)", o->src);
        *status = QD_ENOTFOUND;
        goto done;
    }
    qsort(files, (size_t)nsrc, sizeof *files, cmp_str);
    if (!(src = calloc((size_t)nsrc, sizeof *src)))
        goto nomem;
    uint64_t in_total = 0;
    for (int k = 0; k < nsrc; k++) {
        const size_t n = strlen(o->src) + strlen(files[k]) + 2;
        if (!(src[k].path = malloc(n)))
            goto nomem;
        snprintf(src[k].path, n, "%s/%s", o->src, files[k]);
        if (qd_map_file(src[k].path, &src[k].m, err, errlen)) {
            *status = QD_ENOTFOUND;
            goto done;
        }
        if (qd_st_parse(src[k].m.data, src[k].m.size, o->max_header_bytes, src[k].path, &src[k].st, err, errlen))
            goto done;
        for (int i = 0; i < src[k].st.n; i++) {
            const struct qd_st_entry *t = &src[k].st.t[i];
            s->params_total += (t->end - t->begin) * 8 / (uint64_t)t->elem_bits;
        }
    }
    int64_t mla[4] = {0};
    static const char *const mla_keys[] = {"num_attention_heads", "qk_nope_head_dim", "v_head_dim", "kv_lora_rank"};
    for (int k = 0; a->mla_split && k < 4; k++)
        mla[k] = raw_int(cJSON_GetObjectItemCaseSensitive(config, mla_keys[k]));
    if (qd_mlx_plan_model(&run, a, tied, has_cast, cast_to, mla, src, nsrc, nf, &plan, err, errlen))
        goto done;
    /* shards: make_shards' rule (a new file where the next tensor would pass 5 GiB) over the
     * entries in name order */
    uint64_t in_cap = 1, out_cap = 1, scratch_cap = 0, fill = 0, total_size = 0, total_params = 0;
    int nshards = 0;
    for (int i = 0; i < plan.n; i++) {
        struct qd_mlx_entry *e = &plan.e[i];
        if (!nshards || fill + e->bytes > MLX_SHARD_BYTES)
            nshards++, fill = 0;
        e->shard = nshards - 1;
        fill += e->bytes;
        total_size += e->bytes;
        in_total += e->in_bytes;
        total_params += e->is_float ? e->in_bytes / qd_dtype_size(e->from) : e->in_bytes * 8 / (uint64_t)e->parts[0].t->elem_bits;
        out_cap = e->bytes > out_cap ? e->bytes : out_cap;
        if (e->quantize && (e->nparts > 1 || e->from != e->to || e->split)) {
            const uint64_t nb = e->in_bytes / qd_dtype_size(e->from) * qd_dtype_size(e->to);
            scratch_cap = nb > scratch_cap ? nb : scratch_cap;
        }
    }
    pool = qd_pipe_pool_new(o->backend, in_cap, out_cap, 1);
    if (!pool || qd_pipe_pool_modes(pool, 0, 1) || (scratch_cap && !(scratch = malloc(scratch_cap))))
        goto nomem;
    if (qd_outdir_open(&od, o->dst, err, errlen)) {
        *status = QD_EIO;
        goto done;
    }
    index = cJSON_CreateObject();
    cJSON *md = cJSON_AddObjectToObject(index, "metadata");
    cJSON_AddNumberToObject(md, "total_size", (double)total_size);
    cJSON_AddNumberToObject(md, "total_parameters", (double)total_params);
    wm = cJSON_CreateObject();
    struct mlx_job job = {.o = &run, .scratch = scratch, .s = s, .count = plan.n, .in_total = in_total,
                          .last = qd_pipe_clock_s()};
    int fd = qd_open_input(src[0].path, err, errlen);
    if (fd < 0) {
        *status = QD_EIO;
        goto fail_dir;
    }
    for (int k = 0; k < nshards; k++) {
        char name[64], path[4400];
        if (nshards == 1)
            snprintf(name, sizeof name, "model.safetensors");
        else
            snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", k + 1, nshards);
        snprintf(path, sizeof path, "%s/%s", od.tmp, name);
        if (write_file(&job, &plan, k, fd, path, pool, wm, name, status, err, errlen)) {
            close(fd);
            goto fail_dir;
        }
    }
    close(fd);
    /* the index: weight_map sorted by name (save_model), json.dump(indent=4) */
    int nw = cJSON_GetArraySize(wm);
    const cJSON **sorted = malloc((size_t)(nw ? nw : 1) * sizeof *sorted);
    if (!sorted)
        goto nomem_dir;
    int at = 0;
    for (const cJSON *c = wm->child; c; c = c->next)
        sorted[at++] = c;
    cJSON *wms = cJSON_AddObjectToObject(index, "weight_map");
    qsort(sorted, (size_t)nw, sizeof *sorted, cmp_item);
    for (int i = 0; wms && i < nw; i++)
        cJSON_AddStringToObject(wms, sorted[i]->string, sorted[i]->valuestring);
    free(sorted);
    char *itext = qd_json_py_text_styled(index, 4, 0);
    char *ctext = mlx_config_text(o->src, config, mm, &run.params, &plan);
    int r = itext && ctext ? 0 : -1;
    if (r)
        snprintf(err, errlen, "no memory for config.json");
    r = r || write_text(od.tmp, "model.safetensors.index.json", itext, err, errlen) ||
        write_text(od.tmp, "config.json", ctext, err, errlen) || write_text(od.tmp, "README.md", model_card, err, errlen);
    free(itext), free(ctext);
    if (r)
        goto fail_dir;
    d = opendir(o->src);
    while (d && (de = readdir(d)))
        if (qd_mlx_copied_file(o->src, de->d_name) &&
            copy_file(o->src, od.tmp, de->d_name, err, errlen)) {
            closedir(d);
            goto fail_dir;
        }
    if (d)
        closedir(d);
    if (qd_outdir_commit(&od, err, errlen)) {
        *status = QD_EIO;
        goto done;
    }
    rc = 0;
    goto done;
nomem_dir:
    snprintf(err, errlen, "no memory");
    *status = QD_ENOMEM;
fail_dir:
    if (*status == QD_EINVAL)
        *status = QD_EIO;
    qd_outdir_abort(&od);
    goto done;
nomem:
    snprintf(err, errlen, "no memory for the conversion's buffers");
    *status = QD_ENOMEM;
done:
    if (rc == 0)
        *status = QD_OK;
    s->seconds = qd_pipe_clock_s() - t0;
    qd_pipe_pool_free(pool);
    free(scratch);
    qd_mlx_plan_free(&plan);
    for (int k = 0; src && k < nsrc; k++) {
        qd_st_free(&src[k].st);
        qd_unmap_file(&src[k].m);
        free(src[k].path);
    }
    for (int k = 0; files && k < nsrc; k++)
        free(files[k]);
    free(files);
    free(src);
    cJSON_Delete(config);
    cJSON_Delete(index);
    cJSON_Delete(wm);
    qd_name_filter_free(own_nf);
    return rc;
}
