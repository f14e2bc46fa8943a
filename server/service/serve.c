/* quantd serve: settings, backend choice, workers, the HTTP front, and the SIGTERM drain. */
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "../../kernels/cpu/cpu.h"
#include "checkpoint/convert.h"
#include "http/convert_route.h"
#include "queue/backend.h"
#include "queue/hostmem.h"
#include "common/config.h"
#include "common/metrics.h"
#include "http/http.h"
#include "queue/jobs.h"
#include "service/serve.h"

#define QD_MALLOC_ARENAS 2
/* Free heap worth giving back once the service is idle. */
#define QD_TRIM_IDLE_BYTES (16u << 20)

/* Once nothing is received, queued or running, the free memory a burst left in the arenas goes
 * back to the system (malloc_trim, up to a few ms for hundreds of MB): under load the heap is
 * reused as it is, so trimming waits for a quiet moment rather than faulting pages in again on
 * the next request. Once per quiet spell: a trim is due where a request body arrived since the
 * last one, or the heap's figures changed (the trimmed chunks stay free in the arenas, so the
 * free bytes alone would call for a trim every second). The figures alone are not enough: a
 * burst whose requests were each freed again can leave the live bytes and the arenas' size as
 * they were at a trim in a pause within it, and its pages would stay resident. */
static void trim_when_idle(void)
{
    static size_t trimmed_at[2];
    static unsigned long long received_at;
    struct qd_jobs_stats js;
    struct qd_hostmem_inflight in;
    qd_jobs_stats(&js);
    qd_hostmem_inflight(&in);
    if (in.bytes || js.depth || js.running || js.convert_depth || js.convert_running)
        return;
    struct mallinfo2 mi = mallinfo2();
    const unsigned long long received = qd_metrics_bytes_received();
    if (mi.fordblks < QD_TRIM_IDLE_BYTES ||
        (received == received_at && mi.uordblks == trimmed_at[0] && mi.arena == trimmed_at[1]))
        return;
    malloc_trim(0);
    mi = mallinfo2();
    trimmed_at[0] = mi.uordblks;
    trimmed_at[1] = mi.arena;
    received_at = received;
}

/* --max-inflight-bytes 0: a quarter of the memory the service may use (its cgroup's limit
 * when it has one, else the machine's), leaving the rest to answers, kernels and the page cache. */
static long long inflight_default(void)
{
    unsigned long long total = (unsigned long long)sysconf(_SC_PHYS_PAGES) * (unsigned long long)sysconf(_SC_PAGESIZE);
    FILE *f = fopen("/sys/fs/cgroup/memory.max", "r");
    unsigned long long limit;
    if (f) {
        if (fscanf(f, "%llu", &limit) == 1 && limit < total) /* ("max" when unlimited) */
            total = limit;
        fclose(f);
    }
    return (long long)(total / 4);
}

int qd_serve_main(int argc, char **argv)
{
    struct qd_serve_config cfg;
    char err[1024];
    int rc = qd_config_load(&cfg, argc, argv, err, sizeof err);
    if (rc) {
        if (rc < 0)
            fprintf(stderr, "quantd serve: %s\n", err);
        return rc < 0 ? 2 : 0;
    }
    /* block the stop signals in every thread started from here; main waits for them */
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    signal(SIGPIPE, SIG_IGN);
    /* every connection is a descriptor: take all the hard limit allows (the soft one is often
     * 1024, under the default --max-connections) */
    struct rlimit nofile;
    if (!getrlimit(RLIMIT_NOFILE, &nofile) && nofile.rlim_cur != RLIM_INFINITY && nofile.rlim_cur < nofile.rlim_max) {
        nofile.rlim_cur = nofile.rlim_max == RLIM_INFINITY || nofile.rlim_max > (1u << 20) ? 1u << 20 : nofile.rlim_max;
        setrlimit(RLIMIT_NOFILE, &nofile);
    }
    /* request-sized buffers (bodies, answers: up to a few MiB) are reused from the heap instead
     * of mapped and unmapped, or trimmed and faulted in again, on every request */
    mallopt(M_MMAP_THRESHOLD, 4 << 20);
    mallopt(M_TRIM_THRESHOLD, 64 << 20);
    /* glibc gives each new thread an arena of its own, up to 8 per core, and each arena keeps
     * the free memory of the requests its threads took (up to the trim threshold at its top,
     * and the holes below): with 16 HTTP threads, the workers and the kernels' threads, RSS
     * goes on rising for minutes as arena after arena meets a peak of the load, while the live
     * heap does not (docs/security.md, the soak). Two arenas hold what the load's peak needs
     * and reach it early; the threads' allocations (a few per request, none in the kernels'
     * loops) barely contend. MALLOC_ARENA_MAX in the environment still decides. */
    if (!getenv("MALLOC_ARENA_MAX"))
        mallopt(M_ARENA_MAX, QD_MALLOC_ARENAS);
    if (cfg.cpu_threads)
        qd_cpu_set_threads(cfg.cpu_threads);
    if (!cfg.max_inflight_bytes)
        cfg.max_inflight_bytes = inflight_default();
    qd_hostmem_inflight_init((size_t)cfg.max_inflight_bytes);

    /* spool files a quantd that was killed left behind (only names no live quantd holds) */
    int swept = qd_convert_spool_sweep(qd_convert_spool_dir(cfg.data_dir));
    if (swept)
        fprintf(stderr, "{\"msg\":\"removed stale spool files\",\"count\":%d}\n", swept);
    struct qd_backend backend;
    if (strcmp(cfg.backend, "cpu")) {
        if (qd_backend_cuda_open(&backend, *cfg.devices ? cfg.devices : NULL, err, sizeof err)) {
            if (!strcmp(cfg.backend, "cuda")) {
                fprintf(stderr, "quantd serve: --backend cuda: %s\n", err);
                return 1;
            }
            fprintf(stderr, "{\"msg\":\"no GPU in use: the CPU backend serves\",\"why\":\"%s\"}\n", err);
            qd_backend_cpu_open(&backend, err, sizeof err);
        }
    } else
        qd_backend_cpu_open(&backend, err, sizeof err);

    /* large bodies land in pinned buffers the CUDA workers copy from directly; the pool holds
     * at most --pinned-bytes (beyond that, bodies are malloc'd and staged as before) */
    if (backend.host_alloc)
        qd_hostmem_init(backend.host_alloc, backend.host_free, (size_t)cfg.pinned_bytes);
    struct qd_jobs_config jc = {
        .workers = cfg.workers ? cfg.workers : backend.default_workers,
        .depth = cfg.queue_depth,
        .convert_workers = cfg.convert_workers,
        .result_max_bytes = (size_t)cfg.result_max_bytes,
        .result_ttl_s = cfg.result_ttl_s,
        .max_stored = cfg.max_jobs,
        .ran = qd_metrics_device_job,
    };
    if (qd_jobs_start(&jc, &backend, err, sizeof err)) {
        fprintf(stderr, "quantd serve: no worker could start: %s\n", err);
        backend.close(&backend);
        return 1;
    }
    if (qd_http_start(&cfg, &backend, err, sizeof err)) {
        fprintf(stderr, "quantd serve: %s\n", err);
        qd_jobs_stop();
        backend.close(&backend);
        return 1;
    }
    qd_http_set_ready(1);
    fprintf(stderr, "{\"msg\":\"quantd serving\",\"listen\":\"%s\",\"port\":%d,\"backend\":\"%s\","
            "\"device\":\"%s\",\"workers\":%d,\"queue_depth\":%d,\"max_connections\":%d,\"auth\":%s}\n",
            cfg.listen, qd_http_port(), qd_jobs_backend_name(), backend.info, jc.workers, jc.depth,
            qd_http_max_connections(), *cfg.token ? "true" : "false");

    int sig;
    struct timespec tick = {.tv_sec = 1};
    while ((sig = sigtimedwait(&stop, NULL, &tick)) < 0)
        trim_when_idle();
    fprintf(stderr, "{\"msg\":\"%s: draining\",\"timeout_s\":%d}\n", sig == SIGTERM ? "SIGTERM" : "SIGINT",
            cfg.drain_timeout_s);
    int drained = qd_http_drain(cfg.drain_timeout_s) == 0;
    if (!drained) {
        /* the deadline: what still runs is cancelled (conversions stop at their next tensor and
         * remove what they wrote); a worker that does not stop within a second (a read that
         * does not return) is left: its temporaries are removed and the process ends */
        if (qd_jobs_cancel_all(1000)) {
            int n = qd_convert_remove_temporaries();
            fprintf(stderr, "{\"msg\":\"quantd stopped\",\"drained\":false,\"abandoned\":\"a worker did not stop "
                    "within a second of the drain deadline\",\"temporaries_removed\":%d}\n", n);
            fflush(stderr);
            _exit(1);
        }
    }
    qd_http_stop();
    qd_jobs_stop();
    qd_hostmem_shutdown();
    backend.close(&backend);
    fprintf(stderr, "{\"msg\":\"quantd stopped\",\"drained\":%s}\n", drained ? "true" : "false");
    return drained ? 0 : 1;
}
