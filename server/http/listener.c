/* The acceptor of listener.h. */
#define _GNU_SOURCE /* accept4 */
#include "http/listener.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "http/reply.h"

static struct {
    int fd, stop_fd, running;
    pthread_t thread;
    struct MHD_Daemon *daemon;
    int max;             /* connections open at once */
    atomic_int open;     /* handed over and not yet closed */
    atomic_long refused; /* answered 503 for the limit */
    /* one flag per descriptor: set while a connection handed over on it is open. A connection
     * libmicrohttpd could not start (no memory for its buffer) is closed without a
     * notification; its flag is still set when accept returns the same descriptor, which then
     * takes its place in the count instead of adding to it. */
    atomic_uchar *held;
    int nheld;
    char busy[512]; /* the 503 for a connection over the limit */
    size_t busy_len;
    char healthy[256]; /* GET /healthz's answer, for one over the limit */
    size_t healthy_len;
    /* connections over the limit whose request has not arrived yet, oldest first (a ring) */
    struct { int fd; double deadline_ms; } waiting[QD_PROBE_WAITING];
    int first, nwaiting;
    atomic_long probes; /* GET /healthz answered over the limit */
} L = {.fd = -1, .stop_fd = -1};

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

int qd_listener_open(const struct addrinfo *ai, const char *name, int *port, char *err, size_t errlen)
{
    int one = 1, fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    /* SO_REUSEADDR: a restart binds while old connections sit in TIME_WAIT (not SO_REUSEPORT:
     * a second server on the same port is an error, not a silent share) */
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) ||
        (ai->ai_family == AF_INET6 && setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one)) ||
        bind(fd, ai->ai_addr, ai->ai_addrlen) || listen(fd, SOMAXCONN)) {
        snprintf(err, errlen, "cannot listen on %s: %s", name, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    struct sockaddr_storage a;
    socklen_t al = sizeof a;
    *port = getsockname(fd, (struct sockaddr *)&a, &al) ? 0
            : a.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&a)->sin6_port)
                                      : ntohs(((struct sockaddr_in *)&a)->sin_port);
    L.fd = fd;
    return 0;
}

/* A connection over the limit: whatever request already arrived is read (a close with unread
 * bytes would reset the connection, and the answer with it), then the 503, then the close. */
static void refuse(int c)
{
    char sink[16384];
    for (int i = 0; i < 4 && recv(c, sink, sizeof sink, MSG_DONTWAIT) == (ssize_t)sizeof sink; i++)
        ;
    qd_reply_send_now(c, L.busy, L.busy_len);
    close(c);
    atomic_fetch_add(&L.refused, 1);
}

enum probe { PROBE, OTHER, WAIT, GONE };

/* What a connection over the limit sent so far: a whole GET /healthz head, another request (or
 * one too long to be a probe), not enough to tell yet, or nothing more to come. */
static enum probe probe_of(int c)
{
    static const char want[] = "GET /healthz";
    char head[1024];
    ssize_t n = recv(c, head, sizeof head - 1, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0)
        return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? WAIT : GONE;
    if (n == 0)
        return GONE;
    size_t k = sizeof want - 1;
    if (memcmp(head, want, (size_t)n < k ? (size_t)n : k))
        return OTHER;
    if ((size_t)n <= k)
        return WAIT;
    if (head[k] != ' ' && head[k] != '?')
        return OTHER;
    head[n] = 0;
    return strstr(head, "\r\n\r\n") ? PROBE : n == (ssize_t)sizeof head - 1 ? OTHER : WAIT;
}

/* Answers a connection over the limit for good: /healthz its 200, anything else the 503. */
static void settle(int c, enum probe what)
{
    if (what == GONE) {
        close(c);
    } else if (what == PROBE) {
        char sink[1024]; /* the head, peeked whole: read, so that the close sends no reset */
        recv(c, sink, sizeof sink, MSG_DONTWAIT);
        qd_reply_send_now(c, L.healthy, L.healthy_len);
        close(c);
        atomic_fetch_add(&L.probes, 1);
    } else {
        refuse(c);
    }
}

/* A connection over the limit waits a moment for its request: a liveness probe must not fail
 * because a flood holds every connection (a kubelet restarts the pod after a few), so GET
 * /healthz is answered here, on the acceptor's thread, without taking a connection's place.
 * Anything else gets the 503 as soon as its request line shows it, or when its moment is
 * over; the oldest waiting one is settled to make room, so a flood of idle connections only
 * shortens the wait (a probe sends its request with its first packet). */
static void wait_or_settle(int c)
{
    enum probe what = probe_of(c);
    if (what != WAIT) {
        settle(c, what);
        return;
    }
    if (L.nwaiting == QD_PROBE_WAITING) {
        int oldest = L.waiting[L.first].fd;
        L.first = (L.first + 1) % QD_PROBE_WAITING;
        L.nwaiting--;
        settle(oldest, probe_of(oldest));
    }
    int at = (L.first + L.nwaiting++) % QD_PROBE_WAITING;
    L.waiting[at].fd = c;
    L.waiting[at].deadline_ms = now_ms() + QD_PROBE_WAIT_MS;
}

/* Settles the waiting connections whose request came or whose moment is over; the poll()
 * timeout until the next deadline (-1: none waiting). */
static int settle_waiting(void)
{
    double now = now_ms();
    int kept = 0, timeout = -1;
    for (int i = 0; i < L.nwaiting; i++) {
        int at = (L.first + i) % QD_PROBE_WAITING;
        enum probe what = probe_of(L.waiting[at].fd);
        if (what == WAIT && L.waiting[at].deadline_ms > now) {
            L.waiting[(L.first + kept++) % QD_PROBE_WAITING] = L.waiting[at];
            int left = (int)(L.waiting[at].deadline_ms - now) + 1;
            timeout = timeout < 0 || left < timeout ? left : timeout;
        } else {
            settle(L.waiting[at].fd, what == WAIT ? OTHER : what);
        }
    }
    L.nwaiting = kept;
    return timeout;
}

static void *acceptor(void *arg)
{
    struct pollfd p[2 + QD_PROBE_WAITING] = {{.fd = L.fd, .events = POLLIN}, {.fd = L.stop_fd, .events = POLLIN}};
    int timeout = -1;
    for (;;) {
        for (int i = 0; i < L.nwaiting; i++)
            p[2 + i] = (struct pollfd){.fd = L.waiting[(L.first + i) % QD_PROBE_WAITING].fd, .events = POLLIN};
        if (poll(p, 2 + (nfds_t)L.nwaiting, timeout) < 0 && errno != EINTR)
            break;
        if (p[1].revents)
            break;
        for (;;) { /* everything waiting (the socket does not block) */
            struct sockaddr_storage a;
            socklen_t al = sizeof a;
            int c = accept4(L.fd, (struct sockaddr *)&a, &al, SOCK_CLOEXEC | SOCK_NONBLOCK);
            if (c < 0) {
                /* out of descriptors or memory: the connection waits in the backlog a moment */
                if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
                    usleep(10000);
                break;
            }
            if (c >= L.nheld) { /* (descriptors stay under the limit the table was sized by) */
                close(c);
                continue;
            }
            if (!atomic_load(&L.held[c])) { /* (else: the place of a connection that never started) */
                if (atomic_load(&L.open) >= L.max) {
                    wait_or_settle(c);
                    continue;
                }
                atomic_store(&L.held[c], 1);
                atomic_fetch_add(&L.open, 1);
            }
            /* on failure libmicrohttpd has closed it (no memory) */
            if (MHD_add_connection(L.daemon, c, (struct sockaddr *)&a, al) != MHD_YES)
                qd_listener_closed(c);
        }
        timeout = settle_waiting();
    }
    return NULL;
}

int qd_listener_start(struct MHD_Daemon *d, int max_connections)
{
    struct rlimit nofile;
    if (getrlimit(RLIMIT_NOFILE, &nofile))
        return -1;
    L.nheld = nofile.rlim_cur > (1u << 24) ? 1 << 24 : (int)nofile.rlim_cur;
    if (!(L.held = calloc((size_t)L.nheld, sizeof *L.held)))
        return -1;
    L.daemon = d;
    L.max = max_connections;
    struct qd_reply busy = {0};
    qd_reply_error(&busy, 503, "too_many_connections",
                   "quantd has %d connections open, its limit (--max-connections): retry later", max_connections);
    L.busy_len = qd_reply_wire(&busy, L.busy, sizeof L.busy);
    qd_reply_free(&busy);
    /* the body http.c's /healthz route gives */
    struct qd_reply healthy = {0};
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "status", "ok");
    cJSON_AddStringToObject(o, "version", QD_VERSION);
    qd_reply_json(&healthy, 200, o);
    L.healthy_len = qd_reply_wire(&healthy, L.healthy, sizeof L.healthy);
    qd_reply_free(&healthy);
    if (!L.busy_len || !L.healthy_len)
        return -1;
    if ((L.stop_fd = eventfd(0, EFD_CLOEXEC)) < 0)
        return -1;
    if (pthread_create(&L.thread, NULL, acceptor, NULL)) {
        close(L.stop_fd);
        L.stop_fd = -1;
        return -1;
    }
    L.running = 1;
    return 0;
}

void qd_listener_closed(int fd)
{
    if (fd >= 0 && fd < L.nheld && atomic_exchange(&L.held[fd], 0))
        atomic_fetch_sub(&L.open, 1);
}

void qd_listener_held(int fd)
{
    if (fd >= 0 && fd < L.nheld && !atomic_exchange(&L.held[fd], 1))
        atomic_fetch_add(&L.open, 1);
}

int qd_listener_connections(void) { return atomic_load(&L.open); }

long qd_listener_refused(void) { return atomic_load(&L.refused); }

long qd_listener_probes(void) { return atomic_load(&L.probes); }

void qd_listener_stop(void)
{
    if (!L.running)
        return;
    uint64_t one = 1;
    if (write(L.stop_fd, &one, sizeof one) != sizeof one)
        perror("quantd: listener stop");
    pthread_join(L.thread, NULL);
    while (L.nwaiting) { /* over the limit and still silent: the 503 */
        refuse(L.waiting[L.first].fd);
        L.first = (L.first + 1) % QD_PROBE_WAITING;
        L.nwaiting--;
    }
    close(L.stop_fd);
    L.stop_fd = -1;
    L.running = 0;
}

void qd_listener_close(void)
{
    qd_listener_stop();
    if (L.fd >= 0)
        close(L.fd);
    L.fd = -1;
    free(L.held);
    L.held = NULL;
    L.nheld = 0;
}
