/* Service benchmark: a real `quantd serve` on loopback, N concurrent clients, requests/s and
 * MB/s of input for small and large tensors sent as a raw body, as JSON/base64, and answered
 * as JSON or as safetensors. Usage: bench_service [seconds per case] [clients, or with
 * QUANTD_BENCH_BIG a list of counts: 1,4,16]; BENCH_JSON=FILE also writes the rows as JSON;
 * BENCH_NO_NULL leaves the null server's rows out.
 *
 * Each run first measures the ceiling the service is held to: raw TCP over loopback with the
 * same number of connections (each sending 4 MiB writes to a reader for the same time), and
 * each case prints its MB/s as a share of it, the CPU cores the server and the clients kept busy,
 * and where the requests' time went: the mean of
 * the server's per-request phases from its access log (receiving the body, the queue, running:
 * of which the copies to and from the device and the kernel, sending the answer) beside the
 * mean request time the clients saw. Two kinds of client: lean ones (a kept connection, 2 MiB
 * upload writes, a reused answer buffer: a program feeding the service) and curl-like ones (a
 * new connection per request and curl's own defaults: its buffer sizes, Expect: 100-continue). */
#define _GNU_SOURCE /* RUSAGE_THREAD */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>
#include <curl/curl.h>

#include "../tests/server/service.h"
#include "../server/queue/jobs.h"
#include "null_http.h"

struct load {
    const char *base; /* quantd's, or the null server's */
    const char *path;
    const char *const *headers;
    const void *body;
    size_t len;
    double until_us;
    int curl_like;
    long done, failed;
    double busy_us; /* the requests' time as this client saw it */
    double cpu_s;   /* this client thread's own CPU time */
    size_t answer;  /* the last answer's size */
};

/* CPU seconds (user and system) of the calling thread, or of the whole process. */
static double cpu_seconds(int who)
{
    struct rusage u;
    if (getrusage(who, &u))
        return 0;
    return (double)(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

/* CPU seconds of process `pid` so far (/proc/PID/stat: utime and stime), 0 where unknown. */
static double pid_cpu_seconds(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')'); /* the name may hold spaces; the fields follow it */
    unsigned long long ut = 0, st = 0;
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
        return 0;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static size_t discard(char *data, size_t size, size_t nmemb, void *arg) { return size * nmemb; }

/* One request as `curl --data-binary @FILE -o /dev/null URL` makes it: a fresh handle and
 * connection, curl's default buffer sizes and its Expect: 100-continue for a large body. */
static long curl_like_request(const char *url, struct curl_slist *h, const struct load *l)
{
    CURL *c = curl_easy_init();
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, l->body);
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)l->len);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, discard);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 120L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    long status = 0;
    if (curl_easy_perform(c) == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(c);
    return status;
}

/* A lean client, as a program feeding the service would be: one connection kept alive, 2 MiB
 * upload writes, the answer into a reused buffer. An answer counts when it is a non-empty 200
 * (a curl-like one: a 200). */
static void *client(void *arg)
{
    struct load *l = arg;
    char url[4096];
    double cpu0 = cpu_seconds(RUSAGE_THREAD);
    snprintf(url, sizeof url, "%s%s", l->base, l->path);
    struct curl_slist *h = l->curl_like ? NULL : curl_slist_append(NULL, "Expect:");
    for (int i = 0; l->headers && l->headers[i]; i++)
        h = curl_slist_append(h, l->headers[i]);
    CURL *c = curl_easy_init();
    struct sink a = {0}; /* one answer buffer, reused: no fresh pages to fault in per answer */
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, l->body);
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)l->len);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, http_sink);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &a);
    curl_easy_setopt(c, CURLOPT_UPLOAD_BUFFERSIZE, 2L << 20);
    curl_easy_setopt(c, CURLOPT_BUFFERSIZE, 512L << 10);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 120L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    while (qd_now_us() < l->until_us) {
        a.n = 0;
        long status = 0;
        double t0 = qd_now_us();
        if (l->curl_like)
            status = curl_like_request(url, h, l);
        else if (curl_easy_perform(c) == CURLE_OK)
            curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
        l->busy_us += qd_now_us() - t0;
        if (status == 200 && (a.n > 0 || l->curl_like))
            l->done++;
        else
            l->failed++;
    }
    l->answer = a.n;
    curl_easy_cleanup(c);
    curl_slist_free_all(h);
    free(a.p);
    l->cpu_s = cpu_seconds(RUSAGE_THREAD) - cpu0;
    return NULL;
}

/* ---- the loopback ceiling --------------------------------------------------------------------- */

struct stream {
    int fd;
    double until_us;
    uint64_t bytes;
};

static void *stream_send(void *arg)
{
    struct stream *e = arg;
    static char buf[4u << 20]; /* (read only: shared by the senders) */
    while (qd_now_us() < e->until_us)
        if (send(e->fd, buf, sizeof buf, MSG_NOSIGNAL) <= 0)
            break;
    shutdown(e->fd, SHUT_WR);
    return NULL;
}

static void *stream_recv(void *arg)
{
    struct stream *e = arg;
    char *buf = malloc(1u << 20);
    for (ssize_t k; buf && (k = recv(e->fd, buf, 1u << 20, 0)) > 0;)
        e->bytes += (uint64_t)k;
    free(buf);
    return NULL;
}

/* GB/s that `conns` TCP connections over loopback carry in one direction for `seconds`; *cores:
 * the CPU cores the senders and readers kept busy. */
static double loopback_gbs(int conns, double seconds, double *cores)
{
    *cores = 0;
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof a) || listen(lfd, conns) ||
        getsockname(lfd, (struct sockaddr *)&a, &al))
        return 0;
    struct stream tx[64], rx[64];
    pthread_t tt[64], rt[64];
    double t0 = qd_now_us();
    for (int i = 0; i < conns; i++) {
        tx[i] = (struct stream){socket(AF_INET, SOCK_STREAM, 0), t0 + seconds * 1e6, 0};
        if (connect(tx[i].fd, (struct sockaddr *)&a, sizeof a))
            return 0;
        rx[i] = (struct stream){accept(lfd, NULL, NULL), 0, 0};
    }
    t0 = qd_now_us();
    double cpu0 = cpu_seconds(RUSAGE_SELF);
    for (int i = 0; i < conns; i++) {
        tx[i].until_us = t0 + seconds * 1e6;
        pthread_create(&rt[i], NULL, stream_recv, &rx[i]);
        pthread_create(&tt[i], NULL, stream_send, &tx[i]);
    }
    uint64_t total = 0;
    for (int i = 0; i < conns; i++) {
        pthread_join(tt[i], NULL);
        pthread_join(rt[i], NULL);
        total += rx[i].bytes;
        close(tx[i].fd);
        close(rx[i].fd);
    }
    close(lfd);
    double el = (qd_now_us() - t0) / 1e6;
    *cores = (cpu_seconds(RUSAGE_SELF) - cpu0) / el;
    return (double)total / el / 1e9;
}

/* ---- the server's phases ---------------------------------------------------------------------- */

enum { RECV, QUEUE, RUN, H2D, KERNEL, D2H, SEND, NPHASES };
static const char *const phase_keys[NPHASES] = {"\"recv\":", "\"queue\":", "\"run\":", "\"h2d\":",
                                                "\"kernel\":", "\"d2h\":", "\"send\":"};

static long log_size(const struct server *s)
{
    FILE *f = fopen(s->log, "rb");
    long n = 0;
    if (f && fseek(f, 0, SEEK_END) == 0)
        n = ftell(f);
    if (f)
        fclose(f);
    return n;
}

/* The mean of each phase (ms) over the access-log lines the server wrote after byte `from`. */
static int mean_phases(const struct server *s, long from, double mean[NPHASES])
{
    memset(mean, 0, NPHASES * sizeof mean[0]);
    FILE *f = fopen(s->log, "rb");
    if (!f || fseek(f, from, SEEK_SET)) {
        if (f)
            fclose(f);
        return 0;
    }
    static char line[8192];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        const char *ph = strstr(line, "\"phases_ms\":");
        if (!ph)
            continue;
        n++;
        for (int k = 0; k < NPHASES; k++) {
            const char *v = strstr(ph, phase_keys[k]);
            mean[k] += v ? atof(v + strlen(phase_keys[k])) : 0;
        }
    }
    fclose(f);
    for (int k = 0; n && k < NPHASES; k++)
        mean[k] /= n;
    return n;
}

/* Busy and total jiffies of all cores so far (/proc/stat), 0 where there is none. */
static void cpu_jiffies(unsigned long long *busy, unsigned long long *total)
{
    unsigned long long v[8] = {0};
    FILE *f = fopen("/proc/stat", "r");
    if (!f || fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
                     &v[6], &v[7]) != 8)
        memset(v, 0, sizeof v);
    if (f)
        fclose(f);
    *total = v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
    *busy = *total - v[3] - v[4]; /* less idle and iowait */
}

static double ceiling_gbs; /* the loopback ceiling of this run, same client count */
static int quiet;          /* a warm-up: no row */
static FILE *json;         /* BENCH_JSON: every row, for bench/plot_service.py */
static int json_rows;

/* One case: `clients` threads for `seconds` against quantd (s) or, with s NULL, the null server
 * at base. Prints the row; returns the size of an answer. */
static size_t run_case(const struct server *s, const char *base, const char *name, const char *path,
                       const char *const *headers, const void *body, size_t len, size_t tensor_bytes, double seconds,
                       int clients, int curl_like)
{
    struct load l[64];
    pthread_t th[64];
    long from = s ? log_size(s) : 0;
    unsigned long long b0, j0, b1, j1;
    cpu_jiffies(&b0, &j0);
    double srv0 = s ? pid_cpu_seconds(s->pid) : 0, self0 = cpu_seconds(RUSAGE_SELF);
    double t0 = qd_now_us();
    for (int i = 0; i < clients; i++) {
        l[i] = (struct load){.base = base, .path = path, .headers = headers, .body = body, .len = len,
                            .until_us = t0 + seconds * 1e6, .curl_like = curl_like};
        pthread_create(&th[i], NULL, client, &l[i]);
    }
    long done = 0, failed = 0;
    double busy = 0, cli_s = 0;
    for (int i = 0; i < clients; i++) {
        pthread_join(th[i], NULL);
        done += l[i].done;
        failed += l[i].failed;
        busy += l[i].busy_us;
        cli_s += l[i].cpu_s;
    }
    double el = (qd_now_us() - t0) / 1e6, ph[NPHASES] = {0};
    cpu_jiffies(&b1, &j1);
    /* the server's CPU: quantd's process, or this one's less its clients (the null server) */
    double srv_s = s ? pid_cpu_seconds(s->pid) - srv0 : cpu_seconds(RUSAGE_SELF) - self0 - cli_s;
    if (s) {
        usleep(100000); /* the last lines of the access log */
        mean_phases(s, from, ph);
    }
    if (quiet)
        return clients ? l[0].answer : 0;
    /* the row's figures, for the table and the JSON alike */
    const double req_s = done / el, mb_in = done * (double)tensor_bytes / el / 1e6,
                 loop_pct = ceiling_gbs > 0 ? 100 * (done * (double)len / el / 1e9) / ceiling_gbs : 0,
                 cpu_pct = j1 > j0 ? 100.0 * (double)(b1 - b0) / (double)(j1 - j0) : 0,
                 client_ms = done + failed ? busy / 1e3 / (double)(done + failed) : 0, srv_cores = srv_s / el,
                 cli_cores = cli_s / el;
    printf("| %-58s | %7d | %9.1f | %9.1f | %5.0f %% | %4.0f %% | %5.1f | %5.1f | %6ld | %7.2f | %6.2f | %6.2f | "
           "%6.2f | %6.2f | %6.2f | %6.2f | %6.2f |\n",
           name, clients, req_s, mb_in, loop_pct, cpu_pct, srv_cores, cli_cores, failed, client_ms, ph[RECV],
           ph[QUEUE], ph[RUN], ph[H2D], ph[KERNEL], ph[D2H], ph[SEND]);
    fflush(stdout);
    if (json)
        fprintf(json,
                "%s{\"case\":\"%s\",\"clients\":%d,\"curl_like\":%d,\"null_server\":%d,\"req_s\":%.2f,"
                "\"mb_s_in\":%.1f,\"loopback_gb_s\":%.3f,\"cpu_pct\":%.1f,\"server_cores\":%.2f,"
                "\"client_cores\":%.2f,\"failed\":%ld,\"client_ms\":%.3f,\"recv_ms\":%.3f,\"queue_ms\":%.3f,"
                "\"run_ms\":%.3f,\"h2d_ms\":%.3f,\"kernel_ms\":%.3f,\"d2h_ms\":%.3f,\"send_ms\":%.3f}",
                json_rows++ ? ",\n" : "", name, clients, curl_like, s == NULL, req_s, mb_in, ceiling_gbs, cpu_pct,
                srv_cores, cli_cores, failed, client_ms, ph[RECV], ph[QUEUE], ph[RUN], ph[H2D], ph[KERNEL], ph[D2H],
                ph[SEND]);
    return clients ? l[0].answer : 0;
}

static int big_cases(double seconds, int clients, int last)
{
    /* 64 MiB raw bf16 bodies, binary answers: the default workers (N streams) with lean and
     * curl-like clients, then (at the last client count) one worker, one stream; then the same
     * clients against the null server answering as many bytes as quantd did (what the clients
     * and the loopback reach with a server that does nothing) */
    size_t n = (size_t)4096 * 8192, bytes = n * 2, answer[3] = {0};
    static uint16_t *h;
    if (!h) {
        float *x = random_f32(n);
        h = malloc(bytes);
        f32_to_bf16(x, h, n);
        free(x);
    }
    const char *bin_h[] = {"Content-Type: application/octet-stream", "Accept: application/octet-stream", NULL};
    const char *flag_sets[2][3] = {{NULL}, {"--workers", "1", NULL}};
    const char *fmts[3] = {"nvfp4", "q8_0", "nf4"};
    char path[128], name[128];
    for (int k = 0; k < (last ? 2 : 1); k++) {
        struct server s;
        server_start(&s, flag_sets[k][0] ? flag_sets[k] : NULL);
        /* a second of the first case first, untimed: the pinned pool fills (about half a
         * second per GB pinned) and the workers' device buffers grow to size, as in any
         * service that has run a while */
        quiet = 1;
        snprintf(path, sizeof path, "/quantize?fmt=%s&dtype=bf16&shape=4096,8192", fmts[0]);
        run_case(&s, s.base, "warm-up", path, bin_h, h, bytes, bytes, 1, clients, 0);
        quiet = 0;
        for (int curl_like = 0; curl_like < 2 - k; curl_like++)
            for (int f = 0; f < 3 - k; f++) {
                snprintf(path, sizeof path, "/quantize?fmt=%s&dtype=bf16&shape=4096,8192", fmts[f]);
                snprintf(name, sizeof name, "64 MiB bf16 -> safetensors, %s, %s, %s", fmts[f],
                         k ? "1 stream" : "N streams", curl_like ? "curl-like" : "lean");
                size_t a = run_case(&s, s.base, name, path, bin_h, h, bytes, bytes, seconds, clients, curl_like);
                if (!k && !curl_like)
                    answer[f] = a;
            }
        if (server_stop(&s))
            return 1;
    }
    for (int f = 0; f < 3 && !getenv("BENCH_NO_NULL"); f++) {
        struct null_http *z = answer[f] ? null_http_start(answer[f]) : NULL;
        if (!z)
            continue;
        quiet = 1; /* its buffers faulted in first, as quantd's pool is */
        run_case(NULL, null_http_base(z), "warm-up", "/", NULL, h, bytes, bytes, 0.5, clients, 0);
        quiet = 0;
        for (int curl_like = 0; curl_like < 2; curl_like++) {
            snprintf(name, sizeof name, "64 MiB bf16, null server, %s-sized answer, %s", fmts[f],
                     curl_like ? "curl-like" : "lean");
            run_case(NULL, null_http_base(z), name, "/", NULL, h, bytes, bytes, seconds, clients, curl_like);
        }
        null_http_stop(z);
    }
    return 0;
}

int main(int argc, char **argv)
{
    curl_global_init(CURL_GLOBAL_DEFAULT); /* before the client threads' handles */
    double seconds = argc > 1 ? atof(argv[1]) : 3;
    /* clients: a count, or (big cases) a list such as 1,4,16 for the scaling curve */
    int counts[8], ncounts = 0;
    for (char *c = argc > 2 ? argv[2] : "8"; *c && ncounts < 8; c += *c == ',') {
        int v = (int)strtol(c, &c, 10);
        counts[ncounts++] = v < 1 ? 1 : v > 64 ? 64 : v;
    }
    if (getenv("BENCH_JSON") && !(json = fopen(getenv("BENCH_JSON"), "w")))
        return 1;
    if (json)
        fprintf(json, "{\"rows\":[\n");
    const char *header =
        "| case (nvfp4 quantize unless named)                         | clients |   req/s   | MB/s in   | % loop |  cpu  |  srv  |  cli  | failed | "
        "client  |  recv  | queue  |  run   |  h2d   | kernel |  d2h   |  send  |\n"
        "|------------------------------------------------------------|---------|-----------|-----------|--------|-------|-------|-------|--------|"
        "---------|--------|--------|--------|--------|--------|--------|--------|\n";
    int big = getenv("QUANTD_BENCH_BIG") != NULL, rc = 0;
    for (int c = 0; c < (big ? ncounts : 1) && !rc; c++) {
        double loop_cores;
        ceiling_gbs = loopback_gbs(counts[c], seconds, &loop_cores);
        printf("%s# loopback TCP, %d connections: %.2f GB/s, %.1f cores busy (%% loop: request bodies' bytes\n"
               "# against it; cpu: all cores' busy share over the case, clients included; srv, cli: the cores\n"
               "# the server process and the client threads kept busy)\n"
               "# client ms: a request's mean time as the clients saw it; the rest: the server's mean phases (ms),\n"
               "# run = h2d + kernel + d2h on the GPU + decoding and encoding on the host\n\n%s",
               c ? "\n" : "", counts[c], ceiling_gbs, loop_cores, header);
        if (big)
            rc = big_cases(seconds, counts[c], c == ncounts - 1);
    }
    if (big || rc) {
        if (json)
            fprintf(json, "\n]}\n"), fclose(json);
        return rc;
    }
    int clients = counts[0];
    const char *json_h[] = {"Content-Type: application/json", NULL};
    const char *bin_h[] = {"Content-Type: application/octet-stream", "Accept: application/octet-stream", NULL};
    struct server s;
    server_start(&s, NULL);
    struct { const char *label; int rows, cols; } sizes[] = {{"256x256", 256, 256}, {"4096x4096", 4096, 4096}};
    for (int k = 0; k < 2; k++) {
        size_t n = (size_t)sizes[k].rows * sizes[k].cols, bytes = n * 2;
        float *x = random_f32(n);
        uint16_t *h = malloc(bytes);
        f32_to_bf16(x, h, n);
        char path[256], name[128], *b64 = b64_encode(h, bytes);
        size_t jlen = strlen(b64) + 128;
        char *json = malloc(jlen);
        snprintf(json, jlen, "{\"dtype\":\"bf16\",\"shape\":[%d,%d],\"data\":\"%s\"}", sizes[k].rows, sizes[k].cols, b64);
        snprintf(path, sizeof path, "/quantize?fmt=nvfp4&dtype=bf16&shape=%d,%d", sizes[k].rows, sizes[k].cols);
        snprintf(name, sizeof name, "%s bf16 raw -> JSON", sizes[k].label);
        run_case(&s, s.base, name, path, NULL, h, bytes, bytes, seconds, clients, 0);
        snprintf(name, sizeof name, "%s bf16 raw -> safetensors", sizes[k].label);
        run_case(&s, s.base, name, path, bin_h, h, bytes, bytes, seconds, clients, 0);
        snprintf(name, sizeof name, "%s bf16 JSON -> JSON", sizes[k].label);
        run_case(&s, s.base, name, "/quantize?fmt=nvfp4", json_h, json, strlen(json), bytes, seconds, clients, 0);
        snprintf(path, sizeof path, "/quantize?fmt=q8_0&dtype=bf16&shape=%d,%d", sizes[k].rows, sizes[k].cols);
        snprintf(name, sizeof name, "%s bf16 raw -> safetensors, q8_0", sizes[k].label);
        run_case(&s, s.base, name, path, bin_h, h, bytes, bytes, seconds, clients, 0);
        snprintf(name, sizeof name, "%s bf16 raw -> safetensors, q8_0, curl-like", sizes[k].label);
        run_case(&s, s.base, name, path, bin_h, h, bytes, bytes, seconds, clients, 1);
        free(json);
        free(b64);
        free(h);
        free(x);
    }
    if (json)
        fprintf(json, "\n]}\n"), fclose(json);
    return server_stop(&s) ? 1 : 0;
}
