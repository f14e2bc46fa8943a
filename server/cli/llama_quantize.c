/* bin/quantd llama-quantize: llama-quantize's own command line (llama.cpp
 * tools/quantize/quantize.cpp's main, as vendored in llama-cpp-python 0.3.36), so that a script
 * written for it runs quantd instead: its options under its names, then IN [OUT] TYPE
 * [nthreads]. The request goes through the resolver every conversion goes through
 * (checkpoint/convert_request.h) and runs as quantd convert runs it (convert.c), with
 * llama-quantize's habits: an existing OUT is replaced, OUT left out is
 * ggml-model-TYPE.gguf beside IN, and an importance matrix that covers no tensor is warned
 * about, a line per tensor, not refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/gguf_options.h"
#include "checkpoint/gguf_recipe.h"
#include "cli/cli.h"

static void usage(FILE *to)
{
    fprintf(to,
            "usage: quantd llama-quantize [--allow-requantize] [--leave-output-tensor] [--pure] [--imatrix FILE]\n"
            "                             [--include-weights NAME] [--exclude-weights NAME] [--output-tensor-type TYPE]\n"
            "                             [--token-embedding-type TYPE] [--tensor-type PATTERN=TYPE]\n"
            "                             [--tensor-type-file FILE] [--prune-layers L0,L1,...] [--keep-split]\n"
            "                             [--override-kv KEY=TYPE:VALUE] [--dry-run]\n"
            "                             model-f32.gguf [model-quant.gguf] type [nthreads]\n"
            "  llama-quantize's command line, for scripts written for it: the same options and positional\n"
            "  arguments, the same file out (quantd convert --recipe TYPE with the options, docs/convert.md).\n"
            "  type: a mix by name in any case or by llama-quantize's number (15 is Q4_K_M): %s\n"
            "  model-quant.gguf left out: ggml-model-TYPE.gguf in the input's directory. An existing output\n"
            "  is replaced, as llama-quantize replaces it. nthreads: the CPU backend's threads (0 or less:\n"
            "  every core; a GPU, when there is one, quantizes and ignores it).\n"
            "  An importance matrix with no entry for some of the tensors quantized: a line for each\n"
            "  ('did not find weights for NAME'), and none recorded in the output when it covered none of\n"
            "  them (quantd convert refuses such a matrix).\n",
            qd_gguf_recipe_names());
}

/* llama-quantize's options that quantd does not implement (newer llama.cpp builds have them). */
static int unimplemented(const char *a)
{
    static const char *const newer[] = {"--target-bpw", "--target-size", "--state-file", "--save-state", NULL};
    for (const char *const *n = newer; *n; n++)
        if (!strcmp(a, *n))
            return 1;
    return 0;
}

/* The whole of text as an int (llama-quantize's std::stoi, without its tolerance of a tail). */
static int whole_int(const char *text, int *out)
{
    char *end;
    long v = strtol(text, &end, 10);
    if (end == text || *end || v < -1000000 || v > 1000000)
        return -1;
    *out = (int)v;
    return 0;
}

int qd_cli_llama_quantize(int argc, char **argv)
{
    static const char prog[] = "quantd llama-quantize";
    struct qd_cli_conversion c = {.prog = prog, .in_name = "the input model (IN)", .out_name = "the output (OUT)",
                                  .backend = "auto", .overwrite = 1, .imatrix_uncovered_ok = 1};
    struct qd_convert_arg *args = calloc((size_t)argc + 2, sizeof *args);
    char out[4200];
    if (!args) {
        fprintf(stderr, "%s: no memory\n", prog);
        return 1;
    }
    c.args = args;
    int i = 0, rc = -1, dry_run = 0, keep_split = 0;
    if (argc > 0 && (!strcmp(argv[0], "-h") || !strcmp(argv[0], "--help"))) {
        usage(stdout);
        rc = 0;
    }
    /* the options, as llama-quantize takes them: every argument from the first on that begins
     * with "--" */
    for (; rc < 0 && i < argc && !strncmp(argv[i], "--", 2); i++) {
        const char *a = argv[i];
        int takes_value;
        if (!strcmp(a, "--help")) {
            usage(stdout);
            rc = 0;
        } else if (qd_gguf_option_known(a + 2, &takes_value) && !strchr(a, '_')) {
            if (takes_value && i + 1 >= argc) {
                fprintf(stderr, "%s: %s needs a value (%s --help)\n", prog, a, prog);
                rc = 2;
            } else
                args[c.nargs++] = (struct qd_convert_arg){a + 2, takes_value ? argv[++i] : NULL};
            dry_run |= !strcmp(a, "--dry-run");
            keep_split |= !strcmp(a, "--keep-split");
        } else if (unimplemented(a)) {
            fprintf(stderr, "%s: %s is an option of newer llama-quantize builds that quantd does not implement\n",
                    prog, a);
            rc = 2;
        } else {
            fprintf(stderr, "%s: unknown option '%s' (%s --help)\n", prog, a, prog);
            rc = 2;
        }
    }
    if (rc >= 0) {
        free(args);
        return rc;
    }
    if (argc - i < 2) {
        fprintf(stderr, "%s: give IN [OUT] TYPE [nthreads] after the options (%s --help)\n", prog, prog);
        free(args);
        return 2;
    }
    c.src = argv[i++];
    const struct qd_gguf_recipe *type = qd_convert_recipe_named(argv[i]);
    if (type) { /* IN TYPE: the output beside the input, named for the mix */
        i++;
        if (!dry_run) {
            const char *slash = strrchr(c.src, '/');
            int dir = slash ? (int)(slash - c.src) + 1 : 0;
            snprintf(out, sizeof out, "%.*sggml-model-%s%s", dir, c.src, type->name, keep_split ? "" : ".gguf");
            c.dst = out;
        }
        args[c.nargs++] = (struct qd_convert_arg){"recipe", argv[i - 1]};
    } else { /* IN OUT TYPE */
        c.dst = argv[i++];
        if (i >= argc) {
            fprintf(stderr, "%s: TYPE is missing after %s (%s --help lists the types)\n", prog, c.dst, prog);
            free(args);
            return 2;
        }
        args[c.nargs++] = (struct qd_convert_arg){"recipe", argv[i++]};
    }
    if (i < argc && whole_int(argv[i], &c.cpu_threads)) {
        fprintf(stderr, "%s: nthreads '%s' is not a number of threads\n", prog, argv[i]);
        free(args);
        return 2;
    }
    if (++i < argc) {
        fprintf(stderr, "%s: unexpected argument '%s' after nthreads (%s --help)\n", prog, argv[i], prog);
        free(args);
        return 2;
    }
    rc = qd_cli_convert_run(&c);
    free(args);
    return rc;
}
