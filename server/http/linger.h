/* The lingering close (nginx's lingering_close): an error answered before or in the middle of a
 * body the client is still sending (413, 401, 431, a full disk ...) goes out at once, and then
 * the rest of the body is read and dropped for a while before the connection closes. A client
 * that writes its whole body before it reads (Python's urllib and requests) would otherwise
 * meet a reset while it writes, and never read the answer; curl reads the answer either way.
 *
 * One thread (epoll) reads every lingering connection until the client closes, --linger-bytes
 * have been dropped or --linger-timeout seconds have passed, then closes it. At most
 * --linger-connections linger at once; each keeps its place under --max-connections (listener.h)
 * while it lingers, so lingering never takes descriptors beyond that limit. Past the count, an
 * early answer closes the connection at once, as without lingering. */
#ifndef QD_LINGER_H
#define QD_LINGER_H

#include <stddef.h>

/* Starts the thread. timeout_s, max_bytes or max_connections 0: no lingering (every early answer
 * closes at once). 0, or -1 when the thread cannot start. */
int qd_linger_start(int timeout_s, long long max_bytes, int max_connections);
/* Closes every lingering connection and stops the thread; later answers close at once. */
void qd_linger_stop(void);

/* Writes the answer (wire, len bytes: qd_reply_wire) to the connection on fd as far as the socket
 * takes it now and ends its sending side, then, when a lingering place is free, lingers on a
 * copy of fd: the caller closes fd as usual (libmicrohttpd), the socket stays open until the
 * lingering ends. 1 when it lingers, 0 when the connection closes at once. */
int qd_linger_answer(int fd, const char *wire, size_t len);

struct qd_linger_stats {
    int lingering;                  /* connections lingering now */
    unsigned long lingered;         /* connections that lingered, since the start */
    unsigned long long bytes;       /* body bytes read and dropped while lingering */
    unsigned long full;             /* early answers closed at once: every place taken */
};
void qd_linger_stats(struct qd_linger_stats *s);

#endif
