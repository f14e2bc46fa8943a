/* Harness for the service tests: start a real `quantd serve` on a free loopback port, talk to it
 * with libcurl, record every answer for the OpenAPI check (tests/api/test_openapi.py). */
#ifndef QD_TEST_SERVICE_H
#define QD_TEST_SERVICE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct server {
    pid_t pid;
    int port;
    char base[64]; /* http://127.0.0.1:PORT */
    char log[64];  /* the server's stderr ($QUANTD_TEST_LOG, else a temporary file) */
};

/* Starts bin/quantd serve (path from $QUANTD) with extra flags (NULL-terminated); waits until
 * /healthz answers. Aborts the test on failure. */
void server_start(struct server *s, const char *const *flags);
/* SIGTERM, wait, return the exit status (0 expected: drained and, under ASan, no leak); on
 * any other status the end of the server's log is printed, so that CI shows why. */
int server_stop(struct server *s);

struct http {
    long status;
    char *body;
    size_t len;
    char content_type[128], location[128], retry_after[16], shape[160], dtype[16], www_authenticate[64];
};

/* One request. headers: NULL-terminated "Name: value" strings or NULL. */
void http_do(const struct server *s, const char *method, const char *path, const char *const *headers,
             const void *body, size_t len, struct http *r);
void http_free(struct http *r);
/* A growing, NUL-terminated answer buffer and its curl write callback (set n = 0 to reuse). */
struct sink {
    char *p;
    size_t n, cap;
};
size_t http_sink(char *data, size_t size, size_t nmemb, void *arg);

/* Random f32 values, normal-ish, fresh per call; the seed is printed once. */
float *random_f32(size_t n);
/* f32 -> bf16 with RNE (as the tests' input) */
void f32_to_bf16(const float *x, uint16_t *y, size_t n);

/* base64 via the server's own decoder (tests link server/base64.o). */
unsigned char *b64_decode(const char *s, size_t *n);
char *b64_encode(const void *p, size_t n);

/* Reads a whole file; NULL when missing. */
void *read_file(const char *path, size_t *len);
int write_file(const char *path, const void *p, size_t n);
const char *quantd_bin(void);

#endif
