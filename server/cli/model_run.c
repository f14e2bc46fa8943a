/* How the CLI shows a run of the model (model/run_io.h; cli.h): its lines on stdout and stderr
 * as llama.cpp prints them, its progress on stderr. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"

static void cli_text(void *ctx, enum qd_run_stream s, const char *text, size_t len)
{
    FILE *to = s == QD_RUN_OUT ? stdout : stderr;
    fwrite(text, 1, len, to);
    if (s == QD_RUN_OUT) /* (the running figures appear as they come, as llama.cpp's do) */
        fflush(to);
}

int qd_cli_progress_parse(const char *v, enum qd_cli_progress *out)
{
    static const char *const names[] = {[QD_CLI_PROGRESS_AUTO] = "auto", [QD_CLI_PROGRESS_BAR] = "bar",
                                        [QD_CLI_PROGRESS_JSON] = "json", [QD_CLI_PROGRESS_NONE] = "none"};
    for (int i = 0; i < (int)(sizeof names / sizeof *names); i++)
        if (v && !strcmp(v, names[i])) {
            *out = (enum qd_cli_progress)i;
            return 0;
        }
    return -1;
}

void qd_cli_run_io(struct qd_run_io *io, struct qd_run_progress_sink *sink, const char *what,
                   enum qd_cli_progress mode)
{
    if (mode == QD_CLI_PROGRESS_AUTO)
        mode = isatty(STDERR_FILENO) ? QD_CLI_PROGRESS_BAR : QD_CLI_PROGRESS_JSON;
    *sink = (struct qd_run_progress_sink){.to = stderr, .what = what, .json = mode == QD_CLI_PROGRESS_JSON};
    *io = (struct qd_run_io){.ctx = sink, .text = cli_text,
                             .progress = mode == QD_CLI_PROGRESS_NONE ? NULL : qd_run_progress_print};
}
