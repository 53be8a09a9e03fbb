"""`save_decoder(quantize=...)`'s verification: the file against the dequantized model."""

from __future__ import annotations

from keras_posenc.export.decoder.check import (
    compare_greedy,
    decoder_cases,
    failure_message,
    teacher_forced_case,
)
from keras_posenc.export.decoder.keras_quantized import unrounded_inputs
from keras_posenc.export.decoder.keras_quantized_graph import without_input_rounding
from keras_posenc.export.decoder.quantized_check import (
    activation_relative,
    compare_with_bound,
    dequantized_weights,
    verify_quantized,
)
from keras_posenc.export.decoder.quantized_graph import quantized_kernels
from keras_posenc.export.decoder.quantized_routers import (
    dequantized_description,
    quantized_router_releases,
)
from keras_posenc.export.decoder.quantized_standard import FUSED_ACCURACY_LEVEL
from keras_posenc.export.decoder.weights_file import session_options

# accuracy_level 0 and 1: MatMulNBits computes in float32 on the dequantized weights.
FLOAT_LEVELS = (0, 1)
# The runtime of the file's own bytes with float arithmetic (`float_arithmetic_runtime`).
FLOAT_RUNTIME = "onnxruntime, accuracy_level 0"
# onnxruntime 1.32's CPU QMoE computes 8-bit experts with int8 activations at every
# accuracy_level; this environment variable, read when a session is made, has them
# dequantized to float32 instead (4-bit experts follow accuracy_level, as MatMulNBits).
QMOE_FLOAT_ARITHMETIC = ("ORT_QMOE_CPU_QNBIT_GEMM", "fp32")


def int8_activations(quantization, moe_layers: int) -> bool:
    """Whether some quantized op's input is rounded to int8: every one at accuracy_level
    2-4, 8-bit QMoE experts (`moe_layers` of them) at every level, and a model Keras
    quantized with rounded inputs (`Quantization.keras_rounded`: the file rounds them too)."""
    if quantization is None:
        return False
    return (
        quantization.accuracy_level not in FLOAT_LEVELS
        or quantization.keras_rounded
        or (quantization.bits == 8 and moe_layers > 0)
    )


# The LiteRT file's bytes, dequantized, in float32 (`litert_float_arithmetic_runtime`).
LITERT_FLOAT_RUNTIME = "litert, float arithmetic"


def float_arithmetic_runtime(path, max_length: int, quantization, slot=None) -> dict:
    """`{FLOAT_RUNTIME: greedy}` for a file with int8 activations (`int8_activations`):
    the same file, every MatMulNBits and QMoE set to accuracy_level 0 (8-bit QMoE through
    `QMOE_FLOAT_ARITHMETIC`), in memory. Its weights are then judged to float32 tolerance:
    a wrong scale, block, nibble or zero point cannot hide in the int8-activation bound.
    `{}` for a float-arithmetic file. The session opens at the first call, through `slot`
    (an `on_demand.OneAtATime`) where given."""
    from keras_posenc.export.decoder.on_demand import OneAtATime

    if not int8_activations(quantization, _int8_experts(path, quantization)):
        return {}
    slot = OneAtATime() if slot is None else slot
    return {FLOAT_RUNTIME: slot.runtime(FLOAT_RUNTIME, lambda: _float_arithmetic(path, max_length))}


def _int8_experts(path, quantization) -> int:
    """The QMoE nodes of the file at `path` where they are 8-bit (int8 activations at
    every level), read without the weights; 0 where that cannot matter."""
    if quantization is None or quantization.bits != 8:
        return 0
    import onnx

    graph = onnx.load(path, load_external_data=False).graph
    return sum(node.op_type == "QMoE" for node in graph.node)


def litert_float_arithmetic_runtime(path, quantization) -> dict:
    """`{LITERT_FLOAT_RUNTIME: greedy}` for a quantized LiteRT file (`{}` otherwise): the
    file with each int8 / int4 weight as the float32 its bytes dequantize to, judged to
    float32 tolerance (LiteRT's kernels always round the activations to int8)."""
    if quantization is None:
        return {}

    def greedy(prompts, mask, steps):
        from keras_posenc.export.decoder.litert_quantize import float_arithmetic_litert
        from keras_posenc.export.decoder.litert_runner import litert_greedy

        content = float_arithmetic_litert(path.read_bytes())
        return litert_greedy(content, prompts, mask, steps)

    return {LITERT_FLOAT_RUNTIME: greedy}


def rounded_chain(decoder) -> int:
    """The quantized products a logit's activation roundings pass through: each layer's
    attention and MLP, then the head (`2 * layers + 1`)."""
    layers = sum(1 for name, _ in quantized_kernels(decoder) if name.endswith("o_proj"))
    return 2 * layers + 1


def activation_block(decoder, quantization) -> int:
    """The inputs one int8 activation scale covers: MatMulNBits' block; a LiteRT row (its
    kernels round each input row, the largest K of the quantized weights)."""
    if quantization.rule == "mlas":
        return quantization.block_size
    return max(kernel.shape[0] for _, kernel in quantized_kernels(decoder))


def _float_arithmetic(path, max_length: int):
    """The greedy function of `float_arithmetic_runtime`'s session."""
    import os

    import onnx
    import onnxruntime

    from keras_posenc.export.decoder.greedy_generation import onnx_greedy

    model = onnx.load(path)
    options = session_options()
    # A standard-op file's DequantizeLinear + MatMul, fused into MatMulNBits: level 0 too.
    options.add_session_config_entry(FUSED_ACCURACY_LEVEL, "0")
    without_input_rounding(model)  # a model Keras quantized in int8: its MatMulIntegers
    for node in model.graph.node:
        if node.op_type in ("MatMulNBits", "QMoE"):
            for attribute in node.attribute:
                if attribute.name == "accuracy_level":
                    attribute.i = 0
    variable, value = QMOE_FLOAT_ARITHMETIC
    before = os.environ.get(variable)
    os.environ[variable] = value
    try:
        session = onnxruntime.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
    finally:
        if before is None:
            del os.environ[variable]
        else:
            os.environ[variable] = before
    return lambda prompts, mask, steps: onnx_greedy(session, prompts, mask, steps, max_length)


def verify_quantized_decoder(
    model,
    source,
    keras_hub: bool,
    runtimes: dict,
    length: int,
    quantization,
    progress,
    teacher_forced: bool = False,
) -> dict:
    """The report of `save_decoder` for a quantized file (`quantized_check.py`); `source`
    the description, or on demand (`on_demand.py`): made for the reference and released
    before the runtimes run. `teacher_forced`: `check.teacher_forced_case` too (every
    position `0..length-1`)."""
    from keras_posenc import keras_hub as bridge
    from keras_posenc.export.decoder.greedy_generation import keras_greedy
    from keras_posenc.export.decoder.on_demand import on_demand

    def greedy_of(step_model):
        if keras_hub:
            return bridge.keras_hub_greedy(step_model)
        return lambda prompts, mask, steps: keras_greedy(step_model, prompts, mask, steps)

    source = on_demand(source)
    decoder = source.describe()
    experts = sum(block.mlp.kind == "moe" for block in decoder.blocks)
    # Keras's int8 layers round their inputs (the file does the same, so only the rows
    # whose float32 inputs differ by a rounding boundary differ: bounded the same way).
    bounded = int8_activations(quantization, experts)
    if quantization.accuracy_level not in FLOAT_LEVELS or quantization.keras_rounded:
        chain = rounded_chain(decoder)
    else:
        chain = experts  # 8-bit QMoE alone: each mixture's branch
    block = activation_block(decoder, quantization)

    relative = activation_relative(chain, block) if bounded else 0.0
    # A mixture of experts' router ties, judged in the file's weights (quantized_routers.py).
    routers = dequantized_description(decoder, quantization) if experts else None
    releases = {}  # case name -> quantized_router_releases

    def judge(name, expected, got, case):
        float_runtime = name in (FLOAT_RUNTIME, LITERT_FLOAT_RUNTIME)
        kind = "bound" if bounded and not float_runtime else "float"
        released = None
        if routers is not None:
            if case["name"] not in releases:
                releases[case["name"]] = quantized_router_releases(
                    routers, case, expected[0], relative
                )
            released = releases[case["name"]][kind][0]
        if kind == "bound":
            return compare_with_bound(expected, got, case["mask"], chain, block, released)
        return compare_greedy(expected, got, case["mask"], released)

    cases = decoder_cases(source.vocabulary, length, window=source.window)
    if teacher_forced:
        cases.append(teacher_forced_case(source.vocabulary, length))
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
    report["ties"] = [
        {"case": case, "judged": kind, **tie}
        for case, both in releases.items()
        for kind, (_, ties) in both.items()
        for tie in ties
    ]
    report["quantization"] = quantization_entry(quantization, block, bounded)
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


def quantization_entry(quantization, block: int, bounded: bool) -> dict:
    """The report's `"quantization"`: what was stored and how the file was judged
    (`bounded`: against the int8-activation bound)."""
    return {
        "bits": quantization.bits,
        "block_size": quantization.block_size,  # None: one scale per output channel
        "accuracy_level": quantization.accuracy_level,  # None: LiteRT (int8 activations)
        "rule": quantization.rule,
        # False: zero points stored; None: a model Keras quantized (its own blocks as stored)
        "symmetric": None if quantization.keras else quantization.symmetric,
        "judged": "int8-activation bound" if bounded else "float32 tolerance",
        "activation_block": block,
    }
