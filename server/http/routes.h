/* The HTTP route table (routes.c): a request's path finds its route, which says which methods it
 * takes, whether it needs the token, and carries its handlers. */
#ifndef QD_ROUTES_H
#define QD_ROUTES_H

#include "http/conn.h"

struct qd_http_route {
    const char *path;
    enum qd_route id;     /* for the metrics */
    const char *methods;  /* space-separated, for matching */
    const char *allow;    /* the Allow header of its 405 */
    int open;             /* served without the bearer token (probes, scrapes) */
    /* POST: what the query and headers decide before the body (NULL: nothing) */
    void (*precheck)(struct MHD_Connection *mc, struct conn *c);
    /* the answer once the body is in (or a job queued and the connection suspended) */
    enum MHD_Result (*answer)(struct MHD_Connection *mc, struct conn *c, const char *method);
    enum qd_op op;        /* POST: the work it asks for (/jobs: unless its query names another) */
    int async;            /* POST /jobs: answered 202, the job kept in the store */
    int model_body;       /* the body is a model file (--max-convert-bytes, spooled to disk) */
};

/* The route of path (with or without /v1); job paths fill id and *sub (0: /jobs/{id}, 1:
 * /jobs/{id}/result). NULL for 404. */
const struct qd_http_route *qd_http_route_find(const char *path, char *id, size_t idlen, int *sub);
/* Whether method is one of the space-separated list. */
int qd_http_method_in(const char *method, const char *list);

#endif
