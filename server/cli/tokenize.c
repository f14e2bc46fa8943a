/* bin/quantd tokenize: llama-tokenize's flags and output (tools/tokenize/tokenize.cpp of the
 * llama-cpp-python 0.3.36 sdist). The prompt comes from -p, -f (read as is) or --stdin (that
 * first, then -f, then -p); escapes (\n, \t, \xHH, ...) are processed unless --no-escape;
 * special token texts are parsed unless --no-parse-special; BOS (and EOS) are added when the
 * vocabulary asks for them, unless --no-bos. Output, on stdout: one "%6d -> 'piece'" line per
 * token, or with --ids one "[1, 2, 3]" line; --show-count adds "Total number of tokens: N". */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common/files.h"
#include "model/tokenizer.h"

static void usage(FILE *to)
{
    fputs("usage: quantd tokenize -m MODEL.gguf (-p PROMPT | -f FILE | --stdin) [--ids] [--no-bos]\n"
          "                       [--no-parse-special] [--show-count] [--no-escape] [--log-disable]\n"
          "  -m, --model FNAME      a GGUF with a vocabulary (the weights are not read)\n"
          "  -p, --prompt PROMPT    the text\n"
          "  -f, --file FNAME       the text, from a file, byte for byte\n"
          "  --stdin                the text, from standard input (before -f and -p)\n"
          "  --ids                  print the ids as one list: [1, 2, 3]\n"
          "  --no-bos               no BOS (nor EOS) token, even when the model adds one\n"
          "  --no-parse-special     special token texts stay text\n"
          "  --show-count           print the number of tokens\n"
          "  -e, --escape / --no-escape\n"
          "                         process \\n \\r \\t \\' \\\" \\\\ \\xHH in the text (default: on)\n"
          "  --log-disable, -v, -t N, -c N, -ngl N, -lv N, --log-file F\n"
          "                         accepted for llama-tokenize's command lines; no effect\n",
          to);
}

/* common.cpp string_process_escapes: in place; returns the new length. */
static size_t process_escapes(char *s, size_t n)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 >= n) {
            s[o++] = s[i];
            continue;
        }
        char c = s[++i];
        switch (c) {
        case 'n': s[o++] = '\n'; continue;
        case 'r': s[o++] = '\r'; continue;
        case 't': s[o++] = '\t'; continue;
        case '\'': case '"': case '\\': s[o++] = c; continue;
        case 'x':
            if (i + 2 < n) { /* (two more characters and one beyond, as llama.cpp checks) */
                char x[3] = {s[i + 1], s[i + 2], 0}, *end = NULL;
                long val = strtol(x, &end, 16);
                if (end == x + 2) {
                    i += 2;
                    s[o++] = (char)val;
                    continue;
                }
            }
            break;
        default:
            break;
        }
        s[o++] = '\\';
        s[o++] = c;
    }
    return o;
}

/* Options every llama.cpp tool takes, which change nothing in tokenizing (threads, context,
 * GPU layers, logging): accepted with their value, so that llama-tokenize's command lines run. */
static int ignored_with_value(const char *a)
{
    static const char *const names[] = {"-t", "--threads", "-c", "--ctx-size", "-ngl", "--n-gpu-layers",
                                        "--gpu-layers", "-lv", "--verbosity", "--log-verbosity", "--log-file"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(a, names[i]))
            return 1;
    return 0;
}

static char *read_stream(FILE *f, size_t *len)
{
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap)
            break;
        char *b = realloc(buf, cap * 2);
        if (!b) {
            free(buf);
            return NULL;
        }
        buf = b;
        cap *= 2;
    }
    if (buf && ferror(f)) {
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

int qd_cli_tokenize(int argc, char **argv)
{
    const char *model = NULL, *prompt = NULL, *file = NULL;
    int use_stdin = 0, ids_only = 0, no_bos = 0, parse_special = 1, show_count = 0, escape = 1;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        int takes = !strcmp(a, "-m") || !strcmp(a, "--model") || !strcmp(a, "-p") || !strcmp(a, "--prompt") ||
                    !strcmp(a, "-f") || !strcmp(a, "--file");
        if (takes && i + 1 >= argc) {
            fprintf(stderr, "quantd tokenize: %s needs a value\n", a);
            return 2;
        }
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) model = argv[++i];
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) prompt = argv[++i];
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) file = argv[++i];
        else if (!strcmp(a, "--stdin")) use_stdin = 1;
        else if (!strcmp(a, "--ids")) ids_only = 1;
        else if (!strcmp(a, "--no-bos")) no_bos = 1;
        else if (!strcmp(a, "--no-parse-special")) parse_special = 0;
        else if (!strcmp(a, "--show-count")) show_count = 1;
        else if (!strcmp(a, "-e") || !strcmp(a, "--escape")) escape = 1;
        else if (!strcmp(a, "--no-escape")) escape = 0;
        else if (!strcmp(a, "--log-disable") || !strcmp(a, "-v") || !strcmp(a, "--verbose")) continue;
        else if (ignored_with_value(a) && i + 1 < argc) i++; /* llama.cpp's common options: no effect here */
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "quantd tokenize: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!model) {
        fprintf(stderr, "quantd tokenize: -m MODEL is required\n");
        usage(stderr);
        return 2;
    }
    if (!use_stdin && !file && (!prompt || !*prompt)) { /* (an empty -p counts as none, as there) */
        fprintf(stderr, "quantd tokenize: must specify one of: --stdin, --file or --prompt\n");
        return 1;
    }
    char *text = NULL;
    size_t len = 0;
    if (file) { /* (read even under --stdin, which then replaces it, as llama-tokenize does) */
        if (!(text = qd_file_read(file, &len))) {
            fprintf(stderr, "quantd tokenize: could not open file '%s' for reading: %s\n", file, strerror(errno));
            return 1;
        }
    } else if (!use_stdin) {
        len = strlen(prompt);
        if (!(text = malloc(len + 1)))
            return 1;
        memcpy(text, prompt, len);
    }
    char err[1024];
    struct qd_vocab *v = NULL;
    /* the model first, as llama-tokenize does: a bad model ends the run before stdin is read */
    if (qd_vocab_open(model, &v, err, sizeof err) != QD_OK) {
        fprintf(stderr, "quantd tokenize: could not load the vocabulary of '%s': %s\n", model, err);
        free(text);
        return 1;
    }
    if (use_stdin) {
        free(text);
        text = read_stream(stdin, &len);
    }
    if (use_stdin && !text) {
        fprintf(stderr, "quantd tokenize: could not read the entire standard input\n");
        qd_vocab_free(v);
        return 1;
    }
    if (escape)
        len = process_escapes(text, len);
    int32_t *ids = NULL;
    size_t n = 0;
    int add_special = qd_vocab_add_bos(v) && !no_bos; /* llama-tokenize's add_bos decides BOS and EOS */
    enum qd_status st = qd_tokenize(v, text, len, add_special, parse_special, &ids, &n, err, sizeof err);
    free(text);
    if (st != QD_OK) {
        fprintf(stderr, "quantd tokenize: %s\n", err);
        qd_vocab_free(v);
        return 1;
    }
    if (ids_only) {
        putchar('[');
        for (size_t i = 0; i < n; i++)
            printf(i ? ", %d" : "%d", ids[i]);
        fputs("]\n", stdout);
    } else {
        for (size_t i = 0; i < n; i++) {
            size_t plen = 0;
            const char *piece = qd_token_piece(v, ids[i], 1, &plen);
            printf("%6d -> '", ids[i]);
            fwrite(piece, 1, strnlen(piece, plen), stdout); /* printf("%s"): up to a NUL */
            fputs("'\n", stdout);
        }
    }
    if (show_count)
        printf("Total number of tokens: %zu\n", n);
    free(ids);
    qd_vocab_free(v);
    return fflush(stdout) == 0 ? 0 : 1;
}
