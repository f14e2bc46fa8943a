/* bin/quantd: one binary, subcommands. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/openapi.h"
#include "service/serve.h"

#ifndef QD_VERSION /* the Makefile sets it from the VERSION file */
#define QD_VERSION "unknown"
#endif

static void usage(FILE *to)
{
    fputs("usage: quantd <command> [options]\n"
          "  formats                     print the format registry as JSON\n"
          "  quantize --fmt FMT --dtype DT --shape R,C --in FILE --out DIR [--param k=v ...]\n"
          "                              quantize a raw little-endian tensor; writes\n"
          "                              DIR/<component>.bin and DIR/meta.json\n"
          "  dequantize --in DIR --dtype DT --out FILE\n"
          "                              turn such a directory back into a raw tensor\n"
          "  convert --in SRC --out DST (--fmt FMT | --recipe MIX) [--param k=v] [--skip RE] [--only RE]\n"
          "          [--force]           convert a whole model for its runtime (quantd convert --help)\n"
          "  llama-quantize [options] IN [OUT] TYPE [nthreads]\n"
          "                              llama-quantize's command line, for its scripts\n"
          "                              (quantd llama-quantize --help)\n"
          "  perplexity -m MODEL --tokens FILE [-c N] [--chunks N]\n"
          "                              llama-perplexity's perplexity (quantd perplexity --help)\n"
          "  tokenize -m MODEL.gguf (-p TEXT | -f FILE | --stdin) [--ids]  token ids as llama-tokenize\n"
          "  imatrix -m MODEL --tokens FILE [-o OUT] [-c N] [--in-file FILE]\n"
          "                              llama-imatrix's importance matrix (quantd imatrix --help)\n"
          "  serve [options]             run the HTTP service (quantd serve --help)\n"
          "  openapi [SPEC]              print api/openapi.yaml with its enums made from the code's\n"
          "                              tables (formats, mixes, components, dtypes; make openapi)\n"
          "  healthcheck [--listen ADDR:PORT] [--path /healthz]\n"
          "                              exit 0 when the service answers 200\n"
          "  version, --version          print quantd's version\n",
          to);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "formats"))
        return qd_cli_formats(argc - 2, argv + 2);
    if (!strcmp(cmd, "quantize"))
        return qd_cli_quantize(argc - 2, argv + 2);
    if (!strcmp(cmd, "serve"))
        return qd_serve_main(argc - 2, argv + 2);
    if (!strcmp(cmd, "healthcheck"))
        return qd_healthcheck_main(argc - 2, argv + 2);
    if (!strcmp(cmd, "convert"))
        return qd_cli_convert(argc - 2, argv + 2);
    if (!strcmp(cmd, "llama-quantize"))
        return qd_cli_llama_quantize(argc - 2, argv + 2);
    if (!strcmp(cmd, "perplexity"))
        return qd_cli_perplexity(argc - 2, argv + 2);
    if (!strcmp(cmd, "tokenize"))
        return qd_cli_tokenize(argc - 2, argv + 2);
    if (!strcmp(cmd, "imatrix"))
        return qd_cli_imatrix(argc - 2, argv + 2);
    if (!strcmp(cmd, "dequantize"))
        return qd_cli_dequantize(argc - 2, argv + 2);
    if (!strcmp(cmd, "openapi"))
        return qd_cli_openapi(argc - 2, argv + 2);
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
        printf("quantd %s\n", QD_VERSION);
        return 0;
    }
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "quantd: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
