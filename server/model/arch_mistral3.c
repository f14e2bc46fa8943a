/* Mistral 3 (llama.cpp src/models/mistral3.cpp: Mistral Small 3.x and Ministral's GGUFs when
 * converted with the "mistral3" architecture): the Llama block as the table row gives it, with
 * optional biases on the attention's output and the FFN and Llama 3's rope_freqs. What it adds
 * over llama is refused here until the engine has it: Llama 4's attention temperature tuning
 * (attention.temperature_scale), which multiplies q by a factor that grows with the position.
 * (Mistral 7B's GGUFs say "llama": llama.cpp gives them no sliding window, and neither does
 * quantd.) */
#include <stdio.h>

#include "model/graph.h"

int qd_arch_mistral3_hparams(struct qd_model *m, char *err, size_t errlen)
{
    double v;
    int found = qd_model_key(m, "attention.temperature_scale", 0, &v, err, errlen);
    if (found < 0)
        return -1;
    if (found && v != 0.0) {
        snprintf(err, errlen, "the model tunes its attention's temperature by position (%s.attention."
                 "temperature_scale = %g, Llama 4's): the engine does not run that yet", m->arch_name, v);
        return -1;
    }
    return 0;
}
