/* quantd healthcheck: a tiny HTTP/1.0 GET of /healthz (or --path) over a plain socket, for
 * container HEALTHCHECKs on images without curl. Exit 0 on a 200, 1 otherwise. */
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "service/serve.h"

int qd_healthcheck_main(int argc, char **argv)
{
    const char *listen = getenv("QUANTD_LISTEN"), *path = "/healthz";
    for (int i = 0; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--listen"))
            listen = argv[i + 1];
        else if (!strcmp(argv[i], "--path"))
            path = argv[i + 1];
        else {
            fprintf(stderr, "usage: quantd healthcheck [--listen ADDR:PORT] [--path /healthz]\n");
            return 2;
        }
    }
    char host[128];
    snprintf(host, sizeof host, "%s", listen && *listen ? listen : "127.0.0.1:8080");
    char *colon = strrchr(host, ':');
    if (!colon)
        return 2;
    *colon = 0;
    const char *node = host;
    /* a wildcard listen address is probed on loopback */
    if (!strcmp(host, "0.0.0.0") || !*host)
        node = "127.0.0.1";
    else if (!strcmp(host, "[::]"))
        node = "::1";
    else if (host[0] == '[') {
        node = host + 1;
        host[strlen(host) - 1] = 0;
    }
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai;
    if (getaddrinfo(node, colon + 1, &hints, &ai))
        return 1;
    int fd = socket(ai->ai_family, SOCK_STREAM, 0), ok = 0;
    struct timeval tv = {.tv_sec = 3};
    if (fd >= 0) {
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
            char req[256], resp[64] = {0};
            int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n", path, node);
            if (write(fd, req, (size_t)n) == n && read(fd, resp, sizeof resp - 1) > 12)
                ok = !strncmp(resp, "HTTP/1.", 7) && !strncmp(resp + 8, " 200", 4);
        }
        close(fd);
    }
    freeaddrinfo(ai);
    if (!ok)
        fprintf(stderr, "quantd healthcheck: %s:%s%s did not answer 200\n", node, colon + 1, path);
    return ok ? 0 : 1;
}
