/* The acceptor of listener.h. */
#define _GNU_SOURCE /* accept4 */
#include "http/listener.h"

#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

static struct {
    int fd, stop_fd, running;
    pthread_t thread;
    struct MHD_Daemon *daemon;
} L = {.fd = -1, .stop_fd = -1};

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

static void *acceptor(void *arg)
{
    struct pollfd p[2] = {{.fd = L.fd, .events = POLLIN}, {.fd = L.stop_fd, .events = POLLIN}};
    for (;;) {
        if (poll(p, 2, -1) < 0 && errno != EINTR)
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
            /* (on failure libmicrohttpd closes it: over the connection limit, no memory) */
            MHD_add_connection(L.daemon, c, (struct sockaddr *)&a, al);
        }
    }
    return NULL;
}

int qd_listener_start(struct MHD_Daemon *d)
{
    L.daemon = d;
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

void qd_listener_stop(void)
{
    if (!L.running)
        return;
    uint64_t one = 1;
    if (write(L.stop_fd, &one, sizeof one) != sizeof one)
        perror("quantd: listener stop");
    pthread_join(L.thread, NULL);
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
}
