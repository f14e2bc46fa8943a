/* The listening socket and the thread that accepts on it. libmicrohttpd's own accept lets its
 * pool threads race for each new connection, and the winner often takes several in a row: 16
 * clients connecting at once landed on 9 of 16 threads, some threads carrying 3 or 4 large
 * uploads while others idled. Accepting here and handing each connection over with
 * MHD_add_connection spreads them over the pool evenly (it picks the thread by descriptor).
 *
 * The acceptor also holds the connection limit. libmicrohttpd 0.9.75 (Debian 12) has a branch
 * for a thread at its limit that returns without unlocking the thread's cleanup mutex: reached
 * once, that thread and the daemon's stop wait on it forever (no request is served again, and
 * SIGTERM hangs). So quantd counts the connections it handed over (until libmicrohttpd says each
 * closed), answers one beyond --max-connections with a 503 itself and closes it, and gives
 * libmicrohttpd a limit it cannot reach (http.c). */
#ifndef QD_LISTENER_H
#define QD_LISTENER_H

#include <stddef.h>

struct addrinfo;
struct MHD_Daemon;

/* Binds and listens on the address (named `name` in err); the port bound (for port 0) in *port.
 * 0, or -1 with err. */
int qd_listener_open(const struct addrinfo *ai, const char *name, int *port, char *err, size_t errlen);
/* Starts the thread handing every accepted connection to d while fewer than max_connections are
 * open. 0 or -1. */
int qd_listener_start(struct MHD_Daemon *d, int max_connections);
/* The connection on fd is closing (libmicrohttpd's notification, which comes before it closes
 * the descriptor): its place is free. */
void qd_listener_closed(int fd);
/* Connections open now, and those refused for the limit since the start. */
int qd_listener_connections(void);
long qd_listener_refused(void);
/* Stops accepting; the socket stays open, so clients wait in its backlog rather than being
 * refused, until qd_listener_close. Safe to call twice. */
void qd_listener_stop(void);
void qd_listener_close(void);

#endif
