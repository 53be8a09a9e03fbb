"""The tokenizer files onnxruntime-genai reads (`tokenizer.json`, `tokenizer_config.json`),
written from a keras_hub CausalLM's preprocessor, so `og.Tokenizer(og.Model(folder))`
encodes and decodes text as keras_hub's tokenizer does.

Written for keras_hub's byte-level BPE tokenizers (`BytePairTokenizer` and its subclasses:
GPT-2, Llama 3, Qwen, ...): the vocabulary and merges as a tokenizers-library `BPE` model
with GPT-2's `ByteLevel` pre-tokenizer and decoder (the files Hugging Face writes for
GPT-2), each special token of the tokenizer as an added token. onnxruntime-genai 0.18
reads only `tokenizer.json` (a `tokenizer.model` beside it is refused: "Invalid file"), so
a SentencePiece tokenizer's model (Llama 2, Gemma, Mistral) is converted to the
`tokenizer.json` og reads as SentencePiece (`sentencepiece_files`); where og would encode
it otherwise the folder is kept without tokenizer files, with a warning naming the
tokenizer's class and the reason (feed token ids). og's `encode` adds no start token (it
does not apply a post-processor): prepend `bos_token_id` as keras_hub's preprocessor does.
"""

from __future__ import annotations

import warnings

from keras_posenc.export.decoder.sentencepiece_files import sentencepiece_files
from keras_posenc.export.decoder.special_tokens import tokenizer_of


def _is(tokenizer, name: str) -> bool:
    return any(cls.__name__ == name for cls in type(tokenizer).__mro__)


def _byte_pair(tokenizer) -> bool:
    return _is(tokenizer, "BytePairTokenizer")


def _added_tokens(tokenizer, vocabulary: dict) -> list[dict]:
    specials = sorted(
        {token for token in getattr(tokenizer, "special_tokens", []) if token in vocabulary},
        key=vocabulary.get,
    )
    options = dict(single_word=False, lstrip=False, rstrip=False, normalized=False)
    return [{"id": vocabulary[t], "content": t, **options, "special": True} for t in specials]


def byte_pair_tokenizer_json(tokenizer) -> dict:
    """`tokenizer.json` of a keras_hub `BytePairTokenizer`: BPE with GPT-2's byte-level
    pre-tokenizer and decoder."""
    vocabulary = {str(token): int(i) for token, i in dict(tokenizer.vocabulary).items()}
    byte_level = {
        "type": "ByteLevel",
        "add_prefix_space": bool(getattr(tokenizer, "add_prefix_space", False)),
        "trim_offsets": True,
        "use_regex": True,
    }
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": _added_tokens(tokenizer, vocabulary),
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": None,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocabulary,
            "merges": [str(merge) for merge in tokenizer.merges],
        },
    }


def tokenizer_config(tokenizer) -> dict:
    """`tokenizer_config.json`: the class the files load as, and the special tokens."""
    names = {"bos_token": "start_token", "eos_token": "end_token", "pad_token": "pad_token"}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": False}
    for key, attribute in names.items():
        token = getattr(tokenizer, attribute, None)
        if isinstance(token, str):
            config[key] = token
    config["clean_up_tokenization_spaces"] = False
    return config


def tokenizer_files(model) -> dict:
    """`{file name: content}` for the tokenizer of `model`'s keras_hub preprocessor; `{}`
    where there is none, or (with a warning) where its kind is not written.

    `{}` and a warning also for a SentencePiece model onnxruntime-genai 0.18 would not
    encode as SentencePiece does (see `sentencepiece_files`)."""
    tokenizer = tokenizer_of(model)
    if tokenizer is None:
        return {}
    if _byte_pair(tokenizer):
        return {
            "tokenizer.json": byte_pair_tokenizer_json(tokenizer),
            "tokenizer_config.json": tokenizer_config(tokenizer),
        }
    if _is(tokenizer, "SentencePieceTokenizer"):
        proto = getattr(tokenizer, "proto", None)
        files, why = sentencepiece_files(proto) if proto else ({}, "no model is loaded")
    else:
        files, why = {}, "neither a byte-level BPE nor a SentencePiece tokenizer"
    if why:
        warnings.warn(
            f"The folder carries no tokenizer files for {type(tokenizer).__name__}: {why}. "
            "Feed og.Generator token ids from keras_hub's tokenizer.",
            stacklevel=4,  # the caller of save_decoder
        )
    return files
