/* server/checkpoint/name_filter.c: --skip / --only patterns are bounded before regcomp writes
 * their repetitions out (nested counts multiply), back-references are refused, and the patterns
 * people write for model tensors still select what they say. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "checkpoint/convert.h"

static void refused(const char *skip, const char *words)
{
    char err[512] = "";
    struct qd_name_filter *nf = qd_name_filter_new(skip, NULL, err, sizeof err);
    if (nf || !strstr(err, words)) {
        qd_name_filter_free(nf);
        fail_msg("--skip '%s': want an error naming '%s', got %s", skip, words, nf ? "(accepted)" : err);
    }
}

static void keeps(const char *skip, const char *only, const char *name, int want)
{
    char err[512] = "";
    struct qd_name_filter *nf = qd_name_filter_new(skip, only, err, sizeof err);
    if (!nf)
        fail_msg("skip '%s' only '%s': %s", skip ? skip : "", only ? only : "", err);
    if (qd_name_filter_keeps(nf, name) != want)
        fail_msg("skip '%s' only '%s' on %s: want %d", skip ? skip : "", only ? only : "", name, want);
    qd_name_filter_free(nf);
}

static void nested_counts_are_refused_before_compiling(void **state)
{
    /* the pattern that took 27 s and 8.9 GB to compile: 6.25 million copies of 'a' */
    refused("((((a{1,50}){1,50}){1,50}){1,50})", "the limit is 512");
    refused("(a?){2000}", "the limit is 512");     /* 2,000 optional atoms: 33 MB to compile */
    refused("(a|b?){1000}", "the limit is 512");
    refused("x|(a+){300}", "the limit is 512");    /* a+ is written out as aa* */
    refused("(ab){200,}", "the limit is 512");
    refused("(a?){128}b", "the limit is 512");     /* 128 x (a? and its group) + 128 markers + b: 513 */
    char longest[QD_NAME_FILTER_MAX_BYTES + 2];
    memset(longest, 'a', sizeof longest - 1);
    longest[sizeof longest - 1] = 0;
    refused(longest, "over the limit of 256");
}

static void back_references_are_refused(void **state)
{
    refused("(a)\\1", "back-references");
    refused("(blk)\\.\\2", "back-references");
}

static void usual_patterns_select_as_before(void **state)
{
    keeps("output\\.weight|token_embd", NULL, "output.weight", 0);
    keeps("output\\.weight|token_embd", NULL, "blk.0.ffn_up.weight", 1);
    keeps(NULL, "blk\\.(0|1|31)\\.ffn_(up|down)\\.weight", "blk.31.ffn_down.weight", 1);
    keeps(NULL, "blk\\.(0|1|31)\\.ffn_(up|down)\\.weight", "blk.3.ffn_down.weight", 0);
    keeps("^model\\.layers\\.[0-9]{1,3}\\.mlp\\.gate_proj", NULL, "model.layers.12.mlp.gate_proj.weight", 0);
    keeps("[]x]{2}", NULL, "a]]b", 0);                 /* a ']' first in a bracket is a member */
    keeps("[[:digit:]]{3}", NULL, "blk.123", 0);
    keeps("(a?){100}b", NULL, "aab", 0);              /* 401: under the limit */
    keeps(")x", NULL, "a)x", 0);                      /* a lone ')' is a character */
    char err[256];
    assert_null(qd_name_filter_new("(a", NULL, err, sizeof err)); /* regcomp's own refusals stay */
    assert_non_null(strstr(err, "--skip '(a'"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(nested_counts_are_refused_before_compiling),
        cmocka_unit_test(back_references_are_refused),
        cmocka_unit_test(usual_patterns_select_as_before),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
