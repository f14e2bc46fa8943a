/* The null HTTP server of null_http.h: enough of HTTP/1.1 for libcurl's requests (keep-alive,
 * Content-Length bodies, Expect: 100-continue), nothing else. */
#define _GNU_SOURCE
#include "null_http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

struct conn {
    int fd;
    pthread_t th;
    struct null_http *s;
    struct conn *next;
};

struct null_http {
    int lfd;
    pthread_t acceptor;
    char base[64];
    size_t answer_bytes;
    char *answer; /* header and body, sent as one buffer */
    size_t answer_len;
    pthread_mutex_t mu;
    struct conn *conns;
    atomic_long answered;
    /* body buffers, reused across connections (a connection per request must not pay for
     * fresh pages each time, any more than quantd's pool does) */
    struct buf { char *p; size_t cap; } spare[128];
    int nspare;
};

static struct buf buf_get(struct null_http *s, size_t len)
{
    struct buf b = {NULL, 0};
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->nspare; i++)
        if (s->spare[i].cap >= len) {
            b = s->spare[i];
            s->spare[i] = s->spare[--s->nspare];
            break;
        }
    pthread_mutex_unlock(&s->mu);
    if (!b.p && len && (b.p = malloc(len)))
        b.cap = len;
    return b;
}

static void buf_put(struct null_http *s, struct buf b)
{
    if (!b.p)
        return;
    pthread_mutex_lock(&s->mu);
    if (s->nspare < (int)(sizeof s->spare / sizeof s->spare[0]))
        s->spare[s->nspare++] = b, b.p = NULL;
    pthread_mutex_unlock(&s->mu);
    free(b.p);
}

static int send_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k <= 0)
            return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* The value of header `name` in the head [h, h+n), or NULL. */
static const char *header(const char *h, const char *name)
{
    size_t k = strlen(name);
    for (const char *l = strstr(h, "\r\n"); l && l[2] != '\r'; l = strstr(l + 2, "\r\n"))
        if (!strncasecmp(l + 2, name, k) && l[2 + k] == ':')
            return l + 3 + k;
    return NULL;
}

static void *serve(void *arg)
{
    struct conn *c = arg;
    char head[16384];
    size_t have = 0;
    for (;;) {
        /* the head, and whatever part of the body came with it */
        char *end = NULL;
        while (!(end = memmem(head, have, "\r\n\r\n", 4))) {
            ssize_t k = have < sizeof head - 1 ? recv(c->fd, head + have, sizeof head - 1 - have, 0) : -1;
            if (k <= 0)
                goto out;
            have += (size_t)k;
        }
        *end = 0;
        const char *cl = header(head, "Content-Length"), *ex = header(head, "Expect");
        size_t len = cl ? strtoull(cl, NULL, 10) : 0, got = have - (size_t)(end + 4 - head);
        struct buf b = buf_get(c->s, len);
        char *body = b.p;
        if (len && !body)
            goto out;
        if (got > len)
            got = len; /* (a pipelined next request is not expected from these clients) */
        memcpy(body, end + 4, got);
        have = 0;
        int fail = ex && strcasestr(ex, "100-continue") && got < len &&
                   send_all(c->fd, "HTTP/1.1 100 Continue\r\n\r\n", 25);
        while (!fail && got < len) {
            ssize_t k = recv(c->fd, body + got, len - got, 0);
            fail = k <= 0;
            got += k > 0 ? (size_t)k : 0;
        }
        buf_put(c->s, b);
        if (fail || send_all(c->fd, c->s->answer, c->s->answer_len))
            goto out;
        atomic_fetch_add(&c->s->answered, 1);
    }
out:
    return NULL;
}

static void *accept_main(void *arg)
{
    struct null_http *s = arg;
    for (int fd; (fd = accept(s->lfd, NULL, NULL)) >= 0;) {
        struct conn *c = calloc(1, sizeof *c);
        if (!c) {
            close(fd);
            continue;
        }
        *c = (struct conn){fd, 0, s, NULL};
        pthread_mutex_lock(&s->mu);
        if (pthread_create(&c->th, NULL, serve, c)) {
            close(fd);
            free(c);
        } else {
            c->next = s->conns;
            s->conns = c;
        }
        pthread_mutex_unlock(&s->mu);
    }
    return NULL;
}

struct null_http *null_http_start(size_t answer_bytes)
{
    struct null_http *s = calloc(1, sizeof *s);
    char h[160];
    int hl = snprintf(h, sizeof h, "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: %zu\r\n\r\n",
                      answer_bytes);
    if (!s || !(s->answer = malloc((size_t)hl + answer_bytes)))
        return free(s), NULL;
    memcpy(s->answer, h, (size_t)hl);
    for (size_t i = 0; i < answer_bytes; i++) /* touched: no page faults while timed */
        s->answer[hl + i] = (char)(i * 131);
    s->answer_len = (size_t)hl + answer_bytes;
    pthread_mutex_init(&s->mu, NULL);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    s->lfd = socket(AF_INET, SOCK_STREAM, 0);
    if (s->lfd < 0 || bind(s->lfd, (struct sockaddr *)&a, sizeof a) || listen(s->lfd, 256) ||
        getsockname(s->lfd, (struct sockaddr *)&a, &al) || pthread_create(&s->acceptor, NULL, accept_main, s)) {
        if (s->lfd >= 0)
            close(s->lfd);
        free(s->answer);
        free(s);
        return NULL;
    }
    snprintf(s->base, sizeof s->base, "http://127.0.0.1:%d", ntohs(a.sin_port));
    return s;
}

const char *null_http_base(const struct null_http *s) { return s->base; }

long null_http_stop(struct null_http *s)
{
    shutdown(s->lfd, SHUT_RDWR); /* wakes the acceptor */
    pthread_join(s->acceptor, NULL);
    close(s->lfd);
    for (struct conn *c = s->conns, *n; c; c = n) {
        n = c->next;
        shutdown(c->fd, SHUT_RDWR);
        pthread_join(c->th, NULL);
        close(c->fd);
        free(c);
    }
    long answered = atomic_load(&s->answered);
    for (int i = 0; i < s->nspare; i++)
        free(s->spare[i].p);
    pthread_mutex_destroy(&s->mu);
    free(s->answer);
    free(s);
    return answered;
}
