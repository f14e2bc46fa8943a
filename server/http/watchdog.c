/* The slow-header watchdog of watchdog.h. One list under one lock: a connection is added when
 * it starts and removed when libmicrohttpd tells it closed, which it does before it closes the
 * socket, so the watchdog never shuts down a descriptor that has been reused. It shuts the
 * socket down (it does not close it): libmicrohttpd then sees the end of the stream and closes
 * the connection the usual way, freeing its buffers. Each connection also keeps the thread that
 * serves it and how many bytes it had received when its last answer was done, for
 * qd_watch_oversized_head. */
#include "http/watchdog.h"

#include <linux/tcp.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct watch {
    int fd;
    _Atomic double since_s; /* when the wait for headers began */
    atomic_int in_request;
    int cut;
    pthread_t thread;                 /* the libmicrohttpd thread serving it */
    _Atomic unsigned long long rx_at; /* bytes received when its last answer was done */
    struct watch *prev, *next;
};

static struct {
    pthread_mutex_t lock;
    pthread_cond_t wake;
    struct watch *head;
    pthread_t thread;
    int running, stopping;
    double limit_s;
    atomic_long cut_total;
} W = {.lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static unsigned long long bytes_received(int fd)
{
    struct tcp_info ti;
    socklen_t n = sizeof ti;
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &n) || n < offsetof(struct tcp_info, tcpi_bytes_received) + 8)
        return 0;
    return ti.tcpi_bytes_received;
}

static void *watch_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&W.lock);
    while (!W.stopping) {
        double now = now_s();
        for (struct watch *w = W.head; w; w = w->next)
            if (!w->cut && !atomic_load(&w->in_request) && now - atomic_load(&w->since_s) > W.limit_s) {
                shutdown(w->fd, SHUT_RDWR);
                w->cut = 1;
                atomic_fetch_add(&W.cut_total, 1);
                fprintf(stderr, "{\"msg\":\"a connection trickling its request headers was cut\",\"after_s\":%.1f}\n",
                        now - atomic_load(&w->since_s));
            }
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 250 * 1000000L;
        if (until.tv_nsec >= 1000000000L)
            until.tv_sec++, until.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&W.wake, &W.lock, &until);
    }
    pthread_mutex_unlock(&W.lock);
    return NULL;
}

int qd_watch_start(int conn_timeout_s)
{
    W.limit_s = conn_timeout_s + 1.0;
    W.stopping = 0;
    if (pthread_create(&W.thread, NULL, watch_main, NULL))
        return -1;
    W.running = 1;
    return 0;
}

void qd_watch_stop(void)
{
    if (!W.running)
        return;
    pthread_mutex_lock(&W.lock);
    W.stopping = 1;
    pthread_cond_signal(&W.wake);
    pthread_mutex_unlock(&W.lock);
    pthread_join(W.thread, NULL);
    W.running = 0;
}

void qd_watch_notify(void *cls, struct MHD_Connection *mc, void **socket_context,
                     enum MHD_ConnectionNotificationCode code)
{
    (void)cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        struct watch *w = calloc(1, sizeof *w);
        if (!w || !ci) { /* not followed: the idle timeout still applies */
            free(w);
            return;
        }
        w->fd = ci->connect_fd;
        w->thread = pthread_self(); /* (notified on the thread that serves it) */
        atomic_store(&w->since_s, now_s());
        pthread_mutex_lock(&W.lock);
        w->next = W.head;
        if (W.head)
            W.head->prev = w;
        W.head = w;
        pthread_mutex_unlock(&W.lock);
        *socket_context = w;
        return;
    }
    struct watch *w = *socket_context; /* MHD_CONNECTION_NOTIFY_CLOSED, before the socket closes */
    if (!w)
        return;
    pthread_mutex_lock(&W.lock);
    if (w->prev)
        w->prev->next = w->next;
    else
        W.head = w->next;
    if (w->next)
        w->next->prev = w->prev;
    pthread_mutex_unlock(&W.lock);
    free(w);
    *socket_context = NULL;
}

void qd_watch_request(struct MHD_Connection *mc, int in_request)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    struct watch *w = ci ? ci->socket_context : NULL;
    if (!w)
        return;
    if (!in_request) {
        atomic_store(&w->since_s, now_s());
        atomic_store(&w->rx_at, bytes_received(w->fd));
    }
    atomic_store(&w->in_request, in_request);
}

int qd_watch_oversized_head(unsigned long long min_bytes)
{
    int fd = -1;
    unsigned long long most = 0;
    pthread_t self = pthread_self();
    pthread_mutex_lock(&W.lock);
    for (struct watch *w = W.head; w; w = w->next) {
        if (!pthread_equal(w->thread, self) || atomic_load(&w->in_request))
            continue;
        unsigned long long got = bytes_received(w->fd) - atomic_load(&w->rx_at);
        if (got >= min_bytes && got > most)
            most = got, fd = w->fd;
    }
    pthread_mutex_unlock(&W.lock);
    return fd;
}

void qd_watch_close_all(void)
{
    pthread_mutex_lock(&W.lock);
    for (struct watch *w = W.head; w; w = w->next)
        shutdown(w->fd, SHUT_RDWR);
    pthread_mutex_unlock(&W.lock);
}

long qd_watch_cut_total(void) { return atomic_load(&W.cut_total); }
