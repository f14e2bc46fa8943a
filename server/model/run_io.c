/* A run's text and progress (run_io.h). */
#define _GNU_SOURCE /* fopencookie */
#include "model/run_io.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct cookie {
    struct qd_run_io io;
    enum qd_run_stream s;
};

static ssize_t cookie_write(void *c, const char *buf, size_t len)
{
    struct cookie *k = c;
    if (k->io.text && len)
        k->io.text(k->io.ctx, k->s, buf, len);
    return (ssize_t)len;
}

static int cookie_close(void *c)
{
    free(c);
    return 0;
}

FILE *qd_run_io_open(const struct qd_run_io *io, enum qd_run_stream s)
{
    struct cookie *k = malloc(sizeof *k);
    if (!k)
        return NULL;
    k->io = *io;
    k->s = s;
    FILE *f = fopencookie(k, "w", (cookie_io_functions_t){.write = cookie_write, .close = cookie_close});
    if (!f) {
        free(k);
        return NULL;
    }
    setvbuf(f, NULL, _IONBF, 0);
    return f;
}

void qd_run_progress_print(void *ctx, const struct qd_run_progress *p)
{
    const struct qd_run_progress_sink *k = ctx;
    const int layers = !strcmp(p->stage, "layers");
    if (k->json) {
        fprintf(k->to, "{\"progress\":{\"done\":%d,\"total\":%d,\"stage\":\"%s\"}}\n",
                layers ? p->layers_done : p->chunks_done, layers ? p->layers_total : p->chunks_total, p->stage);
    } else {
        /* one bar over both stages: the blocks, then the chunks through the head */
        const int total = p->layers_total + p->chunks_total, done = p->layers_done + p->chunks_done;
        char bar[21];
        for (int i = 0; i < 20; i++)
            bar[i] = total > 0 && i < 20 * done / total ? '#' : '.';
        bar[20] = 0;
        fprintf(k->to, "\r%s: [%s] layers %d/%d, chunks %d/%d", k->what, bar, p->layers_done, p->layers_total,
                p->chunks_done, p->chunks_total);
        if (!strcmp(p->stage, "done"))
            fputc('\n', k->to);
    }
    fflush(k->to);
}
