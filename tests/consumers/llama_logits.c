/* llama.cpp's own logits for the chunks quantd perplexity scores, written as quantd perplexity
 * --dump-logits writes them (raw f32 [chunks][n_ctx - n_ctx/2][n_vocab]): each chunk decoded
 * alone from an empty cache, its first token replaced by BOS when the vocabulary adds one, as
 * llama-perplexity's perplexity() does. Built against the llama.cpp that make test-consumers
 * builds (its static libraries); the check is tests/consumers/test_llama_cpp_model.py.
 *
 *   llama_logits MODEL TOKENS.bin N_CTX OUT.bin [f32|f16 (KV cache, default f32)]
 *                [on|off (flash attention, default off)] [THREADS]
 *
 * The defaults are llama.cpp's f32 path: an f32 KV cache and no flash attention (whose CPU
 * kernel rounds Q to f16); llama-perplexity's own defaults (f16 cache, flash attention on the
 * CPU) are the other choices. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: llama_logits MODEL TOKENS.bin N_CTX OUT.bin [f32|f16] [on|off] [THREADS]\n");
        return 2;
    }
    const int n_ctx = atoi(argv[3]), first = n_ctx / 2;
    const int f16_cache = argc > 5 && !strcmp(argv[5], "f16");
    const int flash = argc > 6 && !strcmp(argv[6], "on");
    const int threads = argc > 7 ? atoi(argv[7]) : 2;
    FILE *f = fopen(argv[2], "rb");
    if (!f) {
        perror(argv[2]);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    long bytes = ftell(f);
    fseek(f, 0, SEEK_SET);
    int n_tokens = (int)(bytes / 4);
    llama_token *tokens = malloc((size_t)bytes);
    if (!tokens || fread(tokens, 4, (size_t)n_tokens, f) != (size_t)n_tokens) {
        fprintf(stderr, "%s: short read\n", argv[2]);
        return 1;
    }
    fclose(f);

    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "%s: llama.cpp cannot load it\n", argv[1]);
        return 1;
    }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)n_ctx;
    cp.n_batch = cp.n_ubatch = (uint32_t)n_ctx;
    cp.n_seq_max = 1;
    cp.n_threads = cp.n_threads_batch = threads;
    cp.type_k = cp.type_v = f16_cache ? GGML_TYPE_F16 : GGML_TYPE_F32;
    cp.flash_attn_type = flash ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "cannot make a context\n");
        return 1;
    }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    const int n_chunks = n_tokens / n_ctx;
    FILE *out = fopen(argv[4], "wb");
    if (!out) {
        perror(argv[4]);
        return 1;
    }
    struct llama_batch batch = llama_batch_init(n_ctx, 0, 1);
    for (int c = 0; c < n_chunks; c++) {
        llama_memory_clear(llama_get_memory(ctx), 1);
        batch.n_tokens = n_ctx;
        for (int k = 0; k < n_ctx; k++) {
            batch.token[k] = tokens[c * n_ctx + k];
            batch.pos[k] = k;
            batch.n_seq_id[k] = 1;
            batch.seq_id[k][0] = 0;
            batch.logits[k] = k >= first;
        }
        if (llama_vocab_get_add_bos(vocab))
            batch.token[0] = llama_vocab_bos(vocab);
        if (llama_decode(ctx, batch)) {
            fprintf(stderr, "decode failed at chunk %d\n", c);
            return 1;
        }
        for (int k = first; k < n_ctx; k++)
            if (fwrite(llama_get_logits_ith(ctx, k), sizeof(float), (size_t)n_vocab, out) != (size_t)n_vocab) {
                perror(argv[4]);
                return 1;
            }
    }
    llama_batch_free(batch);
    fclose(out);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    free(tokens);
    return 0;
}
