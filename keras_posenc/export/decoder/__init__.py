"""Decoders for the runtimes' own decoder interfaces, written directly (no converter).

One idea per module: `description` (a decoder as arrays and settings, what every emitter
reads), `keras_reader` (a step model of DecoderBlocks read into one), `genai_interface`
(onnxruntime-genai's names and shapes: the inputs, outputs and caches), `graph_builder`
(an `onnx.helper` graph builder), `gqa` (attention as onnxruntime's GroupQueryAttention),
`standard` (attention as ONNX's own `Attention`), `moe` (a mixture of experts: dense ONNX
ops, or one `com.microsoft.MoE`), `onnx_decoder` (the genai-interface graph),
`litert_decoder` (the LiteRT file with `prefill` and `decode` signatures; `litert_runner`
runs it), `genai_config`, `special_tokens` (its end, start and pad ids), `tokenizer_files`
(a keras_hub tokenizer as onnxruntime-genai's files; `sentencepiece_files` converts a
SentencePiece model), `greedy_generation` (greedy generation in Keras; the onnxruntime
runner lives in the keras-free `keras_posenc_serve`), `genai_runtime` (the folder in
onnxruntime-genai), `check` (the verification; `logit_tolerance` its tolerances, `judge`
its rules for ties) and `save` (`save_decoder`). Only `litert_decoder` and
`litert_runner` need TensorFlow: their names are imported on first use, so the ONNX
export runs on every Keras backend.
"""

from keras_posenc.export.decoder.check import compare_greedy, decoder_cases, verify_decoder
from keras_posenc.export.decoder.description import Decoder
from keras_posenc.export.decoder.genai_config import genai_config
from keras_posenc.export.decoder.greedy_generation import (
    SharedCacheSession,
    keras_greedy,
    onnx_greedy,
)
from keras_posenc.export.decoder.keras_reader import describe_decoder, rope_tables
from keras_posenc.export.decoder.onnx_decoder import decoder_onnx
from keras_posenc.export.decoder.save import failed_report_path, save_decoder


def __getattr__(name: str):
    """`decoder_litert` and `litert_greedy`, whose modules import TensorFlow."""
    if name == "decoder_litert":
        from keras_posenc.export.decoder import litert_decoder

        return litert_decoder.decoder_litert
    if name == "litert_greedy":
        from keras_posenc.export.decoder import litert_runner

        return litert_runner.litert_greedy
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Decoder",
    "SharedCacheSession",
    "compare_greedy",
    "decoder_cases",
    "decoder_litert",
    "decoder_onnx",
    "describe_decoder",
    "failed_report_path",
    "genai_config",
    "keras_greedy",
    "litert_greedy",
    "onnx_greedy",
    "rope_tables",
    "save_decoder",
    "verify_decoder",
]
