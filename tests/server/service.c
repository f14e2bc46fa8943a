/* Service test harness (see service.h). */
#include "service.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "../../server/http/decode.h"

const char *quantd_bin(void)
{
    const char *b = getenv("QUANTD");
    return b ? b : "bin/quantd";
}

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t n = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) || getsockname(fd, (struct sockaddr *)&a, &n))
        fail_msg("no free port");
    close(fd);
    return ntohs(a.sin_port);
}

void server_start(struct server *s, const char *const *flags)
{
    s->port = free_port();
    snprintf(s->base, sizeof s->base, "http://127.0.0.1:%d", s->port);
    char listen[64];
    snprintf(listen, sizeof listen, "127.0.0.1:%d", s->port);
    const char *argv[32] = {quantd_bin(), "serve", "--listen", listen, "--backend",
                            getenv("QUANTD_TEST_BACKEND") ? getenv("QUANTD_TEST_BACKEND") : "cpu"};
    int n = 6;
    for (int i = 0; flags && flags[i] && n < 30; i++)
        argv[n++] = flags[i];
    argv[n] = NULL;
    const char *log = getenv("QUANTD_TEST_LOG");
    if (log)
        snprintf(s->log, sizeof s->log, "%s", log);
    else {
        snprintf(s->log, sizeof s->log, "/tmp/quantd-test-XXXXXX");
        int fd = mkstemp(s->log);
        if (fd < 0)
            fail_msg("cannot create a server log file");
        close(fd);
    }
    fflush(NULL);
    s->pid = fork();
    if (s->pid == 0) {
        /* a test that fails before server_stop must not leave its server holding the output
         * pipe of `make` open (a hang in CI): the server dies with the test */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        /* the server's log goes to a file, keeping the test output readable */
        if (!freopen(s->log, "a", stderr))
            _exit(126);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    for (int i = 0; i < 500; i++) {
        struct http r;
        http_do(s, "GET", "/healthz", NULL, NULL, 0, &r);
        long st = r.status;
        http_free(&r);
        if (st == 200)
            return;
        int status;
        if (waitpid(s->pid, &status, WNOHANG) == s->pid)
            fail_msg("quantd serve exited at start (status %d)", status);
        usleep(10000);
    }
    fail_msg("quantd serve did not answer /healthz");
}

int server_stop(struct server *s)
{
    int status = -1;
    kill(s->pid, SIGTERM);
    int rc = waitpid(s->pid, &status, 0) != s->pid ? -1
           : WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (rc) { /* the last lines of its log say why (a sanitizer report, a panic) */
        FILE *f = fopen(s->log, "rb");
        if (f) {
            static char tail[8192];
            fseek(f, 0, SEEK_END);
            long size = ftell(f);
            fseek(f, size > (long)sizeof tail - 1 ? size - (long)sizeof tail + 1 : 0, SEEK_SET);
            size_t got = fread(tail, 1, sizeof tail - 1, f);
            tail[got] = 0;
            fclose(f);
            fprintf(stderr, "# quantd serve exited with %d; the end of its log:\n%s\n", rc, tail);
        }
    }
    if (!getenv("QUANTD_TEST_LOG"))
        unlink(s->log);
    return rc;
}

size_t http_sink(char *data, size_t size, size_t nmemb, void *arg)
{
    struct sink *k = arg;
    size_t n = size * nmemb;
    if (k->n + n + 1 > k->cap) {
        size_t cap = (k->n + n + 1) * 2;
        char *p = realloc(k->p, cap);
        if (!p)
            return 0; /* curl fails the transfer */
        k->p = p, k->cap = cap;
    }
    memcpy(k->p + k->n, data, n);
    k->n += n;
    k->p[k->n] = 0;
    return n;
}

static void header_value(const char *line, size_t n, const char *name, char *out, size_t outlen)
{
    size_t k = strlen(name);
    if (n > k && !strncasecmp(line, name, k) && line[k] == ':') {
        const char *v = line + k + 1;
        while (*v == ' ')
            v++;
        size_t m = n - (size_t)(v - line);
        while (m && (v[m - 1] == '\r' || v[m - 1] == '\n'))
            m--;
        if (m >= outlen)
            m = outlen - 1;
        memcpy(out, v, m);
        out[m] = 0;
    }
}

static size_t on_header(char *line, size_t size, size_t nmemb, void *arg)
{
    struct http *r = arg;
    size_t n = size * nmemb;
    header_value(line, n, "Content-Type", r->content_type, sizeof r->content_type);
    header_value(line, n, "Location", r->location, sizeof r->location);
    header_value(line, n, "Retry-After", r->retry_after, sizeof r->retry_after);
    header_value(line, n, "X-Quantd-Shape", r->shape, sizeof r->shape);
    header_value(line, n, "X-Quantd-Dtype", r->dtype, sizeof r->dtype);
    header_value(line, n, "WWW-Authenticate", r->www_authenticate, sizeof r->www_authenticate);
    return n;
}

/* Appends {"method","path","status","content_type","body"} to $QUANTD_RESPONSES. */
static void record(const char *method, const char *path, const struct http *r)
{
    const char *file = getenv("QUANTD_RESPONSES");
    if (!file)
        return;
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&lock);
    FILE *f = fopen(file, "a");
    if (f) {
        int json = !strncmp(r->content_type, "application/json", 16) && r->len;
        fprintf(f, "{\"method\":\"%s\",\"path\":\"", method);
        for (const char *p = path; *p; p++)
            fputc(*p == '"' ? '\'' : *p, f);
        fprintf(f, "\",\"status\":%ld,\"content_type\":\"%s\",\"body\":", r->status, r->content_type);
        for (size_t i = 0; json && i < r->len; i++) /* one line per answer */
            fputc(r->body[i] == '\n' ? ' ' : r->body[i], f);
        if (!json)
            fputs("null", f);
        fputs("}\n", f);
        fclose(f);
    }
    pthread_mutex_unlock(&lock);
}

void http_do(const struct server *s, const char *method, const char *path, const char *const *headers,
             const void *body, size_t len, struct http *r)
{
    memset(r, 0, sizeof *r);
    CURL *c = curl_easy_init();
    char url[4096];
    snprintf(url, sizeof url, "%s%s", s->base, path);
    struct sink k = {0};
    struct curl_slist *h = NULL;
    for (int i = 0; headers && headers[i]; i++)
        h = curl_slist_append(h, headers[i]);
    h = curl_slist_append(h, "Expect:"); /* no 100-continue round trip */
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, http_sink);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &k);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, r);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 120L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    if (!strcmp(method, "HEAD"))
        curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    if (body) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    }
    if (curl_easy_perform(c) == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r->status);
    else
        r->status = 0;
    r->body = k.p ? k.p : calloc(1, 1);
    r->len = k.n;
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    if (r->status)
        record(method, path, r);
}

void http_free(struct http *r)
{
    free(r->body);
    r->body = NULL;
}

float *random_f32(size_t n)
{
    static unsigned seed;
    if (!seed) {
        seed = (unsigned)time(NULL) ^ (unsigned)getpid();
        printf("# random seed %u\n", seed);
    }
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) {
        /* sum of uniforms: roughly normal, with a few larger outliers */
        float v = 0;
        for (int k = 0; k < 4; k++)
            v += (float)rand_r(&seed) / RAND_MAX - 0.5f;
        x[i] = rand_r(&seed) % 97 == 0 ? v * 20 : v;
    }
    return x;
}

void f32_to_bf16(const float *x, uint16_t *y, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        y[i] = (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
    }
}

unsigned char *b64_decode(const char *s, size_t *n)
{
    int oom;
    return qd_base64_decode(s, strlen(s), n, &oom);
}

char *b64_encode(const void *p, size_t n)
{
    char *s = malloc(qd_base64_encoded_len(n) + 1);
    qd_base64_encode(p, n, s);
    s[qd_base64_encoded_len(n)] = 0;
    return s;
}

void *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)n + 1);
    *len = fread(p, 1, (size_t)n, f);
    p[*len] = 0;
    fclose(f);
    return p;
}

int write_file(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t w = fwrite(p, 1, n, f);
    fclose(f);
    return w == n ? 0 : -1;
}
