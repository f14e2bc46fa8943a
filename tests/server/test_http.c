/* The HTTP front's edges, driven over raw sockets where libcurl would hide them: the connection
 * limit (a flood past it leaves the service serving and SIGTERM prompt), a body refused from its
 * Content-Length at once, a chunked body cut at the limit, the JSON 431 beyond libmicrohttpd's
 * buffer, 507 when the disk is full, libmicrohttpd's messages as JSON log lines, and the
 * startup's words when no GPU can be used. QD_TEST_FILTER=name runs one test. */
#define _GNU_SOURCE /* memmem */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "service.h"

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec / 1e9;
}

static int connect_to(const struct server *s)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s->port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a))
        fail_msg("connect: %s", strerror(errno));
    return fd;
}

/* Reads what the server sends until it closes (EOF or a reset) or timeout_s passes; the bytes
 * read (NUL-terminated in buf), *closed = 1 when the server closed. */
static size_t read_answer(int fd, char *buf, size_t cap, double timeout_s, int *closed)
{
    size_t n = 0;
    double end = now_s() + timeout_s;
    *closed = 0;
    while (n + 1 < cap) {
        int left_ms = (int)((end - now_s()) * 1000);
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (left_ms <= 0 || poll(&p, 1, left_ms) <= 0)
            break;
        ssize_t r = recv(fd, buf + n, cap - 1 - n, 0);
        if (r <= 0) {
            *closed = 1;
            break;
        }
        n += (size_t)r;
    }
    buf[n] = 0;
    return n;
}

/* Sends a request head, then the same chunk again and again, reading meanwhile, until the
 * server answers or closes, max_bytes are sent or timeout_s passes. The answer in buf; the
 * bytes sent in *sent. */
static void send_until_answered(int fd, const char *head, size_t head_len, const char *chunk, size_t chunk_len,
                                size_t max_bytes, double timeout_s, char *buf, size_t cap, size_t *sent)
{
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    size_t n = 0, at = 0; /* at: offset in the current piece (the head, then chunk after chunk) */
    int in_head = 1;
    double end = now_s() + timeout_s;
    *sent = 0;
    buf[0] = 0;
    while (now_s() < end && *sent < max_bytes) {
        struct pollfd p = {.fd = fd, .events = POLLIN | POLLOUT};
        if (poll(&p, 1, 100) <= 0)
            continue;
        if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
            ssize_t r = recv(fd, buf + n, cap - 1 - n, 0);
            if (r > 0) {
                n += (size_t)r;
                buf[n] = 0;
                if (n + 1 == cap || strstr(buf, "\r\n\r\n"))
                    break;
                continue;
            }
            if (r == 0 || (errno != EAGAIN && errno != EINTR))
                break;
        }
        if (p.revents & POLLOUT) {
            const char *piece = in_head ? head : chunk;
            size_t len = in_head ? head_len : chunk_len;
            ssize_t w = send(fd, piece + at, len - at, MSG_NOSIGNAL);
            if (w < 0 && errno != EAGAIN && errno != EINTR)
                break; /* reset: the answer, if any, is still readable */
            if (w > 0) {
                at += (size_t)w;
                *sent += (size_t)w;
                if (at == len)
                    at = 0, in_head = 0;
            }
        }
    }
    /* the rest of the answer, or all of it when the server stopped reading before it answered */
    int closed;
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    read_answer(fd, buf + n, cap - n, 2, &closed);
}

/* The answer's JSON body carries this error code, and the answer is JSON, not a page. */
static void expect_json_error(const char *answer, const char *status_line, const char *code)
{
    if (strncmp(answer, status_line, strlen(status_line)))
        fail_msg("expected %s, got: %.300s", status_line, answer);
    const char *body = strstr(answer, "\r\n\r\n");
    if (!body || !strstr(answer, "Content-Type: application/json") || strstr(answer, "<html>"))
        fail_msg("not a JSON answer: %.300s", answer);
    cJSON *j = cJSON_Parse(body + 4);
    const char *got = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "code"));
    if (!got || strcmp(got, code))
        fail_msg("expected error code %s in: %.300s", code, body + 4);
    cJSON_Delete(j);
}

/* SIGTERM; the exit status, or -1 (and SIGKILL) when it has not exited within seconds. */
static int stop_within(struct server *s, double seconds)
{
    kill(s->pid, SIGTERM);
    double end = now_s() + seconds;
    int status;
    while (now_s() < end) {
        if (waitpid(s->pid, &status, WNOHANG) == s->pid) {
            if (!getenv("QUANTD_TEST_LOG"))
                unlink(s->log);
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        }
        usleep(20000);
    }
    kill(s->pid, SIGKILL);
    waitpid(s->pid, &status, 0);
    return -1;
}

/* /healthz answers 200 within seconds. */
static int healthz_within(const struct server *s, double seconds)
{
    double end = now_s() + seconds;
    do {
        struct http r;
        http_do(s, "GET", "/healthz", NULL, NULL, 0, &r);
        long st = r.status;
        http_free(&r);
        if (st == 200)
            return 1;
        usleep(50000);
    } while (now_s() < end);
    return 0;
}

/* More idle connections than the limit, twice over: each one past it is answered 503
 * (too_many_connections, Retry-After) and closed, a request meanwhile too; once they close the
 * service serves again and SIGTERM exits at once. libmicrohttpd 0.9.75 left to its own limit
 * wedges here for good (every thread waiting on a mutex it holds: /healthz gets nothing, SIGTERM
 * hangs). The default limit (4096) when the descriptor limit allows 4,296 connections on each
 * side, else a lower --max-connections. */
static void connection_flood_past_the_limit_leaves_the_service_serving(void **state)
{
    struct rlimit nofile;
    getrlimit(RLIMIT_NOFILE, &nofile);
    nofile.rlim_cur = nofile.rlim_max; /* (the server, started from here, inherits it too) */
    setrlimit(RLIMIT_NOFILE, &nofile);
    int limit = 4096;
    char flag[16];
    const char *flags[] = {"--max-connections", flag, NULL};
    if (nofile.rlim_cur < (rlim_t)limit + 200 + 512) {
        limit = (int)nofile.rlim_cur - 200 - 512;
        assert_true(limit >= 64);
    }
    snprintf(flag, sizeof flag, "%d", limit);
    printf("# %d connections against a limit of %d\n", limit + 200, limit);
    struct server s;
    server_start(&s, limit == 4096 ? NULL : flags);
    int n = limit + 200, *fd = calloc((size_t)n, sizeof *fd);
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < n; i++)
            fd[i] = connect_to(&s);
        static char answers[50][1024]; /* the last ones are past the limit */
        int closed[50];
        double until = now_s() + 5;
        for (int i = 0; i < 50; i++)
            read_answer(fd[n - 50 + i], answers[i], sizeof answers[i], until - now_s(), &closed[i]);
        /* at the limit: a request gets the 503, the liveness probe its 200 (the acceptor answers
         * it: a flood must not get the pod restarted) */
        struct http r, probe;
        http_do(&s, "GET", "/version", NULL, NULL, 0, &r);
        http_do(&s, "GET", "/healthz", NULL, NULL, 0, &probe);
        for (int i = 0; i < n; i++)
            close(fd[i]);
        /* (checked in this order so that a wedge says so) */
        if (!healthz_within(&s, 10))
            fail_msg("round %d: /healthz does not answer once the connections closed (wedged)", round);
        for (int i = 0; i < 50; i++) {
            expect_json_error(answers[i], "HTTP/1.1 503", "too_many_connections");
            assert_non_null(strstr(answers[i], "Retry-After: 1"));
            assert_true(closed[i]);
        }
        if (r.status != 503 || strcmp(r.retry_after, "1"))
            fail_msg("a request at the limit: %ld %s", r.status, r.body);
        if (probe.status != 200 || !strstr(probe.body, "\"status\":\"ok\""))
            fail_msg("GET /healthz at the limit: %ld %s", probe.status, probe.body);
        http_free(&r);
        http_free(&probe);
    }
    free(fd);
    double t0 = now_s();
    int rc = stop_within(&s, 15);
    if (rc)
        fail_msg("SIGTERM: exit status %d after %.1f s (-1: still running after 15 s)", rc, now_s() - t0);
}

/* A Content-Length over the limit is answered 413 from the headers, at once: no 100 Continue,
 * none of the body read, the connection closed. */
static void content_length_over_the_limit_is_refused_at_once(void **state)
{
    struct server big, small;
    const char *small_flags[] = {"--max-body-bytes", "4096", "--max-convert-bytes", "500", NULL};
    server_start(&big, NULL);
    server_start(&small, small_flags);
    const struct {
        const struct server *s;
        const char *path, *length;
        int expect_continue;
    } cases[] = {
        {&big, "/quantize?fmt=q8_0&dtype=f32&shape=32", "1073741825", 1},
        {&big, "/quantize?fmt=q8_0&dtype=f32&shape=32", "100000000000000", 1},
        {&big, "/jobs?op=quantize&fmt=q8_0&dtype=f32&shape=32", "100000000000000", 0},
        {&big, "/dequantize", "18446744073709551615", 1},
        {&small, "/quantize?fmt=q8_0&dtype=f32&shape=2048", "8192", 0},
        {&small, "/quantize?fmt=q8_0&dtype=f32&shape=2048", "8192", 1},
        {&small, "/convert?fmt=q8_0", "1000", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int fd = connect_to(cases[i].s);
        char head[512], buf[4096];
        int n = snprintf(head, sizeof head, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
                         "Content-Length: %s\r\n%s\r\n", cases[i].path, cases[i].length,
                         cases[i].expect_continue ? "Expect: 100-continue\r\n" : "");
        assert_int_equal(send(fd, head, (size_t)n, MSG_NOSIGNAL), n);
        int closed;
        double t0 = now_s();
        read_answer(fd, buf, sizeof buf, 5, &closed);
        close(fd);
        if (strstr(buf, "100 Continue"))
            fail_msg("%s with %s bytes: got a 100 Continue", cases[i].path, cases[i].length);
        expect_json_error(buf, "HTTP/1.1 413", "body_too_large");
        if (!closed || now_s() - t0 > 2)
            fail_msg("%s with %s bytes: the connection stayed open (%.1f s)", cases[i].path, cases[i].length,
                     now_s() - t0);
    }
    assert_int_equal(server_stop(&big), 0);
    assert_int_equal(server_stop(&small), 0);
}

/* A chunked body is cut with 413 once it passes --max-body-bytes, however long the stream: an
 * endless one is not read to its end that never comes. */
static void chunked_body_past_the_limit_is_cut_with_413(void **state)
{
    struct server s;
    const char *flags[] = {"--max-body-bytes", "4096", NULL};
    server_start(&s, flags);
    static char chunk[4096 + 16];
    int k = snprintf(chunk, sizeof chunk, "%x\r\n", 4000);
    memset(chunk + k, 'x', 4000);
    memcpy(chunk + k + 4000, "\r\n", 2);
    const char *paths[] = {"/quantize?fmt=q8_0&dtype=f32&shape=1,1024", "/jobs?op=dequantize"};
    for (int i = 0; i < 2; i++) {
        char head[512], buf[4096];
        int n = snprintf(head, sizeof head, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
                         "Transfer-Encoding: chunked\r\n\r\n", paths[i]);
        int fd = connect_to(&s);
        size_t sent;
        send_until_answered(fd, head, (size_t)n, chunk, (size_t)k + 4002, (size_t)1 << 30, 20, buf, sizeof buf, &sent);
        close(fd);
        printf("# %s: answered after %zu bytes sent\n", paths[i], sent);
        expect_json_error(buf, "HTTP/1.1 413", "body_too_large");
        /* what the socket buffers of both ends hold at most, not the stream */
        if (sent > (size_t)64 << 20)
            fail_msg("%s: %zu bytes sent before the 413", paths[i], sent);
    }
    assert_true(healthz_within(&s, 2));
    assert_int_equal(server_stop(&s), 0);
}

/* A request line and headers over libmicrohttpd's connection buffer (256 KiB) get quantd's JSON
 * 431 like those over --max-header-bytes, not libmicrohttpd's HTML page: one long header, many
 * headers, a long request line, and the same after an answered request on a kept connection. */
static void headers_over_the_connection_buffer_get_the_json_431(void **state)
{
    struct server s;
    server_start(&s, NULL);
    size_t big = 300 * 1024;
    char *filler = malloc(big + 1), *head = malloc(2 * big);
    memset(filler, 'a', big);
    filler[big] = 0;
    char *many = malloc(big + 64 * 1024);
    size_t m = 0;
    for (int i = 0; m < big; i++)
        m += (size_t)sprintf(many + m, "X-Many-%d: %.90s\r\n", i, filler);
    char buf[8192];
    for (int kind = 0; kind < 4; kind++) {
        int n = kind == 0 || kind == 3 ? sprintf(head, "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: %s\r\n\r\n", filler)
              : kind == 1             ? sprintf(head, "GET /healthz HTTP/1.1\r\nHost: x\r\n%s\r\n", many)
                                      : sprintf(head, "GET /healthz?%s HTTP/1.1\r\nHost: x\r\n\r\n", filler);
        int fd = connect_to(&s), closed;
        buf[0] = 0;
        if (kind == 3) { /* a kept connection: one answered request first */
            const char *ok = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
            assert_int_equal(send(fd, ok, strlen(ok), MSG_NOSIGNAL), (ssize_t)strlen(ok));
            size_t got = 0;
            while (!strstr(buf, "\"status\":\"ok\"")) { /* (the version follows) */
                ssize_t r = recv(fd, buf + got, sizeof buf - 1 - got, 0);
                assert_true(r > 0);
                got += (size_t)r;
                buf[got] = 0;
            }
            assert_int_equal(strncmp(buf, "HTTP/1.1 200", 12), 0);
        }
        size_t sent;
        send_until_answered(fd, head, (size_t)n, "", 0, (size_t)n, 20, buf, sizeof buf, &sent);
        read_answer(fd, buf + strlen(buf), sizeof buf - strlen(buf), 1, &closed);
        close(fd);
        expect_json_error(buf, "HTTP/1.1 431", "headers_too_large");
    }
    free(filler), free(head), free(many);
    assert_true(healthz_within(&s, 2));
    assert_int_equal(server_stop(&s), 0);
}

/* POST /convert and a conversion job whose output meets a full disk answer 507
 * insufficient_storage, and leave no spool file. The disk is made full by the file-size limit
 * (RLIMIT_FSIZE, inherited by the server; writes past it fail with EFBIG, as they fail with
 * ENOSPC on a full disk): the model (704 bytes) fits, its conversion with every tensor copied
 * (768 bytes) does not. */
static void full_disk_answers_507(void **state)
{
    char dir[64] = "/tmp/quantd-full-XXXXXX", path[128];
    assert_non_null(mkdtemp(dir));
    size_t len;
    void *model = read_file("tests/checkpoint/fuzz_seeds/small.gguf", &len);
    assert_non_null(model);
    assert_int_equal(len, 704);
    snprintf(path, sizeof path, "%s/model.gguf", dir);
    assert_int_equal(write_file(path, model, len), 0);
    struct rlimit was, fsize = {.rlim_cur = len, .rlim_max = len};
    getrlimit(RLIMIT_FSIZE, &was);
    fsize.rlim_max = was.rlim_max;
    struct sigaction ignore = {.sa_handler = SIG_IGN}, old;
    sigaction(SIGXFSZ, &ignore, &old); /* (an ignored signal stays ignored across exec) */
    setrlimit(RLIMIT_FSIZE, &fsize);
    struct server s;
    const char *flags[] = {"--data-dir", dir, NULL};
    server_start(&s, flags);
    setrlimit(RLIMIT_FSIZE, &was);
    sigaction(SIGXFSZ, &old, NULL);
    struct http r;
    http_do(&s, "POST", "/convert?fmt=q8_0&skip=.*", (const char *const[]){"Content-Type: application/octet-stream", NULL},
            model, len, &r);
    if (r.status != 507 || !strstr(r.body, "\"insufficient_storage\""))
        fail_msg("/convert onto a full disk: %ld %s", r.status, r.body);
    http_free(&r);
    const char *job = "{\"source\":\"model.gguf\",\"destination\":\"out.gguf\",\"fmt\":\"q8_0\",\"skip\":\".*\"}";
    http_do(&s, "POST", "/jobs?op=convert", (const char *const[]){"Content-Type: application/json", NULL}, job,
            strlen(job), &r);
    assert_int_equal(r.status, 202);
    char result[200];
    snprintf(result, sizeof result, "%s/result", r.location);
    http_free(&r);
    for (int i = 0; i < 500; i++) {
        http_do(&s, "GET", result, NULL, NULL, 0, &r);
        if (r.status != 409)
            break;
        http_free(&r);
        usleep(20000);
    }
    if (r.status != 507 || !strstr(r.body, "\"insufficient_storage\""))
        fail_msg("a conversion job onto a full disk: %ld %s", r.status, r.body);
    http_free(&r);
    assert_int_equal(server_stop(&s), 0);
    DIR *d = opendir(dir);
    struct dirent *e;
    int files = 0;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            if (strcmp(e->d_name, "model.gguf"))
                fail_msg("left behind in the data directory: %s", e->d_name);
            files++;
        }
    closedir(d);
    assert_int_equal(files, 1);
    unlink(path);
    rmdir(dir);
    free(model);
}

/* The server's log from the line before its startup line on ($QUANTD_TEST_LOG may hold other
 * servers' lines before it); *startup points at the startup line ("quantd serving" with this
 * server's port, which may come a moment after /healthz first answers). Free the result. */
static char *own_log(const struct server *s, char **startup)
{
    char port[32];
    snprintf(port, sizeof port, "\"port\":%d,", s->port);
    for (int i = 0; i < 200; i++) {
        size_t n;
        char *all = read_file(s->log, &n), *p = all, *found = NULL;
        while (all && (p = strstr(p, "\"msg\":\"quantd serving\""))) {
            char *end = strchr(p, '\n');
            if (end && memmem(p, (size_t)(end - p), port, strlen(port)))
                found = p;
            p++;
        }
        if (found) {
            while (found > all && found[-1] != '\n')
                found--;
            char *before = found > all ? found - 1 : found;
            while (before > all && before[-1] != '\n')
                before--;
            memmove(all, before, strlen(before) + 1);
            *startup = all + (found - before);
            return all;
        }
        free(all);
        usleep(10000);
    }
    fail_msg("no startup line for port %d in %s", s->port, s->log);
    return NULL;
}

/* Every line the server logs is a JSON object, libmicrohttpd's own messages included (a client
 * gone before the end of its request makes it say so). */
static void libmicrohttpd_messages_are_json_lines(void **state)
{
    struct server s;
    server_start(&s, NULL);
    char *startup;
    free(own_log(&s, &startup));
    int fd = connect_to(&s);
    const char *partial = "POST /quantize?fmt=q8_0&dtype=f32&shape=32 HTTP/1.1\r\nHost: x\r\n"
                          "Content-Type: application/octet-stream\r\nContent-Length: 128\r\n\r\nabc";
    assert_int_equal(send(fd, partial, strlen(partial), MSG_NOSIGNAL), (ssize_t)strlen(partial));
    usleep(200000);
    close(fd);
    fd = connect_to(&s); /* and a request libmicrohttpd refuses itself (no Host in HTTP/1.1) */
    const char *hostless = "GET /healthz HTTP/1.1\r\n\r\n";
    assert_int_equal(send(fd, hostless, strlen(hostless), MSG_NOSIGNAL), (ssize_t)strlen(hostless));
    char buf[2048];
    int closed;
    read_answer(fd, buf, sizeof buf, 2, &closed);
    close(fd);
    usleep(300000);
    char *lines = own_log(&s, &startup);
    int from_mhd = 0;
    for (char *line = strtok(startup, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(line);
        if (!cJSON_IsObject(j))
            fail_msg("a log line that is not a JSON object: %s", line);
        from_mhd += cJSON_GetObjectItem(j, "from") != NULL;
        cJSON_Delete(j);
    }
    free(lines);
    assert_true(from_mhd >= 1);
    assert_int_equal(server_stop(&s), 0);
}

/* When no GPU can be used the startup says why in plain words (no driver, no GPU, a build
 * without CUDA), never the CUDA runtime's "driver version is insufficient" for a machine that
 * has no driver at all, and that the CPU backend serves. On a machine whose GPU serves there is
 * no such line and nothing to check. */
static void startup_says_why_no_gpu_is_used(void **state)
{
    struct server s;
    const char *flags[] = {"--backend", "auto", NULL}; /* (after the harness's own --backend: it wins) */
    server_start(&s, flags);
    char *startup, *log = own_log(&s, &startup), *before = log; /* the line before the startup line */
    if (strstr(startup, "\"backend\":\"cpu\"")) {
        if (strncmp(before, "{\"msg\":\"no GPU in use: the CPU backend serves\"", 46))
            fail_msg("the CPU backend serves without saying why: %.400s", before);
        if (strstr(before, "insufficient") || !(strstr(before, "no NVIDIA driver") || strstr(before, "no NVIDIA GPU") ||
                                                strstr(before, "built without CUDA") || strstr(before, "update the driver")))
            fail_msg("the reason is not in plain words: %.400s", before);
    }
    free(log);
    assert_int_equal(server_stop(&s), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(connection_flood_past_the_limit_leaves_the_service_serving),
        cmocka_unit_test(content_length_over_the_limit_is_refused_at_once),
        cmocka_unit_test(chunked_body_past_the_limit_is_cut_with_413),
        cmocka_unit_test(headers_over_the_connection_buffer_get_the_json_431),
        cmocka_unit_test(full_disk_answers_507),
        cmocka_unit_test(libmicrohttpd_messages_are_json_lines),
        cmocka_unit_test(startup_says_why_no_gpu_is_used),
    };
    if (getenv("QD_TEST_FILTER"))
        cmocka_set_test_filter(getenv("QD_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
