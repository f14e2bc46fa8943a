/* The lingering close of linger.h. The lingering connections sit in one list under one lock,
 * oldest first: all share one timeout, so the list is in the order of their deadlines and the
 * thread only ever looks at its head for the next one. Only the thread ends a connection
 * (qd_linger_stop after it has stopped), so an epoll event never points to a freed one. */
#include "http/linger.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "http/listener.h"
#include "http/reply.h"

/* Read from one connection per wake-up before the others get their turn (it stays readable, and
 * the next epoll_wait returns it again): a fast client does not starve the slow ones. */
#define QD_LINGER_TURN_BYTES (1 << 20)

struct lingering {
    int fd;
    double deadline_s;
    unsigned long long bytes; /* dropped so far */
    struct lingering *prev, *next;
};

static struct {
    pthread_mutex_t lock;
    struct lingering *head, *tail;
    int running, stopping;
    int epoll_fd, wake_fd;
    pthread_t thread;
    double timeout_s;
    unsigned long long max_bytes;
    int max_connections;
    atomic_int count; /* in the list, or being handed over */
    atomic_ulong lingered, full;
    atomic_ullong bytes;
} G = {.lock = PTHREAD_MUTEX_INITIALIZER, .epoll_fd = -1, .wake_fd = -1};

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* Unlinks, closes and frees l (its place under --max-connections is free again). Lock held. */
static void end(struct lingering *l)
{
    if (l->prev)
        l->prev->next = l->next;
    else
        G.head = l->next;
    if (l->next)
        l->next->prev = l->prev;
    else
        G.tail = l->prev;
    epoll_ctl(G.epoll_fd, EPOLL_CTL_DEL, l->fd, NULL);
    qd_listener_closed(l->fd); /* (before the close: accept may return the number next) */
    close(l->fd); /* unread bytes left (the byte bound): the kernel resets the connection */
    atomic_fetch_sub(&G.count, 1);
    free(l);
}

/* Reads and drops what l's client sent; 1 when the lingering is over: the client closed (or
 * reset), or max_bytes are dropped. */
static int drop_input(struct lingering *l)
{
    static char sink[65536]; /* (the thread's alone) */
    size_t turn = 0;
    while (turn < QD_LINGER_TURN_BYTES) {
        unsigned long long left = G.max_bytes - l->bytes;
        ssize_t r = recv(l->fd, sink, left < sizeof sink ? (size_t)left : sizeof sink, MSG_DONTWAIT);
        if (r == 0)
            return 1;
        if (r < 0)
            return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
        l->bytes += (unsigned long long)r;
        turn += (size_t)r;
        atomic_fetch_add(&G.bytes, (unsigned long long)r);
        if (l->bytes >= G.max_bytes)
            return 1;
    }
    return 0;
}

static void *linger_main(void *arg)
{
    (void)arg;
    struct epoll_event ev[64];
    for (;;) {
        pthread_mutex_lock(&G.lock);
        double left = G.head ? G.head->deadline_s - now_s() : -1;
        int timeout_ms = !G.head ? -1 : left <= 0 ? 0 : (int)(left * 1000) + 1;
        pthread_mutex_unlock(&G.lock);
        int n = epoll_wait(G.epoll_fd, ev, 64, timeout_ms);
        if (n < 0 && errno != EINTR)
            break;
        pthread_mutex_lock(&G.lock);
        if (G.stopping) {
            pthread_mutex_unlock(&G.lock);
            break;
        }
        for (int i = 0; i < n; i++) {
            struct lingering *l = ev[i].data.ptr;
            if (!l) { /* the wake-up: a first connection, whose deadline the wait did not know */
                uint64_t v;
                if (read(G.wake_fd, &v, sizeof v) < 0 && errno != EAGAIN)
                    perror("quantd: lingering close");
            } else if (drop_input(l)) {
                end(l);
            }
        }
        for (double now = now_s(); G.head && G.head->deadline_s <= now;)
            end(G.head);
        pthread_mutex_unlock(&G.lock);
    }
    return NULL;
}

int qd_linger_start(int timeout_s, long long max_bytes, int max_connections)
{
    G.timeout_s = timeout_s;
    G.max_bytes = (unsigned long long)max_bytes;
    G.max_connections = max_connections;
    if (timeout_s <= 0 || max_bytes <= 0 || max_connections <= 0)
        return 0; /* lingering off: G.running stays 0 */
    struct epoll_event wake = {.events = EPOLLIN, .data.ptr = NULL};
    if ((G.epoll_fd = epoll_create1(EPOLL_CLOEXEC)) < 0 || (G.wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0 ||
        epoll_ctl(G.epoll_fd, EPOLL_CTL_ADD, G.wake_fd, &wake) || pthread_create(&G.thread, NULL, linger_main, NULL)) {
        if (G.epoll_fd >= 0)
            close(G.epoll_fd);
        if (G.wake_fd >= 0)
            close(G.wake_fd);
        G.epoll_fd = G.wake_fd = -1;
        return -1;
    }
    G.stopping = 0;
    G.running = 1;
    return 0;
}

static void wake(void)
{
    uint64_t one = 1;
    if (write(G.wake_fd, &one, sizeof one) != sizeof one)
        perror("quantd: lingering close");
}

void qd_linger_stop(void)
{
    pthread_mutex_lock(&G.lock);
    int was = G.running;
    G.running = 0;
    G.stopping = 1;
    if (was)
        wake();
    pthread_mutex_unlock(&G.lock);
    if (!was)
        return;
    pthread_join(G.thread, NULL);
    pthread_mutex_lock(&G.lock);
    while (G.head)
        end(G.head);
    pthread_mutex_unlock(&G.lock);
    close(G.epoll_fd);
    close(G.wake_fd);
    G.epoll_fd = G.wake_fd = -1;
}

int qd_linger_answer(int fd, const char *wire, size_t len)
{
    int copy = -1;
    pthread_mutex_lock(&G.lock);
    int place = G.running && atomic_load(&G.count) < G.max_connections;
    if (place)
        atomic_fetch_add(&G.count, 1);
    else if (G.running)
        atomic_fetch_add(&G.full, 1);
    pthread_mutex_unlock(&G.lock);
    struct lingering *l = place ? calloc(1, sizeof *l) : NULL;
    if (l)
        copy = fcntl(fd, F_DUPFD_CLOEXEC, 0); /* (the descriptor libmicrohttpd closes stays its own) */
    qd_reply_send_now(fd, wire, len);
    if (copy < 0) {
        free(l);
        if (place)
            atomic_fetch_sub(&G.count, 1);
        return 0;
    }
    qd_listener_held(copy);
    l->fd = copy;
    l->deadline_s = now_s() + G.timeout_s;
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = l};
    pthread_mutex_lock(&G.lock);
    if (!G.running || epoll_ctl(G.epoll_fd, EPOLL_CTL_ADD, copy, &ev)) { /* stopped meanwhile */
        pthread_mutex_unlock(&G.lock);
        qd_listener_closed(copy);
        close(copy);
        free(l);
        atomic_fetch_sub(&G.count, 1);
        return 0;
    }
    l->prev = G.tail;
    if (G.tail)
        G.tail->next = l;
    else {
        G.head = l;
        wake();
    }
    G.tail = l;
    atomic_fetch_add(&G.lingered, 1);
    pthread_mutex_unlock(&G.lock);
    return 1;
}

void qd_linger_stats(struct qd_linger_stats *s)
{
    s->lingering = atomic_load(&G.count);
    s->lingered = atomic_load(&G.lingered);
    s->bytes = atomic_load(&G.bytes);
    s->full = atomic_load(&G.full);
}
