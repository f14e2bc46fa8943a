/* Service benchmark: a real `quantd serve` on loopback, N concurrent clients, requests/s and
 * MB/s of input for small and large tensors sent as a raw body, as JSON/base64, and answered
 * as JSON or as safetensors. Usage: bench_service [seconds per case] [clients]. The clients
 * keep their connection and answer buffer across requests (see client()). */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <curl/curl.h>

#include "../tests/server/service.h"
#include "../server/queue/jobs.h"

struct load {
    const struct server *s;
    const char *path;
    const char *const *headers;
    const void *body;
    size_t len;
    double until_us;
    long done, failed;
};

/* A lean client, as a program feeding the service would be: one connection kept alive, 2 MiB
 * upload writes, the answer into a reused buffer. An answer counts when it is a non-empty 200. */
static void *client(void *arg)
{
    struct load *l = arg;
    char url[4096];
    snprintf(url, sizeof url, "%s%s", l->s->base, l->path);
    struct curl_slist *h = curl_slist_append(NULL, "Expect:");
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
        if (curl_easy_perform(c) == CURLE_OK)
            curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
        if (status == 200 && a.n > 0)
            l->done++;
        else
            l->failed++;
    }
    curl_easy_cleanup(c);
    curl_slist_free_all(h);
    free(a.p);
    return NULL;
}

static void run_case(const struct server *s, const char *name, const char *path, const char *const *headers,
                     const void *body, size_t len, size_t tensor_bytes, double seconds, int clients)
{
    struct load l[64];
    pthread_t th[64];
    double t0 = qd_now_us();
    for (int i = 0; i < clients; i++) {
        l[i] = (struct load){s, path, headers, body, len, t0 + seconds * 1e6, 0, 0};
        pthread_create(&th[i], NULL, client, &l[i]);
    }
    long done = 0, failed = 0;
    for (int i = 0; i < clients; i++) {
        pthread_join(th[i], NULL);
        done += l[i].done;
        failed += l[i].failed;
    }
    double el = (qd_now_us() - t0) / 1e6;
    printf("| %-40s | %7d | %9.1f | %9.1f | %6ld |\n", name, clients, done / el,
           done * (double)tensor_bytes / el / 1e6, failed);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    curl_global_init(CURL_GLOBAL_DEFAULT); /* before the client threads' handles */
    double seconds = argc > 1 ? atof(argv[1]) : 3;
    int clients = argc > 2 ? atoi(argv[2]) : 8;
    if (clients > 64)
        clients = 64;
    const char *header = "| case (nvfp4 quantize unless named)       | clients |   req/s   | MB/s in   | failed |\n"
                         "|------------------------------------------|---------|-----------|-----------|--------|\n";
    const char *json_h[] = {"Content-Type: application/json", NULL};
    const char *bin_h[] = {"Content-Type: application/octet-stream", "Accept: application/octet-stream", NULL};
    if (getenv("QUANTD_BENCH_BIG")) {
        /* 64 MiB raw bf16 bodies, binary answers: 1 worker (one stream) against the default */
        size_t n = (size_t)4096 * 8192, bytes = n * 2;
        float *x = random_f32(n);
        uint16_t *h = malloc(bytes);
        f32_to_bf16(x, h, n);
        printf("%s", header);
        const char *flag_sets[2][3] = {{"--workers", "1", NULL}, {NULL}};
        const char *names[2] = {"64 MiB bf16 raw -> safetensors, 1 stream", "64 MiB bf16 raw -> safetensors, N streams"};
        for (int k = 0; k < 2; k++) {
            struct server s;
            server_start(&s, flag_sets[k][0] ? flag_sets[k] : NULL);
            run_case(&s, names[k], "/quantize?fmt=nvfp4&dtype=bf16&shape=4096,8192", bin_h, h, bytes, bytes, seconds, clients);
            run_case(&s, "  same, q8_0", "/quantize?fmt=q8_0&dtype=bf16&shape=4096,8192", bin_h, h, bytes, bytes, seconds, clients);
            if (server_stop(&s))
                return 1;
        }
        free(h);
        free(x);
        return 0;
    }
    struct server s;
    server_start(&s, NULL);
    printf("%s", header);
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
        run_case(&s, name, path, NULL, h, bytes, bytes, seconds, clients);
        snprintf(name, sizeof name, "%s bf16 raw -> safetensors", sizes[k].label);
        run_case(&s, name, path, bin_h, h, bytes, bytes, seconds, clients);
        snprintf(name, sizeof name, "%s bf16 JSON -> JSON", sizes[k].label);
        run_case(&s, name, "/quantize?fmt=nvfp4", json_h, json, strlen(json), bytes, seconds, clients);
        snprintf(path, sizeof path, "/quantize?fmt=q8_0&dtype=bf16&shape=%d,%d", sizes[k].rows, sizes[k].cols);
        snprintf(name, sizeof name, "%s bf16 raw -> safetensors, q8_0", sizes[k].label);
        run_case(&s, name, path, bin_h, h, bytes, bytes, seconds, clients);
        free(json);
        free(b64);
        free(h);
        free(x);
    }
    return server_stop(&s) ? 1 : 0;
}
