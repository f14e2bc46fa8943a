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
 * libmicrohttpd a limit it cannot reach (http.c). A connection over the limit that sends GET
 * /healthz within QD_PROBE_WAIT_MS is answered 200 by the acceptor itself (listener.c,
 * wait_or_settle): a flood does not fail the liveness probe. */
#ifndef QD_LISTENER_H
#define QD_LISTENER_H

#include <stddef.h>

/* How long a connection over the limit may take to send its request (a probe's GET /healthz),
 * and how many such connections wait at once (descriptors taken from QD_FD_RESERVE's room). */
#define QD_PROBE_WAIT_MS 250
#define QD_PROBE_WAITING 64

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
/* A copy of a connection's descriptor, on fd, keeps the connection open after libmicrohttpd
 * let go of it (linger.h): it holds a place until qd_listener_closed(fd). */
void qd_listener_held(int fd);
/* Connections open now, those refused for the limit since the start, and the GET /healthz
 * answered over the limit. */
int qd_listener_connections(void);
long qd_listener_refused(void);
long qd_listener_probes(void);
/* Stops accepting; the socket stays open, so clients wait in its backlog rather than being
 * refused, until qd_listener_close. Safe to call twice. */
void qd_listener_stop(void);
void qd_listener_close(void);

#endif
