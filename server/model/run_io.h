/* What a run of the model (perplexity_run.h, imatrix_run.h) says as it goes, for whoever runs it:
 * llama.cpp's text lines (the CLI prints them on stdout and stderr; a job drops them), its
 * progress (blocks done, chunks scored) and the flag that stops it. The runs write their lines
 * through ordinary FILE streams (the KL divergence report prints to one), made here over the
 * text callback. */
#ifndef QD_MODEL_RUN_IO_H
#define QD_MODEL_RUN_IO_H

#include <stddef.h>
#include <stdio.h>

enum qd_run_stream { QD_RUN_OUT, QD_RUN_LOG }; /* llama.cpp's stdout and stderr lines */

struct qd_run_progress {
    const char *stage;  /* "layers" while the blocks run, "chunks" as each chunk's logits come, "done" */
    int layers_done, layers_total; /* blocks of the model passed by every chunk */
    int chunks_done, chunks_total; /* chunks through the output head (scored) */
};

struct qd_run_io {
    void *ctx;
    /* Text the run prints, in pieces (not always whole lines); NULL: dropped. */
    void (*text)(void *ctx, enum qd_run_stream s, const char *text, size_t len);
    /* After each block and each chunk's logits; NULL: none. */
    void (*progress)(void *ctx, const struct qd_run_progress *p);
    const volatile int *cancel; /* nonzero: stop at the next block or chunk (QD_ECANCELED) */
};

/* A write-only stream whose bytes go to io->text(s) (dropped when it is NULL); unbuffered, so
 * the text leaves as it is printed. NULL without memory. */
FILE *qd_run_io_open(const struct qd_run_io *io, enum qd_run_stream s);

/* The progress shown by the CLI: on a terminal one line rewritten with \r ("perplexity: [####....]
 * layers 12/30, chunks 0/4"), else one JSON line per step ({"progress":{"done":12,"total":31,"stage":
 * "layers"}}), both on `to`. ctx: a struct qd_run_progress_sink. */
struct qd_run_progress_sink {
    FILE *to;
    const char *what; /* "perplexity", "imatrix" */
    int json;         /* 1: JSON lines; 0: the bar */
};
void qd_run_progress_print(void *ctx, const struct qd_run_progress *p);

#endif
