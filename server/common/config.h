/* quantd serve's settings: one table of options, each a --flag and a QUANTD_* environment
 * variable (the flag wins), so --help, the container's ENV and the docs name the same things. */
#ifndef QD_CONFIG_H
#define QD_CONFIG_H

#include <stddef.h>
#include <stdio.h>

struct qd_serve_config {
    char listen[128];        /* ADDR:PORT */
    char backend[8];         /* auto, cpu, cuda */
    int workers;             /* 0: the backend's default */
    int queue_depth;
    long long max_body_bytes;
    char token[256];         /* "" for none */
    char devices[128];       /* "" for all visible */
    int http_threads;
    int result_ttl_s;
    long long result_max_bytes;
    long long pinned_bytes;
    int max_jobs;
    int drain_timeout_s;
    int cpu_threads;         /* 0: every core */
    char data_dir[1024];     /* "": no conversions (/jobs?op=convert) */
    long long max_convert_bytes; /* POST /convert's model body */
    int conn_timeout_s;      /* a connection idle this long is closed */
    int max_header_bytes;    /* request line and headers together (431 beyond) */
    long long max_json_bytes;  /* a JSON body apart from its base64 data (413 beyond) */
    long long max_safetensors_header_bytes; /* a converted safetensors model's header */
    long long max_inflight_bytes; /* request bodies held at once (503 beyond); 0: a quarter of memory */
    int convert_workers;     /* threads that run conversions, apart from the queue's workers */
    int max_connections;     /* open at once; beyond, 503 at accept */
    /* after an answer that refuses a body the client is still sending: how long, how many of
     * its bytes and how many connections at once it is read and dropped (0: closed at once) */
    int linger_timeout_s;
    long long linger_bytes;
    int linger_connections;
};

/* Defaults, then the environment, then argv. Returns 0, 1 after printing --help, or -1 with err. */
int qd_config_load(struct qd_serve_config *c, int argc, char **argv, char *err, size_t errlen);
void qd_config_usage(FILE *to);

#endif
