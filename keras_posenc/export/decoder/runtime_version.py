"""Decoder parts that onnxruntime computes as the export means them only from 1.32 on.

The minimum-versions run (onnxruntime 1.23) failed verification on exactly these, while
onnxruntime 1.32 passes: GroupQueryAttention's `local_window_size` and `softcap` (keras_hub's
Mistral, Gemma 2 and Gemma 3: other tokens from step 9 on, logits 0.5-1.4 off) and the
`softcap` of ONNX's own `Attention` (Gemma 2's standard-op graph). Versions between the two
are untested, so an export with these parts is refused below 1.32 instead of being written
for a runtime that answers otherwise. Attention sinks (GPT-OSS: GroupQueryAttention's
`head_sink`, an additive float mask with an extra slot in ONNX's `Attention`) were added
after that run and are verified with 1.32 alone, so they are refused below it too; so is
the GroupQueryAttention graph's `com.microsoft.MoE` (its clamped SwiGLU and routing were
compared with keras_hub on 1.32 alone, never on 1.23; the standard-op graph's dense experts
are ONNX's own operators and are not refused). Refused rather than written densely below
1.32: one graph per `attention=`, whichever onnxruntime writes it, and GPT-OSS, the one
family with experts, is refused there anyway for its sinks.
"""

from __future__ import annotations

from keras_posenc.export.decoder.description import Decoder, optional_parts
from keras_posenc.export.errors import ExportError

VERIFIED_FROM = (1, 32)
# The parts each attention graph writes with an attribute that older runtimes read otherwise.
_ATTRIBUTE_PARTS = {
    "gqa": ("sliding windows", "attention soft caps", "attention sinks", "mixture-of-experts MLPs"),
    "standard": ("attention soft caps", "attention sinks"),
}


def _installed() -> tuple[int, ...]:
    import onnxruntime

    return tuple(int(part) for part in onnxruntime.__version__.split(".")[:2])


def refuse_older_onnxruntime(decoder: Decoder, attention: str) -> None:
    """ExportError if `decoder` has parts the installed onnxruntime computes otherwise."""
    installed = _installed()
    if installed >= VERIFIED_FROM:
        return
    parts = [part for part in optional_parts(decoder) if part in _ATTRIBUTE_PARTS[attention]]
    if parts:
        raise ExportError(
            f"This decoder has {', '.join(parts)}, which onnxruntime "
            f"{'.'.join(map(str, installed))} computes otherwise than the export means them "
            f"(verified with onnxruntime >= {'.'.join(map(str, VERIFIED_FROM))}): upgrade "
            "onnxruntime, or write the LiteRT file alone (formats=('litert',))."
        )
