"""The tokenizer a `.litertlm` bundle holds, from a keras_hub CausalLM's preprocessor.

LiteRT-LM reads two kinds (`litert-lm-builder`'s `add_sentencepiece_tokenizer` and
`add_hf_tokenizer`): a SentencePiece model (Gemma, Llama 2), held as its proto as it is, and
a Hugging Face `tokenizer.json`, for keras_hub's byte-level BPE tokenizers
(`BytePairTokenizer`: Llama 3, Qwen, SmolLM3, GPT-2), written as the onnxruntime-genai
folder writes it (`tokenizer_files.byte_pair_tokenizer_json`: one definition for both).
For a `decoder_models` step model, the keras_hub tokenizer passed with it. Anything
else, or no tokenizer, is refused by name.

The engine decodes a `tokenizer.json` with its special tokens as text (tokenizers-cpp's
`Decode` without `skip_special_tokens`), where keras_hub's `generate()` leaves them out
(and SentencePiece decodes its control pieces to nothing): the bundle's `tokenizer.json`
has one decoder step more, before the byte-level one, that makes each special token's
piece empty. It matches a piece that is a special token as a whole, so ordinary text
that spells one out from other pieces is decoded as it is. The start token keeps its text:
the engine puts the start token's decoded text before a prompt and encodes the two (with
its text empty, the prompt ran without the start token and the text differed from the
first token), so a start token the model generates shows as its text where keras_hub's
text has none.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from keras_posenc.export.errors import ExportError

SENTENCEPIECE, HUGGING_FACE = "tokenizer.model", "tokenizer.json"


@dataclass(frozen=True)
class BundleTokenizer:
    """The bundle's tokenizer file: its name (which builder call adds it) and bytes."""

    file_name: str  # SENTENCEPIECE or HUGGING_FACE
    content: bytes


def _is(tokenizer, name: str) -> bool:
    return any(cls.__name__ == name for cls in type(tokenizer).__mro__)


def keras_hub_tokenizer(model, tokenizer=None):
    """The keras_hub tokenizer of `model`'s preprocessor, or `tokenizer` for a step model.

    Args:
        model: a keras_hub CausalLM or a `decoder_models` step model.
        tokenizer: None, or a keras_hub tokenizer for a step model (a CausalLM's is its
            preprocessor's).

    Raises:
        ExportError: `model` is a step model without `tokenizer`, or a CausalLM built
            without a preprocessor.
        ValueError: `tokenizer` given for a keras_hub CausalLM.
    """
    from keras_posenc import keras_hub as bridge  # here: the bridge imports this package

    if not bridge.is_keras_hub_causal_lm(model):
        if tokenizer is None:
            raise ExportError(
                "formats=('litertlm',) needs a tokenizer, and a decoder_models step model has "
                "none: pass the keras_hub tokenizer its ids are of, `tokenizer=` (e.g. a "
                "SentencePieceTokenizer or BytePairTokenizer)."
            )
        return tokenizer
    if tokenizer is not None:
        raise ValueError(
            f"tokenizer= is for decoder_models step models; the {type(model).__name__}'s "
            "tokenizer is its preprocessor's (build it with the preprocessor instead)."
        )
    tokenizer = getattr(getattr(model, "preprocessor", None), "tokenizer", None)
    if tokenizer is None:
        raise ExportError(
            f"formats=('litertlm',) needs the {type(model).__name__}'s tokenizer, and it has "
            "no preprocessor: build it with one (e.g. `from_preset(..., preprocessor=...)` or "
            "`preprocessor=<Family>CausalLMPreprocessor(tokenizer)`)."
        )
    return tokenizer


def check_ids_fit(tokenizer, rows: int) -> None:
    """Refuses a byte-pair vocabulary with an id that has no row in the model's embedding
    (as many tokens as rows, but a gap in the ids); SentencePiece's ids are its pieces'
    positions, so a matching size is enough there.

    Raises:
        ExportError: naming the first such id and its token.
    """
    if not _is(tokenizer, "BytePairTokenizer"):
        return
    vocabulary = dict(tokenizer.vocabulary)
    past = sorted((int(i), str(token)) for token, i in vocabulary.items() if not 0 <= i < rows)
    if past:
        token_id, token = past[0]
        raise ExportError(
            f"The tokenizer's token id {token_id} ({token}) is outside the model's embedding "
            f"(0...{rows - 1}; {len(past)} such ids): the bundle would give the model tokens "
            "it has no row for. Export the model with its own tokenizer."
        )


def _escaped(text: str) -> str:
    """`text` as a literal in an Oniguruma regular expression (the tokenizers library's)."""
    return "".join("\\" + c if c in _REGEX_SPECIAL else c for c in text)


_REGEX_SPECIAL = set(".^$*+?()[]{}|\\")


def _special_tokens_decoded_empty(tokenizer_json: dict, start_token: str | None) -> dict:
    """`tokenizer_json` with a first decoder step that empties special-token pieces, all
    but `start_token` (the engine puts the start token's decoded text before a prompt)."""
    specials = [
        token["content"]
        for token in tokenizer_json["added_tokens"]
        if token["special"] and token["content"] != start_token
    ]
    if not specials:
        return tokenizer_json
    whole = "^(?:" + "|".join(map(_escaped, specials)) + ")$"
    empty = {"type": "Replace", "pattern": {"Regex": whole}, "content": ""}
    decoders = [empty, tokenizer_json["decoder"]]
    return {**tokenizer_json, "decoder": {"type": "Sequence", "decoders": decoders}}


def bundle_tokenizer(tokenizer) -> BundleTokenizer:
    """The file LiteRT-LM reads for keras_hub `tokenizer`.

    Raises:
        ExportError: `tokenizer` is neither a SentencePiece tokenizer with a loaded model
            nor a byte-level BPE tokenizer.
    """
    from keras_posenc.export.decoder.tokenizer_files import byte_pair_tokenizer_json

    if _is(tokenizer, "BytePairTokenizer"):
        start = getattr(tokenizer, "start_token", None)
        hugging_face = _special_tokens_decoded_empty(byte_pair_tokenizer_json(tokenizer), start)
        text = json.dumps(hugging_face, ensure_ascii=False)
        return BundleTokenizer(HUGGING_FACE, text.encode("utf-8"))
    proto = getattr(tokenizer, "proto", None)
    if isinstance(proto, bytes):  # a SentencePiece tokenizer with its model loaded
        return BundleTokenizer(SENTENCEPIECE, proto)
    raise ExportError(
        f"formats=('litertlm',) writes SentencePiece and byte-level BPE tokenizers; "
        f"{type(tokenizer).__name__} is neither (or holds no SentencePiece model)."
    )
