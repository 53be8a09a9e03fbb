"""The reference a quantized file is verified against, and its judging with int8 activations.

The reference is the Keras model with every weight the file quantizes replaced by what the
file stores, dequantized (`quantize.quantize_as`, zero points included): the model's own
variables, for the reference's run (`dequantized_weights`), found by content (a
description's kernel is a Keras variable reshaped, `(K, N)` from its leading and trailing
axes, or transposed: a tied table). Against it a file with float arithmetic (accuracy_level
0/1) is judged as float32 files are (`check.compare_greedy`).

With accuracy_level 2-4 onnxruntime quantizes each MatMulNBits' input to int8 per block
of `block_size` along K (scale `max|a|/127`), so the file's logits differ from the
reference by that rounding (docs/quantization.md derives `activation_bound`); the same
bytes with float arithmetic are judged to float32 tolerance beside it
(`quantized_save.float_arithmetic_runtime`), which is what catches a wrong weight. Passed: every
compared logit within the bound, and the same greedy token wherever the reference's top-1
leads its top-2 by more than twice the bound; tokens are compared up to the first step
where they differ (a near tie, allowed), later steps follow other tokens.
"""

from __future__ import annotations

import contextlib
import itertools

import keras
import numpy as np

from keras_posenc.export.decoder.logit_tolerance import compared, row_scale
from keras_posenc.export.decoder.quantize import dequantize, quantize_as
from keras_posenc.export.decoder.quantized_embedding import gather_round_trip
from keras_posenc.export.decoder.quantized_graph import is_tied, quantized_kernels
from keras_posenc.export.errors import ExportError


def _fingerprints(kernels: list) -> dict:
    """`{(size, hash of the flat bytes): [(index, transposed)]}` of each kernel `(K, N)` as
    stored and transposed: a variable holding it reshaped (the leading axes K, the trailing
    N: the same flat order) or transposed (a tied table) is found in one pass."""
    table = {}
    for index, (kernel, _) in enumerate(kernels):
        for transposed, array in ((False, kernel), (True, kernel.T)):
            key = (array.size, hash(np.ascontiguousarray(array).tobytes()))
            table.setdefault(key, []).append((index, transposed))
    table["sizes"] = {kernel.size for kernel, _ in kernels}
    return table


def _replacement(weight: np.ndarray, kernels: list, table: dict):
    """`(index, dequantized value)` of `weight` if it is `kernels[index]` (`[(kernel,
    dequantized)]`) reshaped or transposed, or its axes permuted and then reshaped (Gemma's
    `(heads, width, head_dim)` query), else `(-1, None)`."""
    index, replaced = _reshaped(weight, kernels, table)
    if replaced is not None or weight.ndim < 3 or weight.size not in table["sizes"]:
        return index, replaced
    for axes in itertools.permutations(range(weight.ndim)):
        if list(axes) != sorted(axes):
            index, replaced = _reshaped(
                np.ascontiguousarray(weight.transpose(axes)), kernels, table
            )
            if replaced is not None:
                return index, replaced.transpose(np.argsort(axes))
    return -1, None


def _reshaped(weight: np.ndarray, kernels: list, table: dict):
    key = (weight.size, hash(np.ascontiguousarray(weight).tobytes()))
    for index, transposed in table.get(key, ()):
        kernel, dequantized = kernels[index]
        k, n = kernel.shape
        if transposed:
            if weight.shape == (n, k) and np.array_equal(weight, kernel.T):
                return index, np.ascontiguousarray(dequantized.T)
        elif any(int(np.prod(weight.shape[:s])) == k for s in range(1, weight.ndim)):
            if np.array_equal(weight.reshape(k, n), kernel):
                return index, dequantized.reshape(weight.shape)
    return -1, None


@contextlib.contextmanager
def dequantized_weights(model: keras.Model, decoder, quantization):
    """Within the block, `model`'s quantized weights hold what the file stores, dequantized;
    every variable gets its own value back when the block ends (a copy of the model would
    not always keep its settings: keras_hub's configs drop `tie_word_embeddings`).

    Raises:
        ExportError: a quantized kernel of the description that no variable of `model`
            holds (the reference could not be made).
    """
    named, q = quantized_kernels(decoder), quantization
    kernels = [(kernel, dequantize(quantize_as(kernel, q))) for _, kernel in named]
    if q.embedding and not is_tied(decoder):  # GatherBlockQuantized's own rule, (V, D)
        table = decoder.embedding
        named.append(("embed_tokens", table.T))
        kernels.append((table.T, gather_round_trip(table, q.block_size).T))
    changes, found, table = [], set(), _fingerprints(kernels)
    for variable in model.weights:
        if not keras.backend.is_float_dtype(variable.dtype):
            continue
        value = keras.ops.convert_to_numpy(variable)
        index, replaced = _replacement(value, kernels, table)
        if replaced is not None:
            found.add(index)
            changes.append((variable, value, replaced.astype(value.dtype)))
    for index, (name, kernel) in enumerate(named):
        if index not in found and not any(
            np.array_equal(kernels[j][0], kernel)
            for j in found
            if kernels[j][0].shape == kernel.shape
        ):
            raise ExportError(
                f"The quantized file's reference could not be made: {name} is no variable "
                "of the model (reshaped or transposed)."
            )
    # Within the block only the variables' own values are held (to give them back): the
    # description and the dequantized kernels are each a copy of the weights.
    named = kernels = table = decoder = None
    originals = [(variable, original) for variable, original, _ in changes]
    try:
        for variable, _, replaced in changes:
            variable.assign(replaced)
        changes = None
        yield model
    finally:
        for variable, original in originals:
            variable.assign(original)


# How many standard deviations of the rounding error a logit may be off (module docstring).
TAIL = 5


def activation_bound(logits: np.ndarray, quantized_matmuls: int, block_size: int) -> np.ndarray:
    """The logit bound of int8 activations, per row (last axis kept; docs/quantization.md):
    `TAIL · quantized_matmuls · sqrt(block_size) / (127 · sqrt(12)) · rms(row)`, plus the
    float32 tolerance. One MatMul's input rounded to int8 steps of `max|a| / 127` per block
    moves its outputs by a relative standard deviation of at most `sqrt(block_size) / (127 ·
    sqrt(12))` (uniform rounding; a block's largest input at most `sqrt(block_size)` times
    its RMS); the `quantized_matmuls` on the longest path add (the norms rescale each
    branch), and a logit may sit `TAIL` deviations out."""
    logits = np.asarray(logits, np.float64)
    relative = activation_relative(quantized_matmuls, block_size)
    return (relative + 1e-4) * row_scale(logits) + 1e-5


def activation_relative(quantized_matmuls: int, block_size: int) -> float:
    """`activation_bound`'s part relative to the row's RMS, without float32's."""
    return float(TAIL * quantized_matmuls * np.sqrt(block_size) / (127 * np.sqrt(12)))


def _where(mask: np.ndarray, step: int, rows, index: int) -> dict:
    """`{"step", "row", "position"}` of the `index`-th compared logit row of `step`."""
    row = int(rows[0][index])
    if step == 0:
        position = int(np.cumsum(mask[row])[int(rows[1][index])]) - 1
    else:
        position = int(mask[row].sum()) + step - 1
    return {"step": step, "row": row, "position": position}


def compare_with_bound(
    expected, got, mask: np.ndarray, quantized_matmuls: int, block_size: int, released=None
) -> dict:
    """Tokens and logits of a file with int8 activations against the reference (module
    docstring), in `check.compare_greedy`'s form; `released` `(batch,)`: the position
    from which each row is not compared (a router tie, `quantized_routers.py`)."""
    ref_tokens, ref_logits = expected
    tokens, logits = got
    selected = compared(mask, ref_tokens.shape[1] - 1, released)
    token_rows = np.stack([selected[0][:, -1], *selected[1:]], axis=1)
    differ = np.argwhere((ref_tokens != tokens) & token_rows)
    last = int(differ[:, 1].min()) if len(differ) else ref_tokens.shape[1] - 1
    worst = (-np.inf, {"step": 0, "row": 0, "position": 0})
    max_abs, failed_token, used = 0.0, None, 0.0
    for step in range(last + 1):
        rows = np.nonzero(selected[step])
        if not rows[0].size:
            continue
        ref = np.asarray(ref_logits[step][rows], np.float64)
        out = np.asarray(logits[step][rows], np.float64)
        bound = activation_bound(ref, quantized_matmuls, block_size)
        error = np.abs(out - ref)
        error = np.where(np.isnan(error), np.inf, error)
        max_abs = max(max_abs, float(error.max()))
        excess = (error - bound).max(axis=-1)
        if excess.max() > worst[0]:
            worst = (float(excess.max()), _where(mask, step, rows, int(np.argmax(excess))))
        used = max(used, float((error / bound).max()))
        top2 = np.sort(ref, axis=-1)[..., -2:]
        decided = top2[..., 1] - top2[..., 0] > 2 * bound[..., 0]
        disagree = decided & (np.argmax(ref, -1) != np.argmax(out, -1))
        if failed_token is None and disagree.any():
            failed_token = _where(mask, step, rows, int(np.argmax(disagree)))
    result = {
        "same_tokens": not len(differ),
        "max_abs_error": max_abs,
        "max_rel_error": float("nan"),  # judged against the bound, not relative error
        "worst_step": worst[1]["step"],
        "worst_row": worst[1]["row"],
        "worst_position": worst[1]["position"],
        "within_tolerance": worst[0] <= 0,
        "decided_tokens_agree": failed_token is None,
        "bound_used": used,  # the largest error / bound: at most 1 to pass
    }
    if failed_token is not None:
        result["first_different_token"] = failed_token
    result["passed"] = result["within_tolerance"] and failed_token is None
    return result


def float_agreement(float_logits, logits, mask: np.ndarray) -> dict:
    """Against the float32 model, teacher-forced over the prompts' real tokens: the share
    of positions with the same top-1, and the RMS of the logit differences."""
    rows = np.nonzero(mask.astype(bool))
    ref = np.asarray(float_logits[rows], np.float64)
    out = np.asarray(logits[rows], np.float64)
    return {
        "top1_agreement": float(np.mean(np.argmax(ref, -1) == np.argmax(out, -1))),
        "logit_rms_difference": float(np.sqrt(np.mean(np.square(out - ref)))),
    }


def verify_quantized(
    model, greedy_of, runtimes: dict, cases: list, judge, dequantized, against_float32=True
) -> dict:
    """`check.verify_decoder`'s report for a quantized file: each case's runtimes judged by
    `judge(name, expected, got, case)` against `greedy_of(model)` run inside `dequantized` (the
    context of `dequantized_weights`), with `float_agreement` against the float32 model's
    prompt logits beside it. `dequantized` None: `model` itself; `against_float32` False:
    there is no float32 model to compare with (a model Keras quantized)."""
    float_logits = [None] * len(cases)
    if dequantized is None:
        dequantized = contextlib.nullcontext(model)
    if against_float32:
        float_greedy = greedy_of(model)
        float_logits = [float_greedy(c["prompts"], c["mask"], 0)[1][0] for c in cases]
    with dequantized:
        reference = greedy_of(model)
        expected = [reference(c["prompts"], c["mask"], c["steps"]) for c in cases]
    # Each runtime runs every case before the next one runs (opened one at a time).
    results = [{} for _ in cases]
    for name, run in runtimes.items():
        for case, want, float_prompt, found in zip(
            cases, expected, float_logits, results, strict=True
        ):
            got = run(case["prompts"], case["mask"], case["steps"])
            found[name] = judge(name, want, got, case)
            if float_prompt is not None:
                found[name]["against_float32"] = float_agreement(
                    float_prompt, got[1][0], case["mask"]
                )
    report = {"cases": []}
    for case, found in zip(cases, results, strict=True):
        prompts, steps = case["prompts"], case["steps"]
        report["cases"].append(
            {
                "name": case["name"],
                "batch": len(prompts),
                "steps": steps,
                "last_position": prompts.shape[1] + steps - 1,
                "runtimes": found,
            }
        )
    return report
