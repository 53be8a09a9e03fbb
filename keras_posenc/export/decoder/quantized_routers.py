"""Router ties of a quantized mixture of experts: where a file may rightly pick other experts.

A mixture of experts is discontinuous: where a token's `top_k`-th router logit is within
a computation's error of the next, the file may pick the other expert, and the row's
logits from that position on differ by what the two experts differ (`judge.py`'s router
ties, for float32 files). In a quantized file the experts and every layer before them use
the file's weights, so the router logits are judged in a float64 decode of the
description with every quantized kernel replaced by what the file stores, dequantized
(`dequantized_description`: the reference's weights), and a row is compared up to its
first position where the gap is within `TIE` times the error the runtime's arithmetic
allows: float32's (`RTOL`) for a file judged to float32 tolerance, and beside it the
relative part of the int8-activation bound (`quantized_check.activation_bound`) for a
file with int8 activations, whose router inputs move by that rounding.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from keras_posenc.export.decoder.judge import router_releases
from keras_posenc.export.decoder.logit_tolerance import RTOL
from keras_posenc.export.decoder.moe import expert_kernels
from keras_posenc.export.decoder.quantize import dequantize, quantize_as
from keras_posenc.export.decoder.quantized_embedding import gather_round_trip
from keras_posenc.export.decoder.quantized_graph import is_tied


def dequantized_description(decoder, quantization):
    """`decoder` with each kernel the file quantizes (`quantized_graph.quantized_kernels`)
    replaced by it quantized (`quantize.quantize_as`, zero points included) and
    dequantized: what the file computes with."""

    def stored(kernel: np.ndarray) -> np.ndarray:
        if not kernel.shape[1]:  # a KV-sharing layer's key and value are (width, 0)
            return kernel
        return dequantize(quantize_as(kernel, quantization))

    blocks = []
    for i, block in enumerate(decoder.blocks):
        a = block.attention
        attention = dataclasses.replace(
            a, query=stored(a.query), key=stored(a.key), value=stored(a.value),
            output=stored(a.output),
        )  # fmt: skip
        mlp = block.mlp
        if mlp.kind == "moe":
            (_, fc1), (_, fc2) = expert_kernels(i, mlp)
            fc1 = stored(fc1).reshape(mlp.experts, mlp.gate.shape[1], -1)
            mlp = dataclasses.replace(
                mlp, gate=fc1[..., ::2], up=fc1[..., 1::2], down=stored(fc2).reshape(mlp.down.shape)
            )
        else:
            parts = ("gate", "up", "down")
            mlp = dataclasses.replace(
                mlp, **{p: stored(getattr(mlp, p)) for p in parts if getattr(mlp, p) is not None}
            )
        blocks.append(dataclasses.replace(block, attention=attention, mlp=mlp))
    head = stored(decoder.head)
    embedding = np.ascontiguousarray(head.T) if is_tied(decoder) else decoder.embedding
    if quantization.embedding and not is_tied(decoder):
        embedding = gather_round_trip(decoder.embedding, quantization.block_size)
    return dataclasses.replace(decoder, blocks=tuple(blocks), head=head, embedding=embedding)


def quantized_router_releases(dequantized, case: dict, tokens: np.ndarray, relative: float):
    """`{"float": (released, ties), "bound": (released, ties)}` of one case (`judge.
    router_releases`' form): its rows' first router ties in the float64 decode of
    `dequantized` along the reference's `tokens`, within float32's tolerance and within it
    plus `relative` (the int8-activation bound's relative part) times the router logits'
    RMS."""
    from keras_posenc.export.decoder.exact import exact_greedy

    _, router = exact_greedy(dequantized, case["prompts"], case["mask"], tokens)
    steps = case["steps"]
    return {
        "float": router_releases(router, case["mask"], steps),
        "bound": router_releases(router, case["mask"], steps, rtol=RTOL + relative),
    }
