/* server/checkpoint/arch.c and the generated table arch_table.c: the pattern language ('*' is
 * one run of digits), the layer index, the generic rule, and every entry of the table well formed
 * (a known layout has rules, patterns only use '*' for whole indices, no weight both quantized and
 * kept), and compressed-tensors' ignore list in the model's module order. What the table says per architecture is checked against the tools' own outputs in
 * tests/peers/test_convert_arch.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "checkpoint/arch.h"

static void star_matches_one_run_of_digits(void **state)
{
    assert_true(qd_arch_match("model.layers.*.mlp.experts.*.w1.weight", "model.layers.12.mlp.experts.255.w1.weight"));
    assert_true(qd_arch_match("model.layers.*.mlp.gate.weight", "model.layers.0.mlp.gate.weight"));
    assert_false(qd_arch_match("model.layers.*.mlp.gate.weight", "model.layers.x.mlp.gate.weight"));
    assert_false(qd_arch_match("model.layers.*.mlp.gate.weight", "model.layers..mlp.gate.weight"));
    /* '*' is not a wildcard for names: a sibling module must not match */
    assert_false(qd_arch_match("model.layers.*.mlp.gate.weight", "model.layers.0.mlp.gate_proj.weight"));
    assert_false(qd_arch_match("model.layers.*.mlp.gate.weight", "model.layers.0.mlp.gate.weight.absmax"));
    assert_false(qd_arch_match("model.layers.*.mlp.gate.weight", "model.layers.0.mlp.gate"));
    assert_true(qd_arch_match("lm_head", "lm_head"));
    assert_false(qd_arch_match("lm_head", "lm_head.weight"));
}

static void layer_is_the_first_index(void **state)
{
    assert_int_equal(qd_arch_layer("model.layers.12.mlp.experts.3.w1"), 12);
    assert_int_equal(qd_arch_layer("model.layers.0.mlp.gate"), 0);
    assert_int_equal(qd_arch_layer("lm_head"), -1);
    assert_int_equal(qd_arch_layer("model.h1.attn"), -1); /* digits inside a name are not an index */
}

static void generic_rule_is_every_linear_of_a_llama(void **state)
{
    assert_true(qd_arch_generic("model.layers.0.self_attn.q_proj.weight", 2, "BF16"));
    assert_true(qd_arch_generic("model.layers.0.mlp.experts.3.w1.weight", 2, "F16"));
    assert_false(qd_arch_generic("model.layers.0.self_attn.q_proj.weight", 2, "I32"));
    assert_false(qd_arch_generic("model.layers.0.self_attn.q_proj.bias", 1, "BF16"));
    assert_false(qd_arch_generic("model.layers.0.input_layernorm.weight", 1, "BF16"));
    assert_false(qd_arch_generic("model.embed_tokens.weight", 2, "BF16"));
    assert_false(qd_arch_generic("lm_head.weight", 2, "BF16"));
    assert_false(qd_arch_generic("transformer.wte.weight", 2, "F32"));
    assert_false(qd_arch_generic("experts.gate_up_proj", 3, "BF16"));
}

static void moe_routers_and_experts_as_the_tools_leave_them(void **state)
{
    const struct qd_arch *m = qd_arch_find("mixtral");
    assert_non_null(m);
    const char *expert = "model.layers.5.block_sparse_moe.experts.7.w1.weight";
    const char *router = "model.layers.5.block_sparse_moe.gate.weight";
    assert_int_equal(qd_arch_decide(&m->layout[QD_HF_BNB], expert), QD_ARCH_KEEP);  /* not nn.Linear in 5.17 */
    assert_int_equal(qd_arch_decide(&m->layout[QD_HF_CT], expert), QD_ARCH_QUANTIZE);
    assert_int_equal(qd_arch_decide(&m->layout[QD_HF_AWQ], expert), QD_ARCH_QUANTIZE);
    for (int l = 0; l < QD_HF_LAYOUTS; l++)
        assert_int_equal(qd_arch_decide(&m->layout[l], router), QD_ARCH_KEEP);
    assert_int_equal(qd_arch_decide(&m->layout[QD_HF_CT], "model.layers.5.mlp.unheard_of.weight"), QD_ARCH_UNLISTED);
    assert_null(qd_arch_find("not_a_model_type"));
    assert_null(qd_arch_find(NULL));
}

/* llm-compressor lists a 12-layer Qwen3-MoE's routers as model.layers.0.mlp.gate ...
 * model.layers.11.mlp.gate, then lm_head (module order, not the files' name order). */
static void ignore_list_is_in_module_order(void **state)
{
    static const char *const pats[] = {"model.layers.*.mlp.gate", "model.layers.*.mlp.shared_expert_gate", "lm_head",
                                       NULL};
    const struct qd_arch_rules r = {.ignore = pats};
    const char *names[] = {"model.layers.10.mlp.gate.weight", "model.layers.2.mlp.shared_expert_gate.weight",
                           "model.layers.2.mlp.gate.weight", "model.layers.1.mlp.gate_proj.weight",
                           "model.layers.2.mlp.gate.bias", "model.layers.9.mlp.gate.weight", "model.norm.weight"};
    cJSON *list = qd_arch_ignore_list(&r, names, sizeof names / sizeof names[0]);
    char *text = cJSON_PrintUnformatted(list);
    assert_string_equal(text, "[\"model.layers.2.mlp.gate\",\"model.layers.2.mlp.shared_expert_gate\","
                              "\"model.layers.9.mlp.gate\",\"model.layers.10.mlp.gate\",\"lm_head\"]");
    free(text);
    cJSON_Delete(list);
    list = qd_arch_ignore_list(NULL, names, 2); /* the generic rule */
    text = cJSON_PrintUnformatted(list);
    assert_string_equal(text, "[\"lm_head\"]");
    free(text);
    cJSON_Delete(list);
}

static int well_formed(const char *p)
{
    for (const char *c = p; *c; c++)
        if (*c == '*' && ((c > p && c[-1] != '.') || (c[1] && c[1] != '.')))
            return 0;
    return *p != 0;
}

static void every_entry_is_well_formed(void **state)
{
    int n = 0;
    for (const struct qd_arch *a = qd_arch_table; a->model_type; a++, n++)
        for (int l = 0; l < QD_HF_LAYOUTS; l++) {
            const struct qd_arch_rules *r = &a->layout[l];
            if (r->none) {
                assert_null(r->quantize);
                continue;
            }
            assert_non_null(r->quantize);
            const char *const *lists[] = {r->quantize, r->keep, r->ignore, r->to_f32, r->offset_norm};
            for (size_t k = 0; k < sizeof lists / sizeof lists[0]; k++)
                for (int i = 0; lists[k] && lists[k][i]; i++)
                    assert_true(well_formed(lists[k][i]));
            for (int i = 0; r->keep && r->keep[i]; i++)
                for (int q = 0; r->quantize[q]; q++)
                    assert_string_not_equal(r->keep[i], r->quantize[q]);
            if (l == QD_HF_CT)
                assert_non_null(r->ignore);
        }
    assert_true(n >= 11);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(star_matches_one_run_of_digits),
        cmocka_unit_test(layer_is_the_first_index),
        cmocka_unit_test(generic_rule_is_every_linear_of_a_llama),
        cmocka_unit_test(moe_routers_and_experts_as_the_tools_leave_them),
        cmocka_unit_test(ignore_list_is_in_module_order),
        cmocka_unit_test(every_entry_is_well_formed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
