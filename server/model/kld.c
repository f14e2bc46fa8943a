/* llama-perplexity's KL divergence statistics (tools/perplexity/perplexity.cpp: log_softmax()
 * with a base row, kl_divergence()): each figure in the type it uses there (the per-position
 * values in float, the sums in double), so that the same logits give the same digits. */
#include "model/kld.h"

#include "../../kernels/cpu/cpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* round to nearest through the float mantissa, as llama-perplexity's nearest_int (valid below 2^22) */
static int nearest_int(float x)
{
    const float v = x + 12582912.f; /* 1.5 * 2^23 */
    int32_t i;
    memcpy(&i, &v, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

double qd_kld_encode_row(const float *logits, int64_t n_vocab, int32_t tok, uint16_t *row)
{
    float max = logits[0], min = logits[0];
    for (int64_t i = 1; i < n_vocab; i++) {
        max = max < logits[i] ? logits[i] : max;
        min = logits[i] < min ? logits[i] : min;
    }
    /* 16 nats below the top is as far as the codes reach: below that a probability is < 1e-7 */
    min = min < max - 16 ? max - 16 : min;
    double sum_exp = 0.0;
    for (int64_t i = 0; i < n_vocab; i++)
        sum_exp += expf(logits[i] - max);
    const float log_sum_exp = (float)log(sum_exp);
    const float min_log_prob = min - max - log_sum_exp;
    const float scale = (max - min) / 65535.f;
    memcpy(row, &scale, 4);
    memcpy(row + 2, &min_log_prob, 4);
    uint16_t *code = row + 4;
    if (scale) {
        const float inv_scale = 1 / scale;
        for (int64_t i = 0; i < n_vocab; i++)
            code[i] = logits[i] > min ? (uint16_t)nearest_int(inv_scale * (logits[i] - min)) : 0;
    } else
        memset(code, 0, (size_t)n_vocab * sizeof *code);
    for (int64_t i = 4 + n_vocab; i < qd_kld_row_words(n_vocab); i++)
        row[i] = 0; /* llama-perplexity's padding: its buffer's zeros */
    return max + log_sum_exp - logits[tok];
}

enum qd_status qd_kld_stats_init(struct qd_kld_stats *s, int64_t positions)
{
    memset(s, 0, sizeof *s);
    s->capacity = positions;
    s->kld_values = malloc((size_t)(positions ? positions : 1) * sizeof *s->kld_values);
    s->p_diff_values = malloc((size_t)(positions ? positions : 1) * sizeof *s->p_diff_values);
    return s->kld_values && s->p_diff_values ? QD_OK : QD_ENOMEM;
}

void qd_kld_stats_free(struct qd_kld_stats *s)
{
    free(s->kld_values);
    free(s->p_diff_values);
    memset(s, 0, sizeof *s);
}

/* One position's figures, computed apart from the sums so that rows can run on every core. */
struct kld_row {
    float nll, nll_base, p_diff;
    double kld;
    int same_top;
};

static void kld_row(struct kld_row *r, const float *logits, int64_t n_vocab, const uint16_t *base_row, int32_t tok)
{
    float max = logits[0];
    int64_t imax = 0;
    for (int64_t i = 1; i < n_vocab; i++)
        if (logits[i] > max) {
            max = logits[i];
            imax = i;
        }
    double sum_exp = 0.0;
    for (int64_t i = 0; i < n_vocab; i++)
        sum_exp += expf(logits[i] - max);
    const float log_sum_exp = (float)log(sum_exp);
    float scale, min_log_prob;
    memcpy(&scale, base_row, 4);
    memcpy(&min_log_prob, base_row + 2, 4);
    const uint16_t *code = base_row + 4;

    r->nll = max + log_sum_exp - logits[tok];
    r->nll_base = -(scale * code[tok] + min_log_prob);

    /* KL(base || model) over the base's codes; positions below the codes' reach count nothing */
    const float log_norm = max + log_sum_exp;
    double kld = 0;
    int64_t imax_base = -1;
    float top_base = 0;
    for (int64_t i = 0; i < n_vocab; i++) {
        const float log_p_base = scale * code[i] + min_log_prob;
        if (i == 0 || log_p_base > top_base) {
            top_base = log_p_base;
            imax_base = i;
        }
        if (log_p_base > -16.f)
            kld += expf(log_p_base) * (log_p_base - logits[i] + log_norm);
    }
    r->kld = kld;
    r->same_top = imax == imax_base;
    r->p_diff = expf(-r->nll) - expf(-r->nll_base);
}

/* the sums, in position order */
static void kld_sum(struct qd_kld_stats *s, const struct kld_row *r)
{
    const float nll = r->nll, nll_base = r->nll_base, p_diff = r->p_diff;
    s->sum_nll += nll;
    s->sum_nll2 += nll * nll;
    s->sum_nll_base += nll_base;
    s->sum_nll_base2 += nll_base * nll_base;
    s->sum_nll_nll_base += nll * nll_base;
    s->sum_kld += r->kld;
    s->sum_kld2 += r->kld * r->kld;
    s->n_same_top += r->same_top;
    s->sum_p_diff += p_diff;
    const double p_diff2 = p_diff * p_diff;
    s->sum_p_diff2 += p_diff2;
    s->sum_p_diff4 += p_diff2 * p_diff2;
    s->max_p_diff = s->max_p_diff < fabsf(p_diff) ? fabsf(p_diff) : s->max_p_diff;
    if (s->count < s->capacity) {
        s->kld_values[s->count] = (float)r->kld;
        s->p_diff_values[s->count] = p_diff;
    }
    s->count++;
}

void qd_kld_stats_add(struct qd_kld_stats *s, const float *logits, int64_t n_vocab, const uint16_t *base_row,
                      int32_t tok)
{
    struct kld_row r;
    kld_row(&r, logits, n_vocab, base_row, tok);
    kld_sum(s, &r);
}

struct kld_job {
    const float *logits;
    int64_t n_vocab, words;
    const uint16_t *base_rows;
    const int32_t *targets;
    int rows;
    struct kld_row *out;
};

static void kld_rows(void *ctx, int tid, int n)
{
    const struct kld_job *j = ctx;
    for (int i = tid; i < j->rows; i += n)
        kld_row(&j->out[i], j->logits + (int64_t)i * j->n_vocab, j->n_vocab, j->base_rows + (int64_t)i * j->words,
                j->targets[i]);
}

void qd_kld_stats_add_rows(struct qd_kld_stats *s, const float *logits, int rows, int64_t n_vocab,
                           const uint16_t *base_rows, const int32_t *targets)
{
    struct kld_row *r = malloc((size_t)(rows > 0 ? rows : 1) * sizeof *r);
    const int64_t words = qd_kld_row_words(n_vocab);
    if (!r) { /* one at a time */
        for (int i = 0; i < rows; i++)
            qd_kld_stats_add(s, logits + (int64_t)i * n_vocab, n_vocab, base_rows + (int64_t)i * words, targets[i]);
        return;
    }
    struct kld_job j = {logits, n_vocab, words, base_rows, targets, rows, r};
    qd_cpu_parallel(qd_cpu_threads() < rows ? qd_cpu_threads() : rows, kld_rows, &j);
    for (int i = 0; i < rows; i++)
        kld_sum(s, &r[i]);
    free(r);
}

/* ---- llama-perplexity's figures from the sums ---- */

struct mean_err {
    double mean, err;
};

/* the mean and its standard error (none below 11 values, as llama-perplexity) */
static struct mean_err mean_and_uncertainty(double sum, double sum2, int64_t count)
{
    if (count < 1)
        return (struct mean_err){0, 0};
    const double f = sum / (double)count;
    double df = sum2 / (double)count - f * f;
    df = df > 0 && count > 10 ? sqrt(df / (double)(count - 1)) : 0.;
    return (struct mean_err){f, df};
}

static double covariance(double suma, double sumb, double sumab, int64_t count)
{
    if (count < 10)
        return 0.0;
    const double n = (double)count;
    return (sumab / n - (suma / n) * (sumb / n)) / (n - 1);
}

struct figures {
    struct mean_err log_ppl, log_ppl_base, kl_div, p_diff, p_diff_mse;
    double ppl, ppl_unc, ppl_base, ppl_base_unc, cov, cor, ratio_log, ratio_log_unc, ratio, ratio_unc, diff, diff_unc;
    double rms, rms_unc, same_top, same_top_unc;
};

static struct figures figures_of(const struct qd_kld_stats *s)
{
    struct figures f;
    f.log_ppl = mean_and_uncertainty(s->sum_nll, s->sum_nll2, s->count);
    f.ppl = exp(f.log_ppl.mean);
    f.ppl_unc = f.ppl * f.log_ppl.err;
    f.log_ppl_base = mean_and_uncertainty(s->sum_nll_base, s->sum_nll_base2, s->count);
    f.ppl_base = exp(f.log_ppl_base.mean);
    f.ppl_base_unc = f.ppl_base * f.log_ppl_base.err;
    f.cov = covariance(s->sum_nll, s->sum_nll_base, s->sum_nll_nll_base, s->count);
    f.cor = f.cov / (f.log_ppl.err * f.log_ppl_base.err);
    f.ratio_log = f.log_ppl.mean - f.log_ppl_base.mean;
    f.ratio_log_unc = sqrt(f.log_ppl.err * f.log_ppl.err + f.log_ppl_base.err * f.log_ppl_base.err - 2.0 * f.cov);
    f.ratio = exp(f.ratio_log);
    f.ratio_unc = f.ratio * f.ratio_log_unc;
    f.diff = f.ppl - f.ppl_base;
    f.diff_unc = sqrt(f.ppl_unc * f.ppl_unc + f.ppl_base_unc * f.ppl_base_unc - 2.0 * f.ppl * f.ppl_base * f.cov);
    f.kl_div = mean_and_uncertainty(s->sum_kld, s->sum_kld2, s->count);
    f.p_diff = mean_and_uncertainty(s->sum_p_diff, s->sum_p_diff2, s->count);
    f.p_diff_mse = mean_and_uncertainty(s->sum_p_diff2, s->sum_p_diff4, s->count);
    f.rms = sqrt(f.p_diff_mse.mean);
    f.rms_unc = 0.5 / f.rms * f.p_diff_mse.err;
    f.same_top = (double)s->n_same_top / (double)s->count;
    f.same_top_unc = sqrt(f.same_top * (1 - f.same_top) / (double)(s->count - 1));
    return f;
}

void qd_kld_print_header(FILE *out)
{
    fprintf(out, "\nchunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              "
            "Δp RMS            Same top p\n");
}

void qd_kld_print_chunk(const struct qd_kld_stats *s, int chunk, FILE *out)
{
    const struct figures f = figures_of(s);
    fprintf(out, "%4d    %9.4lf ± %9.4lf    %10.5lf ± %10.5lf    %10.5lf ± %10.5lf    %6.3lf ± %6.3lf %%    %6.3lf "
            "± %6.3lf %%\n", chunk, f.ppl, f.ppl_unc, f.ratio_log, f.ratio_log_unc, f.kl_div.mean, f.kl_div.err,
            100.0 * f.rms, 100.0 * f.rms_unc, 100.0 * f.same_top, 100.0 * f.same_top_unc);
    fflush(out);
}

static int float_order(const void *a, const void *b)
{
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* llama-perplexity's percentile: linear between the two nearest sorted values, in float */
static float percentile(const float *v, size_t n, float fraction)
{
    if (fraction <= 0)
        return v[0];
    if (fraction >= 1)
        return v[n - 1];
    float p = fraction * (float)(n - 1);
    const size_t ip = (size_t)p;
    p -= (float)ip;
    return (1 - p) * v[ip] + p * v[ip + 1 < n ? ip + 1 : n - 1];
}

static float median(const float *v, size_t n)
{
    return n % 2 == 0 ? 0.5f * (v[n / 2] + v[n / 2 - 1]) : v[n / 2];
}

/* the percentiles each section prints, with their labels and JSON names */
static const struct {
    float fraction;
    const char *label, *key;
    int kld; /* printed in the KLD section too (the Δp section prints every one) */
} PCT[] = {
    {1.000f, "Maximum", "max", 1},  {0.999f, "99.9%  ", "p99_9", 1}, {0.990f, "99.0%  ", "p99", 1},
    {0.950f, "95.0%  ", "p95", 1},  {0.900f, "90.0%  ", "p90", 1},   {0.750f, "75.0%  ", "p75", 0},
    {0.500f, "Median ", "median", 1}, {0.250f, "25.0%  ", "p25", 0}, {0.100f, "10.0%  ", "p10", 1},
    {0.050f, " 5.0%  ", "p5", 1},   {0.010f, " 1.0%  ", "p1", 1},    {0.001f, " 0.1%  ", "p0_1", 1},
    {0.000f, "Minimum", "min", 1},
};

void qd_kld_report(struct qd_kld_stats *s, FILE *out, cJSON *summary)
{
    const size_t n = (size_t)(s->count < s->capacity ? s->count : s->capacity);
    const struct figures f = figures_of(s);
    float kq[sizeof PCT / sizeof *PCT], pq[sizeof PCT / sizeof *PCT];
    if (n) {
        qsort(s->kld_values, n, sizeof *s->kld_values, float_order);
        qsort(s->p_diff_values, n, sizeof *s->p_diff_values, float_order);
        for (size_t i = 0; i < sizeof PCT / sizeof *PCT; i++) {
            const int mid = PCT[i].fraction == 0.5f;
            kq[i] = mid ? median(s->kld_values, n) : percentile(s->kld_values, n, PCT[i].fraction);
            pq[i] = mid ? median(s->p_diff_values, n) : percentile(s->p_diff_values, n, PCT[i].fraction);
        }
    }
    if (out && s->count >= 100) { /* llama-perplexity prints no statistics on fewer values */
        fprintf(out, "====== Perplexity statistics ======\n");
        fprintf(out, "Mean PPL(Q)                   : %10.6lf ± %10.6lf\n", f.ppl, f.ppl_unc);
        fprintf(out, "Mean PPL(base)                : %10.6lf ± %10.6lf\n", f.ppl_base, f.ppl_base_unc);
        fprintf(out, "Cor(ln(PPL(Q)), ln(PPL(base))): %6.2lf%%\n", 100.0 * f.cor);
        fprintf(out, "Mean ln(PPL(Q)/PPL(base))     : %10.6lf ± %10.6lf\n", f.ratio_log, f.ratio_log_unc);
        fprintf(out, "Mean PPL(Q)/PPL(base)         : %10.6lf ± %10.6lf\n", f.ratio, f.ratio_unc);
        fprintf(out, "Mean PPL(Q)-PPL(base)         : %10.6lf ± %10.6lf\n", f.diff, f.diff_unc);
        fprintf(out, "\n====== KL divergence statistics ======\n");
        fprintf(out, "Mean    KLD: %10.6lf ± %10.6lf\n", f.kl_div.mean, f.kl_div.err);
        for (size_t i = 0; i < sizeof PCT / sizeof *PCT; i++)
            if (PCT[i].kld)
                fprintf(out, "%s KLD: %10.6f\n", PCT[i].label, kq[i]);
        fprintf(out, "\n====== Token probability statistics ======\n");
        fprintf(out, "Mean    Δp: %6.3lf ± %5.3lf %%\n", 100.0 * f.p_diff.mean, 100.0 * f.p_diff.err);
        for (size_t i = 0; i < sizeof PCT / sizeof *PCT; i++)
            fprintf(out, "%s Δp: %6.3lf%%\n", PCT[i].label, 100.0 * pq[i]);
        fprintf(out, "RMS Δp    : %6.3lf ± %5.3lf %%\n", 100.0 * f.rms, 100.0 * f.rms_unc);
        fprintf(out, "Same top p: %6.3lf ± %5.3lf %%\n", 100.0 * f.same_top, 100.0 * f.same_top_unc);
    }
    if (!summary)
        return;
    cJSON *p = cJSON_AddObjectToObject(summary, "ppl");
    cJSON_AddNumberToObject(p, "q", f.ppl);
    cJSON_AddNumberToObject(p, "q_error", f.ppl_unc);
    cJSON_AddNumberToObject(p, "base", f.ppl_base);
    cJSON_AddNumberToObject(p, "base_error", f.ppl_base_unc);
    cJSON_AddNumberToObject(p, "ln_q", f.log_ppl.mean);
    cJSON_AddNumberToObject(p, "ln_base", f.log_ppl_base.mean);
    cJSON_AddNumberToObject(p, "correlation", isfinite(f.cor) ? f.cor : 0);
    cJSON_AddNumberToObject(p, "ln_ratio", f.ratio_log);
    cJSON_AddNumberToObject(p, "ln_ratio_error", isfinite(f.ratio_log_unc) ? f.ratio_log_unc : 0);
    cJSON_AddNumberToObject(p, "ratio", f.ratio);
    cJSON_AddNumberToObject(p, "ratio_error", isfinite(f.ratio_unc) ? f.ratio_unc : 0);
    cJSON_AddNumberToObject(p, "diff", f.diff);
    cJSON_AddNumberToObject(p, "diff_error", isfinite(f.diff_unc) ? f.diff_unc : 0);
    cJSON *k = cJSON_AddObjectToObject(summary, "kld");
    cJSON_AddNumberToObject(k, "mean", f.kl_div.mean);
    cJSON_AddNumberToObject(k, "mean_error", f.kl_div.err);
    cJSON *d = cJSON_AddObjectToObject(summary, "delta_p");
    cJSON_AddNumberToObject(d, "mean", f.p_diff.mean);
    cJSON_AddNumberToObject(d, "mean_error", f.p_diff.err);
    for (size_t i = 0; n && i < sizeof PCT / sizeof *PCT; i++) {
        if (PCT[i].kld)
            cJSON_AddNumberToObject(k, PCT[i].key, kq[i]);
        cJSON_AddNumberToObject(d, PCT[i].key, pq[i]);
    }
    cJSON_AddNumberToObject(d, "rms", isfinite(f.rms) ? f.rms : 0);
    cJSON_AddNumberToObject(d, "rms_error", isfinite(f.rms_unc) ? f.rms_unc : 0);
    cJSON_AddNumberToObject(summary, "same_top_p", f.same_top);
    cJSON_AddNumberToObject(summary, "same_top_p_error", isfinite(f.same_top_unc) ? f.same_top_unc : 0);
}
