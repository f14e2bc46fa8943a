/* server/checkpoint/convert_request.c: a conversion request's key/value texts resolve to the
 * same options whatever their case or spelling (llama-quantize's numbers included), later items
 * win, each refusal has its code and one message naming what the user wrote, and the summary
 * carries the fields every caller reports. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "checkpoint/convert_request.h"

#define ARGS(...) ((const struct qd_convert_arg[]){__VA_ARGS__}), \
                  (int)(sizeof((const struct qd_convert_arg[]){__VA_ARGS__}) / sizeof(struct qd_convert_arg))

/* Resolves args; QD_OK expected: the spec (the caller frees it). */
static struct qd_convert_spec *resolved(const struct qd_convert_arg *args, int n)
{
    struct qd_convert_spec *s = qd_convert_spec_new();
    char err[1024] = "";
    assert_non_null(s);
    if (qd_convert_resolve(s, args, n, err, sizeof err) != QD_OK)
        fail_msg("refused: %s (%s)", err, s->code);
    return s;
}

/* Resolves args; a refusal with code and a message holding says expected. */
static void refused(const struct qd_convert_arg *args, int n, const char *code, const char *says)
{
    struct qd_convert_spec *s = qd_convert_spec_new();
    char err[1024] = "";
    assert_non_null(s);
    enum qd_status st = qd_convert_resolve(s, args, n, err, sizeof err);
    if (st != QD_EINVAL || !s->code || strcmp(s->code, code) || !strstr(err, says))
        fail_msg("want %s saying '%s'; got status %d, %s: %s", code, says, st, s->code ? s->code : "(none)", err);
    qd_convert_spec_free(s);
}

static void names_resolve_in_any_case_and_by_number(void **state)
{
    struct qd_convert_spec *s = resolved(ARGS({"fmt", "Q8_0"}));
    assert_string_equal(s->f->name, "q8_0");
    assert_null(s->recipe);
    qd_convert_spec_free(s);
    s = resolved(ARGS({"fmt", "Q4_k"}));
    assert_string_equal(s->f->name, "q4_K");
    qd_convert_spec_free(s);
    s = resolved(ARGS({"recipe", "q4_k_m"}));
    assert_string_equal(s->recipe, "Q4_K_M");
    assert_string_equal(s->f->name, "q4_K"); /* the mix's default type */
    assert_int_equal(s->gguf.pure, 0);
    qd_convert_spec_free(s);
    s = resolved(ARGS({"recipe", "15"}));
    assert_string_equal(s->recipe, "Q4_K_M");
    qd_convert_spec_free(s);
    s = resolved(ARGS({"fmt", "2"})); /* llama-quantize --pure 2 */
    assert_string_equal(s->recipe, "Q4_0");
    assert_int_equal(s->gguf.pure, 1);
    assert_string_equal(qd_convert_spec_fmt(s), "q4_0");
    qd_convert_spec_free(s);
    s = resolved(ARGS({"fmt", "BF16"})); /* back to float */
    assert_null(s->f);
    assert_string_equal(s->to_float, "bf16");
    assert_string_equal(qd_convert_spec_fmt(s), "bf16");
    qd_convert_spec_free(s);
    s = resolved(ARGS({"recipe", "copy"}));
    assert_null(s->f);
    assert_string_equal(qd_convert_spec_fmt(s), "COPY");
    qd_convert_spec_free(s);
}

static void later_items_win_and_options_append(void **state)
{
    struct qd_convert_spec *s = resolved(ARGS({"fmt", "q4_0"}, {"fmt", "q8_0"}, {"skip", "a"}, {"skip", "^output"},
                                              {"tensor-type", "attn_v=q8_0"}, {"tensor_type", "ffn=Q5_0"},
                                              {"pure", NULL}));
    assert_string_equal(s->f->name, "q8_0");
    assert_string_equal(s->skip, "^output");
    assert_int_equal(s->gguf.n_tensor_types, 2);
    assert_int_equal(s->gguf.pure, 1);
    assert_false(qd_name_filter_keeps(s->filter, "output.weight"));
    assert_true(qd_name_filter_keeps(s->filter, "a.weight"));
    qd_convert_spec_free(s);
    /* a parameter as --param k=v and as a query's k=v: the later wins */
    s = resolved(ARGS({"fmt", "nf4"}, {"param", "blocksize=128"}, {"blocksize", "256"}));
    assert_int_equal(s->params.blocksize, 256);
    qd_convert_spec_free(s);
    s = resolved(ARGS({"fmt", "nf4"}, {"blocksize", "256"}, {"param", "blocksize=128"}));
    assert_int_equal(s->params.blocksize, 128);
    struct qd_convert_opts o = {0};
    qd_convert_spec_opts(s, &o);
    assert_ptr_equal(o.f, s->f);
    assert_int_equal(o.params.blocksize, 128);
    assert_ptr_equal(o.gguf, &s->gguf);
    qd_convert_spec_free(s);
}

static void refusals_have_a_code_and_one_message(void **state)
{
    refused(ARGS({"fmt", "nope"}), "unknown_format", "unknown format 'nope': quantd convert writes");
    refused(ARGS({"fmt", "Q4_K_M"}), "unknown_format", "use --recipe Q4_K_M");
    refused(ARGS({"fmt", "copy"}), "unknown_format", "not a format: use --recipe COPY");
    refused(ARGS({"recipe", "NF4"}), "unknown_recipe", "is a format, not a llama-quantize mix: use --fmt nf4");
    refused(ARGS({"recipe", "Q9"}), "unknown_recipe", "unknown recipe 'Q9'");
    refused(ARGS({"fmt", "q4_0"}, {"recipe", "Q4_0"}), "bad_request", "not both");
    refused(ARGS({"skip", "x"}), "missing_format", "--fmt FMT or --recipe MIX is required");
    refused(ARGS({"fmt", "q8_0"}, {"blocksize", "64"}), "unknown_param", "unknown parameter 'blocksize' for format q8_0");
    refused(ARGS({"fmt", "nf4"}, {"param", "blocksize=3"}), "bad_param", "parameter blocksize");
    refused(ARGS({"fmt", "nf4"}, {"param", "blocksize"}), "bad_param", "--param needs k=v");
    refused(ARGS({"recipe", "F16"}, {"param", "blocksize=64"}), "bad_param", "does not apply to the F16 mix");
    refused(ARGS({"fmt", "f32"}, {"param", "blocksize=64"}), "bad_param", "does not apply to --fmt f32 (back to float)");
    refused(ARGS({"fmt", "q8_0"}, {"only", "("}), "bad_request", "--only '('");
    refused(ARGS({"recipe", "Q4_0"}, {"output-tensor-type", "q3"}), "bad_param", "--output-tensor-type: 'q3'");
    /* a --tensor-type pattern's refusal names --tensor-type and the pattern given, not --only */
    struct qd_convert_spec *s = qd_convert_spec_new();
    char err[1024] = "";
    assert_int_equal(qd_convert_resolve(s, ARGS({"recipe", "Q4_0"}, {"tensor_type", "((A{1,50}){1,50})=q8_0"}), err,
                                        sizeof err),
                     QD_EINVAL);
    if (strncmp(err, "--tensor-type '((a{1,50}){1,50})': its repetitions", 50) || strstr(err, "--only"))
        fail_msg("%s", err);
    qd_convert_spec_free(s);
}

static void summary_carries_the_common_fields(void **state)
{
    struct qd_convert_spec *s = resolved(ARGS({"recipe", "q4_k_m"}, {"pure", "true"}));
    struct qd_convert_summary sum = {.quantized = 3, .copied = 2, .bytes_in = 4000, .bytes_out = 1000,
                                     .params_total = 1000, .seconds = 0.0123456, .imatrix = "m.imatrix",
                                     .imatrix_entries = 9, .imatrix_covered = 2, .imatrix_missing = 1};
    snprintf(sum.imatrix_first_missing, sizeof sum.imatrix_first_missing, "token_embd.weight");
    cJSON *j = qd_convert_summary_json(s, &sum, "cpu");
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(j, "recipe")), "Q4_K_M");
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(j, "pure")));
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(j, "fmt")), "q4_K");
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(j, "backend")), "cpu");
    assert_int_equal(cJSON_GetObjectItem(j, "quantized")->valueint, 3);
    assert_true(cJSON_GetObjectItem(j, "bits_per_weight")->valuedouble == 8.0);
    assert_true(cJSON_GetObjectItem(j, "seconds")->valuedouble == 0.012);
    assert_int_equal(cJSON_GetObjectItem(j, "imatrix_covered")->valueint, 2);
    assert_null(cJSON_GetObjectItem(j, "dry_run"));
    assert_null(cJSON_GetObjectItem(j, "rule"));
    cJSON_Delete(j);
    char note[512];
    qd_convert_imatrix_note(&sum, note, sizeof note);
    assert_non_null(strstr(note, "covered 2 of the 3 quantized tensors (no entry for token_embd.weight)"));
    sum.imatrix_covered = 0, sum.imatrix_missing = 3;
    qd_convert_imatrix_note(&sum, note, sizeof note);
    assert_non_null(strstr(note, "covered none of the 3 quantized tensors (no entry for token_embd.weight and 2 "
                                 "others): was it made for another model?"));
    sum.imatrix_missing = 0;
    qd_convert_imatrix_note(&sum, note, sizeof note);
    assert_string_equal(note, "");
    qd_convert_spec_free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(names_resolve_in_any_case_and_by_number),
        cmocka_unit_test(later_items_win_and_options_append),
        cmocka_unit_test(refusals_have_a_code_and_one_message),
        cmocka_unit_test(summary_carries_the_common_fields),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
