/* A job's answer: status, body and the few headers quantd sets. The job carries it from the
 * worker that fills it to the connection that sends it; http/reply.c builds and frees it (the
 * queue only reads its length). */
#ifndef QD_ANSWER_H
#define QD_ANSWER_H

#include <stddef.h>

#include "../../kernels/registry.h"

#define QD_REPLY_MAX_PARTS (QD_MAX_COMPONENTS + 1)

struct qd_reply {
    int status;               /* 0: not set yet */
    const char *content_type; /* static string */
    char *body;               /* owned: malloc'd or from the body pool (qd_hostmem_put frees) */
    size_t len;               /* of body, or of all the parts */
    /* or the answer in pieces, sent one after the other without joining them (a safetensors
     * answer: its header, then each component where the worker left it); owned like body */
    int nparts;
    void *part[QD_REPLY_MAX_PARTS];
    size_t part_len[QD_REPLY_MAX_PARTS];
    char location[96];        /* Location header, "" for none */
    int retry_after_s;        /* Retry-After header, 0 for none */
    const char *allow;        /* Allow header for 405, static */
    char shape_header[160];   /* X-Quantd-Shape for raw tensor bodies, "" for none */
    char dtype_header[16];    /* X-Quantd-Dtype likewise */
    /* an answer streamed from a file instead of body (POST /convert): descriptor and size;
     * libmicrohttpd closes it */
    int has_file, file_fd;
    unsigned long long file_len;
    char *summary_header;     /* X-Quantd-Summary (owned), NULL for none */
    char *config_header;      /* X-Quantd-Quantization-Config (owned), NULL for none */
};

#endif
