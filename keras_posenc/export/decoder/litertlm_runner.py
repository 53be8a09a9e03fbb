"""The `.tflite` a `.litertlm` bundle holds, read back from the bundle and run as LiteRT-LM
runs it: batch 1, a prompt split over the static `prefill_<n>` signatures (the last chunk
padded), then `decode`.

`bundle_tflite` reads the bytes of the bundle's `TFLiteModel` section (litert-lm-builder's
header reader), so what is run is what the bundle packs; `bundle_greedy` is the greedy run
of `greedy_generation.keras_greedy`'s layout through it, one row of a batch at a time.
A chunk takes the longest `prefill_<n>` it fills, else the shortest that holds it, padded
with token 0 after the real tokens: their slots, written after the chunk's, are each
written again by the next call before a query sees them (a row sees slots up to its own).
Imports TensorFlow, as `litert_runner.py` does.
"""

from __future__ import annotations

import io
from collections.abc import Callable

import numpy as np

from keras_posenc.export.decoder.litert_runner import causal_mask


def bundle_section(path, data_type: str) -> bytes:
    """The bytes of the one section of `data_type` (litert-lm-builder's
    `AnySectionDataType` name: `"TFLiteModel"`, `"LlmMetadataProto"`, ...) of the
    `.litertlm` file at `path`.

    Raises:
        ValueError: the file has no such section, or more than one.
    """
    from litert_lm_builder import litertlm_peek
    from litert_lm_builder.litertlm_header_schema_py_generated import AnySectionDataType

    header = litertlm_peek.read_litertlm_header(str(path), io.StringIO())
    sections = header.SectionMetadata()
    kind = getattr(AnySectionDataType, data_type)
    found = [
        sections.Objects(i)
        for i in range(sections.ObjectsLength())
        if sections.Objects(i).DataType() == kind
    ]
    if len(found) != 1:
        raise ValueError(f"{path} has {len(found)} {data_type} sections, not one.")
    with open(path, "rb") as stream:
        stream.seek(found[0].BeginOffset())
        return stream.read(found[0].EndOffset() - found[0].BeginOffset())


def bundle_tflite(path) -> bytes:
    """The `.tflite` bytes the `.litertlm` file at `path` packs."""
    return bundle_section(path, "TFLiteModel")


class StaticDecoder:
    """The bundle's `prefill_<n>` and `decode` runners, batch 1, the cache kept between calls."""

    def __init__(self, content: bytes):
        from keras_posenc.export.litert import litert_interpreter

        self.interpreter = litert_interpreter(content)
        names = self.interpreter.get_signature_list()
        self.runners = {name: self.interpreter.get_signature_runner(name) for name in names}
        self.lengths = sorted(int(n.split("_")[1]) for n in names if n.startswith("prefill_"))
        self.details = self.runners["decode"].get_input_details()
        self.slots = int(self.details["mask"]["shape"][-1])
        self.reset()

    def reset(self) -> None:
        """An empty cache: the next call starts a sequence."""
        self.caches = {
            name: np.zeros(d["shape"], np.float32)
            for name, d in self.details.items()
            if name.startswith("kv_cache_")
        }

    def _chunk(self, remaining: int) -> tuple[str, int]:
        """`(signature, length)` of the next call for `remaining` tokens."""
        if remaining == 1:
            return "decode", 1
        filled = [n for n in self.lengths if n <= remaining]
        n = filled[-1] if filled else next(n for n in self.lengths if n >= remaining)
        return f"prefill_{n}", n

    def __call__(self, tokens: np.ndarray, start: int, padding: np.ndarray) -> np.ndarray:
        """Logits `(1, tokens, vocabulary)` of `tokens` `(1, n)` written at slots `start...`;
        `padding` `(1, slots)` (1 for real slots)."""
        logits, done = [], 0
        while done < tokens.shape[1]:
            name, n = self._chunk(tokens.shape[1] - done)
            real = min(n, tokens.shape[1] - done)
            chunk = np.zeros((1, n), np.int32)
            chunk[:, :real] = tokens[:, done : done + real]
            input_pos = np.arange(start + done, start + done + n, dtype=np.int32)
            mask = causal_mask(padding, input_pos)
            out = self.runners[name](tokens=chunk, input_pos=input_pos, mask=mask, **self.caches)
            self.caches = {name: out[name] for name in self.caches}
            logits.append(out["logits"][:, :real])
            done += real
        return np.concatenate(logits, axis=1)


def bundle_greedy(content: bytes) -> Callable:
    """`greedy(prompts, mask, steps) -> (tokens, logits)` through the bundle's `.tflite`
    bytes `content`, as `litert_runner.litert_greedy` (same outputs), row by row."""

    def greedy(prompts: np.ndarray, mask: np.ndarray, steps: int):
        rows, runner = [], StaticDecoder(content)
        for row in range(prompts.shape[0]):
            runner.reset()
            padding = np.ones((1, runner.slots), np.int32)
            padding[:, : prompts.shape[1]] = mask[row]
            ids, start, logits, tokens = prompts[row : row + 1], 0, [], []
            for _ in range(steps + 1):
                step_logits = runner(ids, start, padding)
                logits.append(step_logits if not logits else step_logits[:, -1])
                tokens.append(np.argmax(step_logits[:, -1], axis=-1))
                start += ids.shape[1]
                ids = tokens[-1][:, None].astype(np.int32)
            rows.append((np.stack(tokens, 1), logits))
        tokens = np.concatenate([r[0] for r in rows])
        logits = [np.concatenate([r[1][i] for r in rows]) for i in range(steps + 1)]
        return tokens, logits

    return greedy
