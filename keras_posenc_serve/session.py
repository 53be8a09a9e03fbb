"""onnxruntime on the genai interface: one cache buffer per layer, bound as past and present.

`onnx_greedy` is the verification's runner (`keras_posenc.export.decoder.greedy_generation`
re-exports both names): its `steps` counts the single-token calls after the prompt, so it returns
`steps + 1` tokens, the first picked from the prompt's logits. The public API,
`keras_posenc_serve.load(folder).generate(prompts, steps=n)`, returns exactly `n` tokens.
"""

from __future__ import annotations

import numpy as np


class SharedCacheSession:
    """An onnxruntime session of the genai interface, one cache buffer per layer bound as
    both past and present (past_present_share_buffer), written in place by each call.

    Args:
        session: an `onnxruntime.InferenceSession` of a `save_decoder` `model.onnx`.
        batch: the rows of every call.
        max_length: the cache slots (the file's `max_length`, or fewer).
    """

    def __init__(self, session, batch: int, max_length: int):
        import onnxruntime

        self.session = session
        self.binding = session.io_binding()
        self.binding.bind_output("logits")  # first: `get_outputs()[0]`
        self.caches = {}
        for value in session.get_inputs():
            if value.name.startswith("past_key_values."):
                shape = (batch, value.shape[1], max_length, value.shape[3])
                self.caches[value.name] = onnxruntime.OrtValue.ortvalue_from_numpy(
                    np.zeros(shape, np.float32)
                )
        for name, buffer in self.caches.items():
            self.binding.bind_ortvalue_input(name, buffer)
            present = name.replace("past_key_values.", "present.")
            self.binding.bind_ortvalue_output(present, buffer)

    def __call__(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """The logits `(batch, sequence, vocabulary)` of `input_ids` `(batch, sequence)`;
        `attention_mask` `(batch, tokens so far)`: 0 for left padding."""
        self.binding.bind_cpu_input("input_ids", np.ascontiguousarray(input_ids, np.int64))
        self.binding.bind_cpu_input(
            "attention_mask", np.ascontiguousarray(attention_mask, np.int64)
        )
        self.binding.bind_output("logits")  # unallocated: its shape changes
        self.session.run_with_iobinding(self.binding)
        return self.binding.get_outputs()[0].numpy()


def onnx_greedy(session, prompts: np.ndarray, mask: np.ndarray, steps: int, max_length: int):
    """The verification's greedy runner through `session` (genai interface).

    The prompt in one call, then `steps` single-token calls, each fed the argmax of the
    last: returns `(tokens (batch, steps + 1), logits)`, `logits[0]` the prompt's
    `(batch, prompt, vocabulary)` and `logits[1:]` each step's `(batch, vocabulary)`.
    """
    batch = prompts.shape[0]
    cached = SharedCacheSession(session, batch, max_length)
    ids, attention, logits, tokens = prompts, mask.astype(np.int64), [], []
    for _ in range(steps + 1):
        step_logits = cached(ids, attention)
        logits.append(step_logits if not logits else step_logits[:, -1])
        tokens.append(np.argmax(step_logits[:, -1], axis=-1))
        ids = tokens[-1][:, None]
        attention = np.concatenate([attention, np.ones((batch, 1), np.int64)], axis=1)
    return np.stack(tokens, 1), logits
