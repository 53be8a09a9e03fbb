"""`save_decoder(quantize=...)`'s verification: the file against the dequantized model."""

from __future__ import annotations

from keras_posenc.export.decoder.check import (
    compare_greedy,
    decoder_cases,
    failure_message,
    widest_window,
)
from keras_posenc.export.decoder.quantized_check import (
    compare_with_bound,
    dequantized_weights,
    verify_quantized,
)
from keras_posenc.export.decoder.quantized_graph import quantized_kernels

# accuracy_level 0 and 1: MatMulNBits computes in float32 on the dequantized weights.
FLOAT_LEVELS = (0, 1)


def verify_quantized_decoder(
    model, decoder, keras_hub: bool, runtimes: dict, length: int, quantization, progress
) -> dict:
    """The report of `save_decoder` for a quantized file (`quantized_check.py`)."""
    from keras_posenc import keras_hub as bridge
    from keras_posenc.export.decoder.greedy import keras_greedy

    def greedy_of(step_model):
        if keras_hub:
            return bridge.keras_hub_greedy(step_model)
        return lambda prompts, mask, steps: keras_greedy(step_model, prompts, mask, steps)

    if quantization.accuracy_level in FLOAT_LEVELS:
        judge = compare_greedy
    else:
        layers = sum(1 for name, _ in quantized_kernels(decoder) if name.endswith("o_proj"))
        chain = 2 * layers + 1  # each layer's attention and MLP, then the head

        def judge(expected, got, mask):
            return compare_with_bound(expected, got, mask, chain)

    cases = decoder_cases(decoder.vocabulary, length, window=widest_window(decoder))
    name = "the dequantized keras_hub model" if keras_hub else "the dequantized Keras model"
    progress.say(f"verifying against {name} (the file's weights), {len(cases)} cases")
    dequantized = dequantized_weights(model, decoder, quantization)
    report = verify_quantized(model, greedy_of, runtimes, cases, judge, dequantized)
    report["passed"] = failure_message(report) is None
    report["quantization"] = {
        "bits": quantization.bits,
        "block_size": quantization.block_size,
        "accuracy_level": quantization.accuracy_level,
        "judged": "float32 tolerance" if judge is compare_greedy else "int8-activation bound",
    }
    return report
