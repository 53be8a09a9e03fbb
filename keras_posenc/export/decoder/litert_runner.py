"""Running a decoder's LiteRT file (`litert_decoder.py`): its signatures with the cache kept.

`LiteRTDecoder` calls `prefill` (several tokens) or `decode` (one) with litert-torch's
inputs, keeping each `kv_cache_*` tensor's array between calls; `litert_greedy` is the
verification's greedy run through it, in `greedy_generation.keras_greedy`'s layout.
Imports TensorFlow, as `litert_decoder.py` does.
"""

from __future__ import annotations

import numpy as np

from keras_posenc.export.decoder.litert_decoder import SIGNATURES


def causal_mask(padding: np.ndarray, input_pos: np.ndarray) -> np.ndarray:
    """litert-torch's additive mask `(batch, 1, sequence, max_length)` from a padding mask
    `(batch, max_length)` (1 for real slots) and the slots of the new tokens."""
    slots = np.arange(padding.shape[1])
    visible = (slots[None, :] <= input_pos[:, None])[None] & padding.astype(bool)[:, None, :]
    return np.where(visible, 0.0, -np.inf).astype(np.float32)[:, None]


class LiteRTDecoder:
    """The file's signature runners with the cache kept between calls, one array per tensor."""

    def __init__(self, path_or_content, batch: int):
        from keras_posenc.export.litert import litert_interpreter

        self.interpreter = litert_interpreter(path_or_content)
        self.runners = {name: self.interpreter.get_signature_runner(name) for name in SIGNATURES}
        details = self.runners["decode"].get_input_details()
        self.caches = {
            name: np.zeros((batch, *d["shape"][1:]), np.float32)
            for name, d in details.items()
            if name.startswith("kv_cache_")
        }
        self.max_length = details["mask"]["shape"][-1]

    def __call__(self, tokens: np.ndarray, start: int, padding: np.ndarray) -> np.ndarray:
        """Logits of `tokens` written at slots `start...`; `padding` `(batch, max_length)`."""
        input_pos = np.arange(start, start + tokens.shape[1], dtype=np.int32)
        runner = self.runners["decode" if tokens.shape[1] == 1 else "prefill"]
        out = runner(
            tokens=tokens.astype(np.int32),
            input_pos=input_pos,
            mask=causal_mask(padding, input_pos),
            **self.caches,
        )
        self.caches = {name: out[name] for name in self.caches}
        return out["logits"]


def litert_greedy(path_or_content, prompts: np.ndarray, mask: np.ndarray, steps: int):
    """Greedy generation through the file, as `greedy_generation.keras_greedy` (same outputs)."""
    batch, length = prompts.shape
    runner = LiteRTDecoder(path_or_content, batch)
    padding = np.ones((batch, runner.max_length), np.int32)
    padding[:, :length] = mask
    ids, start, logits, tokens = prompts, 0, [], []
    for _ in range(steps + 1):
        step_logits = runner(ids, start, padding)
        logits.append(step_logits if not logits else step_logits[:, -1])
        tokens.append(np.argmax(step_logits[:, -1], axis=-1))
        start += ids.shape[1]
        ids = tokens[-1][:, None]
    return np.stack(tokens, 1), logits
