"""`model.litertlm`: a LiteRT-LM bundle (the decoder, its tokenizer and LlmMetadata) and its
check in LiteRT-LM's own engine.

The bundle is written with `litert-lm-builder`'s `LitertLmFileBuilder` (as litert-torch's
`export_hf --bundle_litert_lm` writes it): the `.tflite` of `litertlm_model.py` as the
`PREFILL_DECODE` model, the tokenizer, and LlmMetadata with the start and stop tokens,
`max_num_tokens` (the cache slots), a generic model type, and `supports_thinking` /
`supports_function_calling` false (the builder's validation wants both); the model's
preferred activation type float32.

The engine takes text only, so the tokenizer is part of every check: a keras_hub CausalLM's
preprocessor's tokenizer, as its SentencePiece proto or (byte-level BPE) a `tokenizer.json`
(`litertlm_tokenizer`), or for a `decoder_models` step model (no preprocessor) the
keras_hub tokenizer passed as `tokenizer=`. A tokenizer without a start token (Qwen)
leaves the metadata's out.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
from dataclasses import dataclass
from pathlib import Path

from keras_posenc.export.decoder.litertlm_model import bundle_prefill_lengths
from keras_posenc.export.decoder.litertlm_template import (
    PromptTemplate,
    checked_prompt_template,
    engine_ids,
    write_prompt_templates,
)
from keras_posenc.export.decoder.litertlm_tokenizer import (
    HUGGING_FACE,
    BundleTokenizer,
    bundle_tokenizer,
    check_ids_fit,
    keras_hub_tokenizer,
)
from keras_posenc.export.errors import ExportError

INSTALL = 'pip install "keras-posenc[litertlm]"'


@dataclass(frozen=True)
class BundlePlan:
    """What the bundle holds besides the model: checked before any file is written."""

    tokenizer: BundleTokenizer
    keras_tokenizer: object  # the keras_hub tokenizer: the check's prompts and texts
    start_token: int | None  # None: the tokenizer has none (Qwen), the prompt has none
    stop_tokens: tuple[int, ...]
    max_length: int
    prefill_lengths: tuple[int, ...]
    prompt_template: PromptTemplate | None = None  # LlmMetadata's `prompt_templates`

    @property
    def cache_slots(self) -> int:
        """The file's cache slots: `max_length` and room for the padding of a last chunk.

        The engine pads a prompt's last chunk to a `prefill_<n>` and writes the padding to
        the cache after the real tokens: a chunk of one token at slot `max_length - 2`
        (the longest prompt the engine takes) ends at `max_length - 2 + n`. With only
        `max_length` slots the write would not fit and the graph's NaN logits give
        `<unk>` tokens."""
        return self.max_length + self.prefill_lengths[-1]


def _require_packages() -> None:
    try:
        import litert_lm  # noqa: F401
        import litert_lm_builder  # noqa: F401
    except ImportError as error:
        raise ExportError(
            f"formats=('litertlm',) needs LiteRT-LM's builder and runtime ({error.name} is "
            f"not installed): {INSTALL}."
        ) from error


def _start_and_end(tokenizer, file: BundleTokenizer) -> tuple:
    """The tokenizer's start and end ids (keras_hub's family tokenizers name them); for a
    plain `SentencePieceTokenizer`, which names none, its model's `bos_id` / `eos_id`."""
    start = getattr(tokenizer, "start_token_id", None)
    end = getattr(tokenizer, "end_token_id", None)
    if end is None and file.file_name != HUGGING_FACE:
        import sentencepiece

        model = sentencepiece.SentencePieceProcessor(model_proto=file.content)
        start = model.bos_id() if model.bos_id() >= 0 else None
        end = model.eos_id() if model.eos_id() >= 0 else None
    return start, end


def litertlm_plan(
    model,
    vocabulary: int,
    max_length: int,
    prefill_lengths=None,
    tokenizer=None,
    prompt_template=None,
) -> BundlePlan:
    """The tokenizer and metadata of `model`'s bundle, checked before any work.

    Args:
        model: a keras_hub CausalLM with a SentencePiece or byte-level BPE tokenizer in
            its preprocessor, or a `decoder_models` step model with `tokenizer`.
        vocabulary: the rows of the model's embedding.
        max_length: the cache slots of the export (LlmMetadata's `max_num_tokens`).
        prefill_lengths: the lengths of the `prefill_<n>` signatures (None: the defaults
            that fit `max_length`).
        tokenizer: a keras_hub tokenizer for a step model (a CausalLM's is its
            preprocessor's).
        prompt_template: None, or LlmMetadata's `prompt_templates` as roles to
            `{"prefix", "suffix"}` (`litertlm_template.py`).

    Raises:
        ExportError: the packages are missing, the model has no tokenizer the bundle can
            hold, or its vocabulary or stop tokens do not fit the embedding.
        ValueError, TypeError: `prefill_lengths` or `max_length` do not fit the bundle (each
            length must leave a slot for a generated token), or `prompt_template` is not a
            template or leaves no room for a prompt.
    """
    _require_packages()
    lengths = bundle_prefill_lengths(max_length, prefill_lengths)
    template = checked_prompt_template(prompt_template)
    tokenizer = keras_hub_tokenizer(model, tokenizer)
    file = bundle_tokenizer(tokenizer)
    size = int(tokenizer.vocabulary_size())
    if size != vocabulary:
        raise ExportError(
            f"The tokenizer has {size} tokens and the model's embedding {vocabulary} rows: "
            "the bundle would pair them wrongly. Export the model with its own tokenizer."
        )
    check_ids_fit(tokenizer, vocabulary)
    start, end = _start_and_end(tokenizer, file)
    if end is None:
        raise ExportError(
            f"{type(tokenizer).__name__} has no end token (end_token_id None); LiteRT-LM's "
            "metadata needs a stop token."
        )
    start = None if start is None else int(start)
    # keras_hub's generate() stops at both of Llama 3's end tokens (`end_token2_id`).
    second = getattr(tokenizer, "end_token2_id", None)
    stops = (int(end),) if second is None else (int(end), int(second))
    named = stops if start is None else (start, *stops)
    outside = [token for token in named if not 0 <= token < vocabulary]
    if outside:
        raise ExportError(
            f"Start/stop token ids {outside} are outside the vocabulary (0...{vocabulary - 1})."
        )
    if template is not None:
        fixed = len(engine_ids(tokenizer, template, "", start))
        if fixed + 1 > max_length - 2:  # a one-token prompt and a generated token
            raise ValueError(
                f"prompt_template takes {fixed} tokens with the start token: max_length "
                f"{max_length} leaves no room for a prompt (the engine takes at most "
                f"max_length - 2 = {max_length - 2})."
            )
    return BundlePlan(file, tokenizer, start, stops, max_length, lengths, template)


def litertlm_bundle(tflite: bytes, plan: BundlePlan) -> bytes:
    """The `.litertlm` bytes: `tflite`, `plan`'s tokenizer and LlmMetadata."""
    from litert_lm_builder import litertlm_builder as builder
    from litert_lm_builder.runtime.proto import llm_metadata_pb2

    metadata = llm_metadata_pb2.LlmMetadata()
    if plan.start_token is not None:
        metadata.start_token.token_ids.ids.append(plan.start_token)
    for token in plan.stop_tokens:
        metadata.stop_tokens.add().token_ids.ids.append(token)
    metadata.max_num_tokens = plan.max_length
    metadata.llm_model_type.generic_model.SetInParent()
    write_prompt_templates(metadata, plan.prompt_template)
    with tempfile.TemporaryDirectory(prefix="keras_posenc_litertlm_") as folder:
        folder = Path(folder)
        (folder / "model.tflite").write_bytes(tflite)
        tokenizer = folder / plan.tokenizer.file_name
        tokenizer.write_bytes(plan.tokenizer.content)
        (folder / "metadata.pb").write_bytes(metadata.SerializeToString())
        bundle = builder.LitertLmFileBuilder()
        with contextlib.redirect_stdout(io.StringIO()):  # the builder prints the choice
            # float32 activations: the file is verified against keras_hub in float32.
            bundle.add_tflite_model(
                str(folder / "model.tflite"),
                builder.TfLiteModelType.PREFILL_DECODE,
                prefer_activation_type="float32",
            )
        if plan.tokenizer.file_name == HUGGING_FACE:
            bundle.add_hf_tokenizer(str(tokenizer))
        else:
            bundle.add_sentencepiece_tokenizer(str(tokenizer))
        bundle.add_llm_metadata(
            str(folder / "metadata.pb"), supports_thinking=False, supports_function_calling=False
        )
        with open(folder / "model.litertlm", "wb") as stream:
            bundle.build(stream, validate_metadata=True)
        return (folder / "model.litertlm").read_bytes()


def litertlm_file(model, plan: BundlePlan, quantization=None) -> bytes:
    """The `.litertlm` bytes of keras_hub CausalLM or step model `model` (`plan` from
    `litertlm_plan`; `quantization` a `quantized_graph.Quantization` or None)."""
    from keras_posenc import keras_hub as bridge
    from keras_posenc.export.decoder.keras_reader import describe_decoder
    from keras_posenc.export.decoder.litertlm_model import decoder_litertlm_tflite

    if bridge.is_keras_hub_causal_lm(model):
        decoder = bridge.describe_causal_lm(model, plan.cache_slots)
    else:
        decoder = describe_decoder(model, plan.cache_slots)
    tflite = decoder_litertlm_tflite(decoder, plan.prefill_lengths, quantization)
    return litertlm_bundle(tflite, plan)
