"""The special token ids `genai_config.json` carries: checked at the entry, read from a
keras_hub preprocessor's tokenizer where the model has one.

onnxruntime-genai 0.18 refuses to load a folder whose `eos_token_id` lies outside
`[0, vocab_size)`, and where none is written it ends generations at `pad_token_id`
(checked: an absent or empty `eos_token_id` stops at the pad id; -1 or the vocabulary size
is refused at `og.Model`). So every generation in it has an end token inside the
vocabulary: with none known, the pad id is written, and a warning says that `og.Generator`
stops where the model picks it (keras_hub's `generate(stop_token_ids=None)` and
`keras_posenc_serve` without `stop_token_ids` go on).
"""

from __future__ import annotations

import warnings

import numpy as np

from keras_posenc.export.errors import ExportError


def _is_id(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def check_id_types(bos_token_id, eos_token_id, pad_token_id) -> None:
    """TypeError naming the argument that is not None, an integer or (eos) a list of them."""
    for name, value in (("bos_token_id", bos_token_id), ("pad_token_id", pad_token_id)):
        if value is not None and not _is_id(value):
            raise TypeError(f"{name} must be None or an integer token id, got {value!r}.")
    if eos_token_id is None or _is_id(eos_token_id):
        return
    if (
        not isinstance(eos_token_id, (list, tuple))
        or not eos_token_id
        or not all(map(_is_id, eos_token_id))
    ):
        raise TypeError(
            "eos_token_id must be None, an integer token id or a non-empty list of them, "
            f"got {eos_token_id!r}."
        )


def tokenizer_of(model):
    """The keras_hub tokenizer of a CausalLM's preprocessor, or None."""
    preprocessor = getattr(model, "preprocessor", None)
    return getattr(preprocessor, "tokenizer", None)


def _from_tokenizer(tokenizer) -> dict:
    """What a keras_hub tokenizer names: its start, end (and Llama 3's second end) and pad."""
    if tokenizer is None:
        return {}
    ends = [getattr(tokenizer, name, None) for name in ("end_token_id", "end_token2_id")]
    found = {
        "bos_token_id": getattr(tokenizer, "start_token_id", None),
        "eos_token_id": [int(t) for t in ends if t is not None] or None,
        "pad_token_id": getattr(tokenizer, "pad_token_id", None),
    }
    if found["eos_token_id"] and len(found["eos_token_id"]) == 1:
        found["eos_token_id"] = found["eos_token_id"][0]
    return {name: value for name, value in found.items() if value is not None}


def special_ids(model, vocabulary: int, bos_token_id, eos_token_id, pad_token_id) -> dict:
    """`{bos_token_id, eos_token_id, pad_token_id}` for `genai_config`: the ones given, else
    the keras_hub tokenizer's, else 0 (bos, pad) and the pad id (eos, with a warning).

    Raises:
        ExportError: a given id outside `[0, vocabulary)` (onnxruntime-genai would refuse
            to load the folder).
    """
    given = {"bos_token_id": bos_token_id, "eos_token_id": eos_token_id}
    given["pad_token_id"] = pad_token_id
    given = {name: value for name, value in given.items() if value is not None}
    ids = {**_from_tokenizer(tokenizer_of(model)), **given}
    for name, value in ids.items():
        values = value if isinstance(value, (list, tuple)) else [value]
        outside = [int(v) for v in values if not 0 <= v < vocabulary]
        if outside:
            source = "" if name in given else " (the keras_hub tokenizer's)"
            raise ExportError(
                f"{name} {outside[0]}{source} is outside the model's vocabulary "
                f"[0, {vocabulary}): onnxruntime-genai refuses to load a folder with it. "
                f"Pass {name}= the id of a token of the vocabulary."
            )
    ids.setdefault("bos_token_id", 0)
    ids.setdefault("pad_token_id", 0)
    if "eos_token_id" not in ids:
        warnings.warn(
            f"No end token given (eos_token_id) and none known from a tokenizer: "
            f"genai_config.json names the pad id {ids['pad_token_id']} as eos_token_id "
            "(onnxruntime-genai needs one inside the vocabulary, and uses the pad id where "
            "none is written), so og.Generator stops wherever the model picks it. Pass "
            "eos_token_id=... to choose the end token.",
            stacklevel=4,  # the caller of save_decoder
        )
        ids["eos_token_id"] = ids["pad_token_id"]
    return {name: _plain(value) for name, value in ids.items()}


def _plain(value):
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else int(value)
