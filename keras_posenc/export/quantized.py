"""Models Keras quantized (`model.quantize(mode)`): refused by name until they are exported.

A quantized `Dense`, `EinsumDense` or `Embedding` keeps integer (or float8) kernels with
scales and quantizes its inputs at run time; an export that reads its `kernel` as float
weights writes a wrong file (int8 values read as weights). Every layer is found by its
`quantization_mode` (set by every mode Keras has: int8, int4, float8, gptq, awq), not by
a list of classes.
"""

from __future__ import annotations

from keras_posenc.backend.keras_private import all_layers
from keras_posenc.export.errors import ExportError


def quantized_layers(model) -> dict[str, str]:
    """`{layer name: quantization mode}` of every quantized layer in `model`, nested too."""
    found = {}
    for layer in all_layers(model):
        mode = getattr(layer, "quantization_mode", None)
        if mode is None:
            policy = getattr(layer, "dtype_policy", None)
            mode = getattr(policy, "quantization_mode", None)
        if mode:
            found.setdefault(layer.name, str(mode))
    return found


def refuse_quantized(model, what: str) -> None:
    """Raises an ExportError naming the quantized layers of `model` and their modes.

    Args:
        model: a Keras model or layer.
        what: the export refusing it (e.g. `"save_decoder"`), for the message.

    Raises:
        ExportError: `model` holds a quantized layer.
    """
    found = quantized_layers(model)
    if not found:
        return
    modes = sorted(set(found.values()))
    shown = ", ".join(f"{name!r} ({mode})" for name, mode in list(found.items())[:6])
    more = f" and {len(found) - 6} more" if len(found) > 6 else ""
    raise ExportError(
        f"{what} does not export quantized models yet: {model.name!r} has layers quantized "
        f"by Keras ({', '.join(modes)}): {shown}{more}. Reading their kernels as float "
        "weights would write a wrong file. Export the float model (before `quantize()`, "
        "or reloaded from its float weights)."
    )
