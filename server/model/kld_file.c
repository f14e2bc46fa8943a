/* llama-perplexity's base logits file (kld.h has its layout): read with every field checked
 * against what is left of the file before anything is allocated or run, and written under a
 * temporary name beside its place, renamed there only when whole. */
#include "model/kld.h"

#include "../../kernels/cpu/cpu.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- reading ---- */

static int32_t le32(const unsigned char *p)
{
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

enum qd_status qd_kld_base_open_stream(FILE *f, const char *name, int64_t size, struct qd_kld_base *b, char *err,
                                       size_t errlen)
{
    memset(b, 0, sizeof *b);
    b->f = f;
    if (!(b->name = strdup(name ? name : "base logits"))) {
        snprintf(err, errlen, "no memory");
        return QD_ENOMEM;
    }
    unsigned char h[QD_KLD_HEADER_BYTES];
    const size_t got = fread(h, 1, sizeof h, f);
    if (got < 8 || memcmp(h, QD_KLD_MAGIC, 8)) {
        snprintf(err, errlen, "%s does not look like a file of log-probabilities (llama-perplexity "
                 "--kl-divergence-base writes one; it starts with \"_logits_\")", b->name);
        return QD_EINVAL;
    }
    if (got < sizeof h) {
        snprintf(err, errlen, "%s: truncated header: %zu of %d bytes", b->name, got, QD_KLD_HEADER_BYTES);
        return QD_EINVAL;
    }
    b->n_ctx = le32(h + 8), b->n_vocab = le32(h + 12), b->n_chunk = le32(h + 16);
    /* n_ctx >= 4 scores at least one position per chunk; the vocabulary and chunk count bound
     * the sizes below, each product checked against the file before it is trusted */
    if (b->n_ctx < 4 || b->n_vocab < 1 || b->n_chunk < 1) {
        snprintf(err, errlen, "%s: header n_ctx %" PRId32 ", n_vocab %" PRId32 ", n_chunk %" PRId32 " (needs n_ctx "
                 ">= 4, n_vocab >= 1, n_chunk >= 1): not a base logits file, or a damaged one", b->name, b->n_ctx,
                 b->n_vocab, b->n_chunk);
        return QD_EINVAL;
    }
    /* each product below is bounded before it is formed: the tokens (< 2^62) against the bytes
     * left, one chunk's rows (< 2^30 rows of < 2^33 bytes) exactly, the chunks by division */
    const int64_t n_tokens = (int64_t)b->n_ctx * b->n_chunk;
    const int64_t chunk_bytes = (int64_t)qd_kld_rows(b->n_ctx) * 2 * qd_kld_row_words(b->n_vocab);
    const int64_t left = size - QD_KLD_HEADER_BYTES;
    if (n_tokens > left / 4) {
        snprintf(err, errlen, "%s is truncated: its header promises %" PRId32 " chunks of %" PRId32 " tokens "
                 "(4 bytes each), the file holds %" PRId64 " bytes after the header", b->name, b->n_chunk, b->n_ctx,
                 left);
        return QD_EINVAL;
    }
    const int64_t after_tokens = left - 4 * n_tokens;
    if (b->n_chunk > after_tokens / chunk_bytes || after_tokens != chunk_bytes * b->n_chunk) {
        char need[48];
        if (b->n_chunk > INT64_MAX / chunk_bytes)
            snprintf(need, sizeof need, "more than 2^63");
        else
            snprintf(need, sizeof need, "%" PRId64, chunk_bytes * b->n_chunk);
        snprintf(err, errlen, "%s is %s: %" PRId32 " chunks of %d scored rows of %" PRId64 " bytes (n_ctx %" PRId32
                 ", n_vocab %" PRId32 ") need %s bytes after the tokens, the file has %" PRId64, b->name,
                 b->n_chunk > after_tokens / chunk_bytes ? "truncated" : "longer than its header says", b->n_chunk,
                 qd_kld_rows(b->n_ctx), 2 * qd_kld_row_words(b->n_vocab), b->n_ctx, b->n_vocab, need, after_tokens);
        return QD_EINVAL;
    }
    if (!(b->tokens = malloc((size_t)n_tokens * sizeof *b->tokens))) {
        snprintf(err, errlen, "no memory for %s's %" PRId64 " tokens", b->name, n_tokens);
        return QD_ENOMEM;
    }
    if (fread(b->tokens, 4, (size_t)n_tokens, f) != (size_t)n_tokens) {
        snprintf(err, errlen, "%s: reading its tokens: %s", b->name, ferror(f) ? strerror(errno) : "file ended");
        return QD_EIO;
    }
    for (int64_t i = 0; i < n_tokens; i++) {
        b->tokens[i] = le32((const unsigned char *)&b->tokens[i]);
        if (b->tokens[i] < 0 || b->tokens[i] >= b->n_vocab) {
            snprintf(err, errlen, "%s: token %" PRId64 " is %" PRId32 ", outside its own vocabulary of %" PRId32
                     ": a damaged file", b->name, i, b->tokens[i], b->n_vocab);
            return QD_EINVAL;
        }
    }
    return QD_OK;
}

enum qd_status qd_kld_base_open(const char *path, struct qd_kld_base *b, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    struct stat st;
    if (!f || fstat(fileno(f), &st) || !S_ISREG(st.st_mode)) {
        memset(b, 0, sizeof *b);
        snprintf(err, errlen, "%s: %s", path, !f ? strerror(errno) : "not a regular file");
        if (f)
            fclose(f);
        return QD_EIO;
    }
    return qd_kld_base_open_stream(f, path, (int64_t)st.st_size, b, err, errlen);
}

enum qd_status qd_kld_base_read_chunk(struct qd_kld_base *b, uint16_t *rows, char *err, size_t errlen)
{
    const int n = qd_kld_rows(b->n_ctx);
    const int64_t words = qd_kld_row_words(b->n_vocab);
    if (b->chunks_read >= b->n_chunk) {
        snprintf(err, errlen, "%s holds only %" PRId32 " chunks", b->name, b->n_chunk);
        return QD_EINVAL;
    }
    if (fread(rows, 2 * (size_t)words, (size_t)n, b->f) != (size_t)n) {
        snprintf(err, errlen, "%s: reading the log-probabilities of chunk %d: %s", b->name, b->chunks_read + 1,
                 ferror(b->f) ? strerror(errno) : "file ended");
        return QD_EIO;
    }
    for (int r = 0; r < n; r++) {
        uint16_t *row = rows + (int64_t)r * words;
        for (int64_t i = 0; i < words; i++) /* little-endian on disk */
            row[i] = (uint16_t)(((const unsigned char *)&row[i])[0] | ((const unsigned char *)&row[i])[1] << 8);
        float scale, min_log_prob;
        memcpy(&scale, row, 4);
        memcpy(&min_log_prob, row + 2, 4);
        if (!isfinite(scale) || !isfinite(min_log_prob) || scale < 0 || min_log_prob > 0) {
            snprintf(err, errlen, "%s: chunk %d, row %d: scale %g and min_log_prob %g (a row needs a finite scale >= 0 "
                     "and a log-probability <= 0): a damaged file", b->name, b->chunks_read + 1, r, scale, min_log_prob);
            return QD_EINVAL;
        }
    }
    b->chunks_read++;
    return QD_OK;
}

void qd_kld_base_close(struct qd_kld_base *b)
{
    if (b->f)
        fclose(b->f);
    free(b->tokens);
    free(b->name);
    memset(b, 0, sizeof *b);
}

/* ---- writing ---- */

enum qd_status qd_kld_writer_open(const char *path, int32_t n_ctx, int32_t n_vocab, int32_t n_chunk,
                                  const int32_t *tokens, struct qd_kld_writer *w, char *err, size_t errlen)
{
    memset(w, 0, sizeof *w);
    w->n_vocab = n_vocab;
    const size_t len = strlen(path);
    w->path = strdup(path);
    w->tmp = malloc(len + 16);
    w->row = malloc(2 * (size_t)qd_kld_row_words(n_vocab));
    if (!w->path || !w->tmp || !w->row) {
        snprintf(err, errlen, "no memory");
        qd_kld_writer_abort(w);
        return QD_ENOMEM;
    }
    /* beside the destination, so that the rename stays inside one file system */
    snprintf(w->tmp, len + 16, "%s.tmp-XXXXXX", path);
    const int fd = mkstemp(w->tmp);
    if (fd < 0 || !(w->f = fdopen(fd, "wb"))) {
        snprintf(err, errlen, "%s: cannot write beside it (%s): %s", path, w->tmp, strerror(errno));
        if (fd >= 0) {
            close(fd);
            unlink(w->tmp);
        }
        free(w->tmp);
        w->tmp = NULL;
        qd_kld_writer_abort(w);
        return QD_EIO;
    }
    const int32_t head[3] = {n_ctx, n_vocab, n_chunk};
    if (fwrite(QD_KLD_MAGIC, 1, 8, w->f) != 8 || fwrite(head, 4, 3, w->f) != 3 ||
        fwrite(tokens, 4, (size_t)n_ctx * (size_t)n_chunk, w->f) != (size_t)n_ctx * (size_t)n_chunk) {
        snprintf(err, errlen, "%s: %s", w->tmp, strerror(errno));
        qd_kld_writer_abort(w);
        return QD_EIO;
    }
    return QD_OK;
}

struct encode_job {
    const float *logits;
    int64_t n_vocab, words;
    const int32_t *targets;
    int rows;
    uint16_t *buf;
    double *nll;
};

static void encode_rows(void *ctx, int tid, int n)
{
    const struct encode_job *j = ctx;
    for (int r = tid; r < j->rows; r += n)
        j->nll[r] = qd_kld_encode_row(j->logits + (int64_t)r * j->n_vocab, j->n_vocab, j->targets[r],
                                      j->buf + (int64_t)r * j->words);
}

enum qd_status qd_kld_writer_chunk(struct qd_kld_writer *w, const float *logits, int rows, const int32_t *targets,
                                   double *nll, double *nll2, char *err, size_t errlen)
{
    const int64_t words = qd_kld_row_words(w->n_vocab);
    /* the rows encoded on every core, then written and summed in order */
    uint16_t *buf = malloc((size_t)(rows > 0 ? rows : 1) * (size_t)words * 2);
    double *v = malloc((size_t)(rows > 0 ? rows : 1) * sizeof *v);
    if (buf && v) {
        struct encode_job j = {logits, w->n_vocab, words, targets, rows, buf, v};
        qd_cpu_parallel(qd_cpu_threads() < rows ? qd_cpu_threads() : rows, encode_rows, &j);
    }
    for (int r = 0; r < rows; r++) {
        uint16_t *row = buf && v ? buf + (int64_t)r * words : w->row;
        const double x = buf && v ? v[r] : qd_kld_encode_row(logits + (int64_t)r * w->n_vocab, w->n_vocab, targets[r], row);
        *nll += x;
        *nll2 += x * x;
        if (!(buf && v) && fwrite(row, 2, (size_t)words, w->f) != (size_t)words) {
            snprintf(err, errlen, "%s: %s", w->tmp, strerror(errno));
            free(buf), free(v);
            return QD_EIO;
        }
    }
    if (buf && v && rows > 0 && fwrite(buf, 2, (size_t)(rows * words), w->f) != (size_t)(rows * words)) {
        snprintf(err, errlen, "%s: %s", w->tmp, strerror(errno));
        free(buf), free(v);
        return QD_EIO;
    }
    free(buf), free(v);
    return QD_OK;
}

enum qd_status qd_kld_writer_commit(struct qd_kld_writer *w, char *err, size_t errlen)
{
    FILE *f = w->f;
    w->f = NULL;
    if (fflush(f) || fsync(fileno(f)) || fclose(f)) {
        snprintf(err, errlen, "%s: %s", w->tmp, strerror(errno));
        qd_kld_writer_abort(w);
        return QD_EIO;
    }
    if (rename(w->tmp, w->path)) {
        snprintf(err, errlen, "%s: renaming %s to it: %s", w->path, w->tmp, strerror(errno));
        qd_kld_writer_abort(w);
        return QD_EIO;
    }
    free(w->tmp);
    w->tmp = NULL;
    qd_kld_writer_abort(w);
    return QD_OK;
}

void qd_kld_writer_abort(struct qd_kld_writer *w)
{
    if (w->f)
        fclose(w->f);
    if (w->tmp)
        unlink(w->tmp);
    free(w->tmp);
    free(w->path);
    free(w->row);
    memset(w, 0, sizeof *w);
}
