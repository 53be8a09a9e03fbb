"""A tiny SentencePiece model trained here on a few sentences (nothing downloaded), and a
tiny random keras_hub Llama CausalLM with it as its preprocessor's tokenizer."""

from __future__ import annotations

import io

SENTENCES = [
    "the quick brown fox jumps over the lazy dog",
    "a small model says hello to the world",
    "keras exports decoders to many runtimes",
    "one two three four five six seven eight nine ten",
]


LLAMA = dict(unk_id=0, bos_id=1, eos_id=2, pad_id=-1, bos_piece="<s>", eos_piece="</s>")
GEMMA = dict(pad_id=0, eos_id=1, bos_id=2, unk_id=3, bos_piece="<bos>", eos_piece="<eos>")


def sentencepiece_proto(special: dict = LLAMA, vocabulary: int = 60) -> bytes:
    """A unigram model with Llama's special tokens (`<unk>` 0, `<s>` 1, `</s>` 2) or
    Gemma's (`<pad>` 0, `<eos>` 1, `<bos>` 2, `<unk>` 3)."""
    import sentencepiece

    out = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(SENTENCES * 20),
        model_writer=out,
        vocab_size=vocabulary,
        model_type="unigram",
        hard_vocab_limit=False,  # a few sentences hold fewer pieces: take what they have
        minloglevel=2,
        **special,
    )
    return out.getvalue()


def tiny_gemma_with_tokenizer(seed: int = 0):
    """A 2-layer Gemma CausalLM with the tiny SentencePiece tokenizer (Gemma's tokens)."""
    import keras_hub
    from keras_hub_models import redraw

    tokenizer = keras_hub.models.GemmaTokenizer(proto=sentencepiece_proto(GEMMA))
    backbone = keras_hub.models.GemmaBackbone(
        vocabulary_size=tokenizer.vocabulary_size(),
        num_layers=2,
        num_query_heads=4,
        num_key_value_heads=2,
        hidden_dim=64,
        intermediate_dim=96,
        head_dim=16,
    )
    redraw(backbone, seed)
    preprocessor = keras_hub.models.GemmaCausalLMPreprocessor(tokenizer, sequence_length=64)
    return keras_hub.models.GemmaCausalLM(backbone=backbone, preprocessor=preprocessor)


def tiny_gemma3_with_tokenizer(seed: int = 4):
    """A 6-layer text-only Gemma 3 CausalLM (`keras_hub_models.FAMILIES["gemma3"]`: five
    local layers with a window of 16, one global, query/key norms, scaled embeddings) with
    the tiny SentencePiece tokenizer (Gemma's tokens, no vision tokens). Seed 4: the
    greedy texts that change most from token to token of seeds 0 to 4."""
    import keras_hub
    from keras_hub_models import COMMON, FAMILIES, redraw

    tokenizer = keras_hub.models.Gemma3Tokenizer(
        proto=sentencepiece_proto(GEMMA), has_vision_tokens=False
    )
    options = {**COMMON, **FAMILIES["gemma3"][2]}
    backbone = keras_hub.models.Gemma3Backbone(
        **{**options, "vocabulary_size": tokenizer.vocabulary_size()}
    )
    redraw(backbone, seed)
    preprocessor = keras_hub.models.Gemma3CausalLMPreprocessor(tokenizer, sequence_length=64)
    return keras_hub.models.Gemma3CausalLM(backbone=backbone, preprocessor=preprocessor)


def tiny_llama_with_tokenizer(seed: int = 0, extra_rows: int = 0):
    """A 2-layer Llama CausalLM (weights redrawn as `keras_hub_models.redraw`) whose
    preprocessor holds the tiny SentencePiece tokenizer; `extra_rows` embedding rows more
    than the tokenizer has tokens."""
    import keras_hub
    from keras_hub_models import redraw

    tokenizer = keras_hub.models.LlamaTokenizer(proto=sentencepiece_proto())
    backbone = keras_hub.models.LlamaBackbone(
        vocabulary_size=tokenizer.vocabulary_size() + extra_rows,
        num_layers=2,
        num_query_heads=4,
        hidden_dim=64,
        intermediate_dim=96,
        num_key_value_heads=2,
    )
    redraw(backbone, seed)
    preprocessor = keras_hub.models.LlamaCausalLMPreprocessor(tokenizer, sequence_length=64)
    return keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=preprocessor)


def sentencepiece_bpe_proto(special: dict = LLAMA, dummy_prefix: bool = True) -> bytes:
    """A BPE model with byte fallback and the normalization of Llama 2's and Gemma's
    models: none (identity rule, runs of spaces kept), a `▁` before the text (Llama 2)
    or not (Gemma)."""
    import sentencepiece

    out = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(SENTENCES * 20),
        model_writer=out,
        vocab_size=340,  # the 256 bytes, the special pieces and the merges
        model_type="bpe",
        byte_fallback=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=dummy_prefix,
        split_digits=True,
        hard_vocab_limit=False,
        minloglevel=2,
        **special,
    )
    return out.getvalue()
