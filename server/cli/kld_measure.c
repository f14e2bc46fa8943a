/* quantd convert --kld TEXT: the converted model's KL divergence from its source over a text, as
 * `quantd perplexity --kl-divergence-base` on the source and then `--kl-divergence` on the output
 * compute it (llama-perplexity's statistics, server/model/kld.h), without their printed lines.
 *
 * The source's log-probabilities go through the base logits file itself, written to a temporary:
 * a row is n_vocab uint16 (llama-perplexity's encoding), so a 150k vocabulary over 100 chunks of
 * 512 tokens is 7.7 GB, more than memory should hold, and one chunk of rows at a time is read
 * back while the output runs. The two passes are those commands' own run (model/perplexity_run.h),
 * so the figures are theirs by hand, bit for bit. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "model/engine.h"
#include "model/model_input.h"
#include "model/perplexity_run.h"

int qd_cli_kld_prepare(const char *prog, struct qd_cli_kld *k)
{
    char err[1024];
    struct stat st;
    if (!stat(k->source, &st) && S_ISDIR(st.st_mode)) {
        fprintf(stderr, "%s: --kld runs the model, and the engine runs GGUF files: %s is a directory (a Hugging Face "
                "model); convert a GGUF (or leave --kld out)\n", prog, k->source);
        return 2;
    }
    struct qd_model m;
    enum qd_status status;
    memset(&m, 0, sizeof m);
    if (qd_model_open(k->source, &m, &status, err, sizeof err)) {
        fprintf(stderr, "%s: --kld: the engine cannot run %s: %s\n", prog, k->source, err);
        qd_model_close(&m);
        return 1;
    }
    qd_model_close(&m);
    int64_t n = 0;
    if (!(k->tokens = qd_model_input_tokens(k->source, k->text, NULL, &n, err, sizeof err))) {
        fprintf(stderr, "%s: --kld: %s\n", prog, err);
        return 1;
    }
    /* quantd perplexity's (and llama-perplexity's) rule: two chunks' worth of tokens */
    if (n < 2 * (int64_t)k->n_ctx) {
        fprintf(stderr, "%s: --kld %s: the text gives %" PRId64 " tokens, and a KL divergence over chunks of %d "
                "tokens needs at least %d (as quantd perplexity does): give a longer text or a smaller --kld-ctx\n",
                prog, k->text, n, k->n_ctx, 2 * k->n_ctx);
        return 1;
    }
    const int64_t fit = n / k->n_ctx;
    k->n_chunks = k->max_chunks < 0 || k->max_chunks > fit ? (int)fit : k->max_chunks;
    return 0;
}

void qd_cli_kld_free(struct qd_cli_kld *k)
{
    free(k->tokens);
    k->tokens = NULL;
}

/* One of the two commands (model/perplexity_run.h): the source writing the base file, or the
 * output read against it; its lines dropped. Its summary, or NULL after saying why. */
static cJSON *perplexity(const char *prog, const struct qd_cli_kld *k, const char *model, const char *base_path,
                         int kl_divergence)
{
    char err[1024];
    cJSON *summary = NULL;
    const struct qd_perplexity_opts o = {.model = model, .text = kl_divergence ? NULL : k->text,
                                         .kld_base = base_path, .kl_divergence = kl_divergence, .n_ctx = k->n_ctx,
                                         .max_chunks = k->n_chunks, .n_batch = 2048, .threads = k->threads,
                                         .cache_k = QD_F16, .cache_v = QD_F16, /* quantd perplexity's defaults */
                                         .nn = k->nn, .io = {.cancel = k->cancel}};
    if (qd_perplexity_run(&o, &summary, err, sizeof err) != QD_OK) {
        fprintf(stderr, "%s: --kld: the %s %s: %s\n", prog, kl_divergence ? "output" : "source", model, err);
        return NULL;
    }
    return summary;
}

/* from's members into `into`, under their names, in order */
static void move_items(cJSON *from, cJSON *into)
{
    cJSON *item;
    while ((item = from->child)) {
        cJSON_DetachItemViaPointer(from, item);
        char *name = item->string; /* the item's own key: added under a copy, then freed */
        item->string = NULL;
        cJSON_AddItemToObject(into, name, item);
        cJSON_free(name);
    }
}

int qd_cli_kld_measure(const char *prog, const struct qd_cli_kld *k, const char *output, const char *base_path,
                       cJSON *into)
{
    int rc = 1;
    cJSON *source = perplexity(prog, k, k->source, base_path, 0), *r = NULL, *figures;
    if (!source || !(r = perplexity(prog, k, output, base_path, 1)))
        goto done;
    cJSON_AddStringToObject(into, "text", k->text);
    cJSON_AddNumberToObject(into, "n_ctx", k->n_ctx);
    cJSON_AddNumberToObject(into, "chunks", k->n_chunks);
    cJSON_AddItemToObject(into, "tokens_scored", cJSON_DetachItemFromObject(r, "tokens_scored"));
    /* kld.h's figures flat under "kld": the divergence's own (mean, mean_error, median, the
     * percentiles), then the perplexities, delta-p and same_top_p as qd_kld_report gives them */
    if ((figures = cJSON_DetachItemFromObject(r, "kld")))
        move_items(figures, into);
    cJSON_Delete(figures);
    static const char *const report[] = {"ppl", "delta_p", "same_top_p", "same_top_p_error"};
    for (size_t i = 0; i < sizeof report / sizeof *report; i++) {
        cJSON *item = cJSON_DetachItemFromObject(r, report[i]);
        if (item)
            cJSON_AddItemToObject(into, report[i], item);
    }
    cJSON_AddNumberToObject(into, "seconds", cJSON_GetNumberValue(cJSON_GetObjectItem(source, "seconds")) +
                                                 cJSON_GetNumberValue(cJSON_GetObjectItem(r, "seconds")));
    rc = 0;
done:
    cJSON_Delete(source);
    cJSON_Delete(r);
    unlink(base_path); /* (the run leaves no temporary of its own) */
    return rc;
}
