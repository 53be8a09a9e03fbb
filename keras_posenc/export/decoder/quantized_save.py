"""`save_decoder(quantize=...)`'s verification: the file against the dequantized model."""

from __future__ import annotations

from keras_posenc.export.decoder.check import (
    compare_greedy,
    decoder_cases,
    failure_message,
)
from keras_posenc.export.decoder.keras_quantized import unrounded_inputs
from keras_posenc.export.decoder.keras_quantized_graph import without_input_rounding
from keras_posenc.export.decoder.quantized_check import (
    compare_with_bound,
    dequantized_weights,
    verify_quantized,
)
from keras_posenc.export.decoder.quantized_graph import quantized_kernels

# accuracy_level 0 and 1: MatMulNBits computes in float32 on the dequantized weights.
FLOAT_LEVELS = (0, 1)
# The runtime of the file's own bytes with float arithmetic (`float_arithmetic_runtime`).
FLOAT_RUNTIME = "onnxruntime, accuracy_level 0"


def float_arithmetic_runtime(path, max_length: int, quantization, slot=None) -> dict:
    """`{FLOAT_RUNTIME: greedy}` for a file with int8 activations (accuracy_level 2-4):
    the same file, every MatMulNBits set to accuracy_level 0, in memory. Its weights are
    then judged to float32 tolerance: a wrong scale, block, nibble or zero point cannot
    hide in the int8-activation bound. `{}` for a float-arithmetic file. The session opens
    at the first call, through `slot` (an `on_demand.OneAtATime`) where given."""
    from keras_posenc.export.decoder.on_demand import OneAtATime

    if quantization is None:
        return {}
    if quantization.accuracy_level in FLOAT_LEVELS and not quantization.keras_rounded:
        return {}
    slot = OneAtATime() if slot is None else slot
    return {FLOAT_RUNTIME: slot.runtime(FLOAT_RUNTIME, lambda: _float_arithmetic(path, max_length))}


def _float_arithmetic(path, max_length: int):
    """The greedy function of `float_arithmetic_runtime`'s session."""
    import onnx
    import onnxruntime

    from keras_posenc.export.decoder.greedy_generation import onnx_greedy

    model = onnx.load(path)
    without_input_rounding(model)  # a model Keras quantized in int8: its MatMulIntegers
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            for attribute in node.attribute:
                if attribute.name == "accuracy_level":
                    attribute.i = 0
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return lambda prompts, mask, steps: onnx_greedy(session, prompts, mask, steps, max_length)


def verify_quantized_decoder(
    model, source, keras_hub: bool, runtimes: dict, length: int, quantization, progress
) -> dict:
    """The report of `save_decoder` for a quantized file (`quantized_check.py`); `source`
    the description, or on demand (`on_demand.py`): made for the reference and released
    before the runtimes run."""
    from keras_posenc import keras_hub as bridge
    from keras_posenc.export.decoder.greedy_generation import keras_greedy
    from keras_posenc.export.decoder.on_demand import on_demand

    def greedy_of(step_model):
        if keras_hub:
            return bridge.keras_hub_greedy(step_model)
        return lambda prompts, mask, steps: keras_greedy(step_model, prompts, mask, steps)

    source = on_demand(source)
    decoder = source.describe()
    layers = sum(1 for name, _ in quantized_kernels(decoder) if name.endswith("o_proj"))
    chain = 2 * layers + 1  # each layer's attention and MLP, then the head
    # Keras's int8 layers round their inputs (the file does the same, so only the rows
    # whose float32 inputs differ by a rounding boundary differ: bounded the same way).
    bounded = quantization.accuracy_level not in FLOAT_LEVELS or quantization.keras_rounded

    def judge(name, expected, got, mask):
        if bounded and name != FLOAT_RUNTIME:
            return compare_with_bound(expected, got, mask, chain, quantization.block_size)
        return compare_greedy(expected, got, mask)

    cases = decoder_cases(source.vocabulary, length, window=source.window)
    name = "the dequantized keras_hub model" if keras_hub else "the dequantized Keras model"
    if quantization.keras is not None:
        name = f"the {quantization.keras} model Keras quantized"
    progress.say(f"verifying against {name} (the file's weights), {len(cases)} cases")
    if quantization.keras is None:
        dequantized = dequantized_weights(model, decoder, quantization)
        decoder = None  # the context holds it until it has made the reference's weights
        report = verify_quantized(model, greedy_of, runtimes, cases, judge, dequantized)
    else:
        report = _verify_keras_quantized(model, greedy_of, runtimes, cases, judge, quantization)
    report["passed"] = failure_message(report) is None
    report["quantization"] = {
        "bits": quantization.bits,
        "block_size": quantization.block_size,
        "accuracy_level": quantization.accuracy_level,
        "judged": "int8-activation bound" if bounded else "float32 tolerance",
    }
    if quantization.keras is not None:
        report["quantization"]["keras"] = quantization.keras
    return report


def _verify_keras_quantized(model, greedy_of, runtimes, cases, judge, quantization) -> dict:
    """A model Keras quantized is its own reference; the file's bytes with float arithmetic
    (`FLOAT_RUNTIME`: no input rounding in int8, accuracy_level 0 in int4) are judged
    against the same model with its int8 layers' input rounding off, to float32 tolerance."""
    rounded = {name: run for name, run in runtimes.items() if name != FLOAT_RUNTIME}
    report = verify_quantized(model, greedy_of, rounded, cases, judge, None, False)
    if FLOAT_RUNTIME in runtimes:
        unrounded = unrounded_inputs(model) if quantization.keras_rounded else None
        floats = {FLOAT_RUNTIME: runtimes[FLOAT_RUNTIME]}
        extra = verify_quantized(model, greedy_of, floats, cases, judge, unrounded, False)
        for case, more in zip(report["cases"], extra["cases"], strict=True):
            case["runtimes"].update(more["runtimes"])
    return report
