/* Slow clients the idle timeout cannot catch. libmicrohttpd closes a connection that sends and
 * reads nothing for --conn-timeout seconds, but a client that trickles its request line and
 * headers a byte at a time is never idle that long. The watchdog follows every connection
 * (libmicrohttpd's connection notifications) and cuts one whose headers have not all arrived
 * --conn-timeout + 1 seconds after it opened or after its last answer: an idle connection is
 * closed by then already, so whatever is left is trickling. (A body trickled too slowly is
 * refused where its bytes arrive: http.c, QD_MIN_BODY_RATE.) */
#ifndef QD_WATCHDOG_H
#define QD_WATCHDOG_H

#include <microhttpd.h>

/* Starts the watchdog thread; 0, or -1 when the thread cannot start. */
int qd_watch_start(int conn_timeout_s);
void qd_watch_stop(void);

/* MHD_OPTION_NOTIFY_CONNECTION: follows a connection from its start to its close. */
void qd_watch_notify(void *cls, struct MHD_Connection *mc, void **socket_context,
                     enum MHD_ConnectionNotificationCode code);

/* A request's headers are in (1) or its answer is done (0: the wait for the next begins). */
void qd_watch_request(struct MHD_Connection *mc, int in_request);

/* Called on a libmicrohttpd thread that is about to answer 431 itself (its connection buffer is
 * full of request line and headers): the descriptor of that thread's connection, waiting for
 * the headers of a request, that has received the most bytes since its last answer, at least
 * min_bytes; -1 when none has. Only a connection sending at least that much without finishing
 * its headers qualifies, and it is at the limit too. */
int qd_watch_oversized_head(unsigned long long min_bytes);

/* Shuts every connection down (the stop, after the drain): libmicrohttpd sees each end and closes
 * it the usual way. */
void qd_watch_close_all(void);

/* Connections cut so far (for /metrics). */
long qd_watch_cut_total(void);

#endif
