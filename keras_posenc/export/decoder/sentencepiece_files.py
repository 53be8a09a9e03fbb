"""`tokenizer.json` and `tokenizer_config.json` for a keras_hub `SentencePieceTokenizer`
(Llama 2, Gemma, Mistral, ...), in the forms onnxruntime-genai 0.18 (onnxruntime-extensions
inside) reads and encodes as SentencePiece does. og reads no `tokenizer.model`, so the
SentencePiece model is converted, from its proto alone (no transformers at run time):

- A BPE model (Llama 2, Gemma, Mistral) becomes what transformers writes for
  `LlamaTokenizer`: a tokenizers `BPE` model with byte fallback, its merges taken from
  the pieces (every split of a piece into two pieces, in the order of the merged piece's
  score, as SentencePiece merges), the normalizer `Prepend("▁")` (where the model adds
  a dummy prefix) and `Replace(" ", "▁")`, and the decoder `Replace("▁", " ")`,
  `ByteFallback`, `Fuse`, `Strip`. `tokenizer_class` `LlamaTokenizer` makes og use its
  SentencePiece BPE path (`<0xXY>` byte pieces, `▁` for spaces).
- A unigram model becomes a tokenizers `Unigram` model (`[piece, score]`), the model's
  precompiled character map as the normalizer and `Metaspace`: with a unigram class
  (`XLMRobertaTokenizer`) og uses its SentencePiece unigram tokenizer (a Viterbi search
  over the scores after SentencePiece's default normalization: the character map, a `▁`
  before the text, runs of spaces collapsed, leading and trailing spaces dropped).

Control and unknown pieces are special added tokens (og's `decode` leaves them out, as
keras_hub's `generate()` leaves its start, end and pad tokens out), user-defined pieces
plain added tokens.

Not written, where og would encode differently (the reason is returned): a BPE model
without byte fallback (og writes -1 for a character no piece covers, SentencePiece the
unknown id), or with a normalization rule other than identity, or collapsing runs of
spaces (og's BPE path applies neither); a unigram model with byte fallback (og's unigram
tokenizer writes the unknown id where SentencePiece writes the bytes) or with whitespace
handling other than SentencePiece's default; other model types (word, char).
"""

from __future__ import annotations

import base64

# sentencepiece's ModelProto.SentencePiece.Type
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _BYTE = 1, 2, 3, 4, 6


def _model_proto(proto: bytes):
    from sentencepiece import sentencepiece_model_pb2

    model = sentencepiece_model_pb2.ModelProto()
    model.ParseFromString(proto)
    return model


def _added_tokens(model) -> list[dict]:
    options = dict(single_word=False, lstrip=False, rstrip=False, normalized=False)
    return [
        {"id": i, "content": p.piece, **options, "special": p.type != _USER_DEFINED}
        for i, p in enumerate(model.pieces)
        if p.type in (_UNKNOWN, _CONTROL, _USER_DEFINED)
    ]


def _merges(model) -> list[list[str]]:
    """Every split of a normal piece into two pieces, by the merged piece's score
    (SentencePiece BPE merges the pair whose result scores highest; its pieces are in
    that order), a piece's splits by the length of the left one (the order of
    transformers' `generate_merges`)."""
    ids = {p.piece: i for i, p in enumerate(model.pieces)}
    merges = []
    for piece in model.pieces:
        if piece.type != _NORMAL:
            continue
        text = piece.piece
        splits = [(text[:i], text[i:]) for i in range(1, len(text))]
        merges += [(piece.score, a, b) for a, b in splits if a in ids and b in ids]
    merges.sort(key=lambda merge: -merge[0])  # stable: ties keep the order above
    return [[a, b] for _, a, b in merges]


def _bpe_json(model) -> dict:
    normalizers = [{"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]
    decoders = [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
        {"type": "ByteFallback"},
        {"type": "Fuse"},
    ]
    if model.normalizer_spec.add_dummy_prefix:
        normalizers.insert(0, {"type": "Prepend", "prepend": "▁"})
        decoders.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    unknown = model.trainer_spec.unk_id
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": _added_tokens(model),
        "normalizer": {"type": "Sequence", "normalizers": normalizers},
        "pre_tokenizer": None,
        "post_processor": None,
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": model.pieces[unknown].piece,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": True,
            "ignore_merges": False,
            "vocab": {p.piece: i for i, p in enumerate(model.pieces)},
            "merges": _merges(model),
        },
    }


def _unigram_json(model) -> dict:
    charsmap = model.normalizer_spec.precompiled_charsmap
    metaspace = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": _added_tokens(model),
        "normalizer": {
            "type": "Precompiled",
            "precompiled_charsmap": base64.b64encode(charsmap).decode("ascii"),
        },
        "pre_tokenizer": metaspace,
        "post_processor": None,
        "decoder": metaspace,
        "model": {
            "type": "Unigram",
            "unk_id": int(model.trainer_spec.unk_id),
            "vocab": [[p.piece, float(p.score)] for p in model.pieces],
            "byte_fallback": False,
        },
    }


def _config(model, tokenizer_class: str) -> dict:
    trainer = model.trainer_spec
    config = {"tokenizer_class": tokenizer_class, "add_bos_token": False, "add_eos_token": False}
    for key, piece_id in (
        ("bos_token", trainer.bos_id),
        ("eos_token", trainer.eos_id),
        ("unk_token", trainer.unk_id),
        ("pad_token", trainer.pad_id),
    ):
        if 0 <= piece_id < len(model.pieces):
            config[key] = model.pieces[piece_id].piece
    config["clean_up_tokenization_spaces"] = False
    return config


def _why_not(model) -> str:
    """Why og would not encode `model` as SentencePiece does; "" where it would."""
    trainer, normalizer = model.trainer_spec, model.normalizer_spec
    fallback = trainer.byte_fallback or any(p.type == _BYTE for p in model.pieces)
    if trainer.treat_whitespace_as_suffix or not normalizer.escape_whitespaces:
        return "its SentencePiece model does not mark a word's start with '▁'"
    if trainer.model_type == trainer.BPE:
        if not fallback:
            return (
                "its SentencePiece BPE model has no byte fallback (onnxruntime-genai 0.18 "
                "encodes a character no piece covers as -1, not the unknown id)"
            )
        if normalizer.precompiled_charsmap or normalizer.remove_extra_whitespaces:
            rule = normalizer.name or "a character map"
            return (
                f"its SentencePiece BPE model normalizes the text ({rule}"
                f"{', runs of spaces collapsed' if normalizer.remove_extra_whitespaces else ''}"
                "), which onnxruntime-genai 0.18's SentencePiece BPE path does not"
            )
        return ""
    if trainer.model_type == trainer.UNIGRAM:
        if fallback:
            return (
                "its SentencePiece unigram model has byte fallback (onnxruntime-genai 0.18's "
                "unigram tokenizer writes the unknown id where SentencePiece writes bytes)"
            )
        if not (normalizer.add_dummy_prefix and normalizer.remove_extra_whitespaces):
            return (
                "its SentencePiece unigram model keeps runs of spaces or adds no '▁' before "
                "the text (onnxruntime-genai 0.18's unigram tokenizer always does both)"
            )
        return ""
    kind = trainer.ModelType.Name(trainer.model_type)
    return f"its SentencePiece model is {kind}, neither BPE nor unigram"


def sentencepiece_files(proto: bytes) -> tuple[dict, str]:
    """`({file name: content}, "")` for a SentencePiece model proto, or `({}, why)` where
    onnxruntime-genai would not encode it as SentencePiece does.

    Args:
        proto: the serialized SentencePiece `ModelProto` (keras_hub's `tokenizer.proto`).
    """
    try:
        model = _model_proto(proto)
    except ImportError:
        return {}, "needs the sentencepiece package to be converted (pip install sentencepiece)"
    why = _why_not(model)
    if why:
        return {}, why
    if model.trainer_spec.model_type == model.trainer_spec.BPE:
        return {
            "tokenizer.json": _bpe_json(model),
            "tokenizer_config.json": _config(model, "LlamaTokenizer"),
        }, ""
    return {
        "tokenizer.json": _unigram_json(model),
        "tokenizer_config.json": _config(model, "XLMRobertaTokenizer"),
    }, ""
