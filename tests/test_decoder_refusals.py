"""`save_decoder` refuses, by name and before any work, what it cannot write exactly.

Quantized layers (`model.quantize(mode)`: int8 kernels read as float weights gave "a
different token at step 0", and with `verify=False` a wrong file was kept); attention
settings the description does not carry (Llama 4's `attention_chunk_size` and
`query_temperature`, or any other non-default key of the layer's config); and float16 /
mixed_float16 models are exported as their float32 copy (as bfloat16 ones are) or
refused with `bfloat16="error"`. keras_hub's Qwen2 with its sliding window is exported
and verified (keras_hub 0.32's attention tests a tensor's truth, so its reference runs
eagerly).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import warnings

import keras
import onnxruntime
import pytest
from keras_hub_models import MAX_LENGTH as HUB_LENGTH
from keras_hub_models import VOCABULARY as HUB_VOCABULARY
from keras_hub_models import tiny_causal_lm
from test_decoder_save import MAX_LENGTH, VOCABULARY, WIDTH, step_model

from keras_posenc import DecoderBlock, RotaryGroupQueryAttention, decoder_models
from keras_posenc.export import save_decoder
from keras_posenc.export.decoder import (
    compare_greedy,
    decoder_cases,
    decoder_onnx,
    onnx_greedy,
    runtime_version,
)
from keras_posenc.export.errors import ExportError
from keras_posenc.keras_hub import describe_causal_lm, keras_hub_greedy


def _no_work(monkeypatch):
    """Any emitter or verification reached fails the test: the refusal comes first."""
    from keras_posenc.export.decoder import save

    def reached(*args, **kwargs):
        raise AssertionError("the export started before refusing")

    for name in ("decoder_onnx", "decoder_litert", "verify_decoder"):
        monkeypatch.setattr(save, name, reached)


@contextlib.contextmanager
def _quantizing():
    """Keras's warnings off, and its `gc.collect()` skipped: `Layer.__delattr__` runs a full
    collection of the test session's heap for each kernel `quantize` replaces, which frees
    nothing the refusals look at."""
    with warnings.catch_warnings(), pytest.MonkeyPatch.context() as patch:
        warnings.simplefilter("ignore")  # "Layer RMSNormalization does not have `quantize`"
        patch.setattr(gc, "collect", lambda generation=2: 0)
        yield


def _quantized(mode: str, whole: bool):
    """A step model quantized whole (`model.quantize`) or in one Dense."""
    model = step_model()
    with _quantizing():
        if whole:
            model.quantize(mode)
        else:
            next(layer for layer in model.layers if hasattr(layer, "up")).up.quantize(mode)
    return model


# int8 and int4 are exported as stored (tests/test_decoder_keras_quantized.py), gptq and
# awq too (tests/test_decoder_keras_gptq.py); float8 is refused.
@pytest.mark.parametrize("mode, whole", [("float8", False)], ids=str)
def test_a_quantized_step_model_is_refused_by_name(tmp_path, monkeypatch, mode, whole):
    model = _quantized(mode, whole)
    _no_work(monkeypatch)
    for verify in (True, False):  # a wrong file was kept with verify=False
        with pytest.raises(ExportError, match=rf"'(up|gate|down)' is quantized.*{mode}") as error:
            save_decoder(model, tmp_path / "out", max_length=MAX_LENGTH, verify=verify)
        assert "float model" in str(error.value)  # the way out: export the float model
        assert not (tmp_path / "out").exists()


def test_a_quantized_keras_hub_model_is_refused_by_name(tmp_path, monkeypatch):
    # int8 and int4 are exported as stored (tests/test_decoder_keras_quantized.py).
    causal_lm = tiny_causal_lm("llama")
    with _quantizing():
        causal_lm.quantize("float8")
    with pytest.raises(ExportError, match=r"quantized.*float8"):
        describe_causal_lm(causal_lm, HUB_LENGTH)
    _no_work(monkeypatch)
    with pytest.raises(ExportError, match=r"quantized.*float8"):
        save_decoder(causal_lm, tmp_path / "out", max_length=HUB_LENGTH, verify=False)
    assert not (tmp_path / "out").exists()


def _low_precision_step_model(dtype: str):
    blocks = [DecoderBlock(16, 4, 2, 32, dtype=dtype, name=f"b{i}") for i in range(2)]
    return decoder_models(
        keras.layers.Embedding(VOCABULARY, WIDTH, dtype=dtype),
        blocks,
        keras.layers.RMSNormalization(dtype=dtype),
        keras.layers.Dense(VOCABULARY, dtype=dtype),
        max_length=MAX_LENGTH,
    )[1]


@pytest.mark.parametrize("dtype", ["float16", "mixed_float16"])
def test_a_float16_model_is_exported_as_its_float32_copy(tmp_path, dtype):
    """Verified against Keras in float16 the float32 file is off by 4e-3 (the issue)."""
    model = _low_precision_step_model(dtype)
    with pytest.warns(UserWarning, match=r"float16.*float32 copy"):
        report = save_decoder(model, tmp_path / "out", max_length=24)
    assert report["passed"]


@pytest.mark.parametrize("dtype", ["float16", "mixed_float16"])
def test_a_float16_model_is_refused_when_asked(tmp_path, monkeypatch, dtype):
    _no_work(monkeypatch)
    with pytest.raises(ExportError, match=r"float16.*bfloat16='float32'"):
        save_decoder(
            _low_precision_step_model(dtype),
            tmp_path / "out",
            max_length=MAX_LENGTH,
            bfloat16="error",
        )
    assert not (tmp_path / "out").exists()


def _block_with_attention(**options) -> DecoderBlock:
    """A DecoderBlock whose attention was given options the block does not know."""
    block = DecoderBlock(16, 4, 2, 96, name="b0")
    options = {"positions_from_mask": True, "use_bias": False, **options}
    block.attention = RotaryGroupQueryAttention(16, 4, 2, name="attention", **options)
    return block


@pytest.mark.parametrize(
    "options, named",
    [
        ({"attention_chunk_size": 80}, r"attention_chunk_size.*80"),
        (
            {"query_temperature": {"floor_scale": 8, "attn_scale": 0.1}},
            r"query_temperature.*floor_scale",
        ),
        # Positions counting the padding: the files count a row's real tokens.
        ({"positions_from_mask": False}, r"positions_from_mask=False"),
    ],
    ids=["chunk", "temperature", "positions"],
)
def test_attention_settings_not_carried_are_refused(tmp_path, monkeypatch, options, named):
    block = _block_with_attention(**options)
    embedding = keras.layers.Embedding(VOCABULARY, WIDTH)
    model = decoder_models(
        embedding,
        [block],
        keras.layers.RMSNormalization(),
        keras.layers.Dense(VOCABULARY, use_bias=False),
        max_length=MAX_LENGTH,
    )[1]
    _no_work(monkeypatch)
    with pytest.raises(ExportError, match=rf"'attention'.*{named}"):
        save_decoder(model, tmp_path / "out", max_length=MAX_LENGTH, verify=False)
    assert not (tmp_path / "out").exists()


def test_a_subclass_setting_not_carried_is_refused(tmp_path):
    """Found by reading the config, not by a list of names: a key the export never saw."""

    class Shifted(DecoderBlock):
        def __init__(self, *args, shift: float = 0.0, **kwargs):
            super().__init__(*args, **kwargs)
            self.shift = shift

        def get_config(self):
            return {**super().get_config(), "shift": self.shift}

    blocks = [Shifted(16, 4, 2, 96, shift=0.5, name="b0")]
    model = decoder_models(
        keras.layers.Embedding(VOCABULARY, WIDTH),
        blocks,
        keras.layers.RMSNormalization(),
        keras.layers.Dense(VOCABULARY, use_bias=False),
        max_length=MAX_LENGTH,
    )[1]
    with pytest.raises(ExportError, match=r"'b0'.*shift.*0\.5"):
        save_decoder(model, tmp_path / "out", max_length=MAX_LENGTH, verify=False)
    # The same class at its defaults is exported.
    blocks = [Shifted(16, 4, 2, 96, name="b0")]
    model = decoder_models(
        keras.layers.Embedding(VOCABULARY, WIDTH),
        blocks,
        keras.layers.RMSNormalization(),
        keras.layers.Dense(VOCABULARY, use_bias=False),
        max_length=MAX_LENGTH,
    )[1]
    save_decoder(model, tmp_path / "plain", max_length=MAX_LENGTH, verify=False)


def test_a_keras_hub_backbone_setting_not_read_is_refused(tmp_path):
    """A key the bridge was not written for (a subclass's, or a later keras_hub's)."""
    import keras_hub

    class Shifted(keras_hub.models.LlamaBackbone):
        def __init__(self, *args, shift: float = 0.0, **kwargs):
            super().__init__(*args, **kwargs)
            self.shift = shift

        def get_config(self):
            return {**super().get_config(), "shift": self.shift}

    options = dict(
        vocabulary_size=HUB_VOCABULARY,
        num_layers=1,
        num_query_heads=2,
        hidden_dim=32,
        intermediate_dim=48,
        num_key_value_heads=1,
    )
    causal_lm = keras_hub.models.LlamaCausalLM(Shifted(**options, shift=0.5), preprocessor=None)
    with pytest.raises(ExportError, match=r"LlamaCausalLM.*shift=0\.5"):
        save_decoder(causal_lm, tmp_path / "out", max_length=HUB_LENGTH)
    causal_lm = keras_hub.models.LlamaCausalLM(Shifted(**options), preprocessor=None)
    describe_causal_lm(causal_lm, HUB_LENGTH)  # at its default: read


def _qwen2_windowed():
    return tiny_causal_lm("qwen2", use_sliding_window_attention=True, sliding_window_size=16)


# onnxruntime's GroupQueryAttention windows as the export means them from 1.32 on.
OLDER_ONNXRUNTIME = runtime_version._installed() < (1, 32)


def test_keras_hub_qwen2_with_its_sliding_window_is_exported_and_verified(tmp_path):
    if OLDER_ONNXRUNTIME:
        with pytest.raises(ExportError, match="computes otherwise than the export means"):
            save_decoder(_qwen2_windowed(), tmp_path / "out", max_length=HUB_LENGTH)
        return
    report = save_decoder(_qwen2_windowed(), tmp_path / "out", max_length=HUB_LENGTH)
    assert report["passed"]
    # A case goes past the window (window 16 < 128 slots), then the teacher-forced one.
    assert [case["name"].split(" ")[0] for case in report["cases"]] == [
        "batch",
        "batch",
        "batch",
        "teacher-forced,",
    ]
    assert "past the window" in report["cases"][2]["name"]


def test_keras_hub_qwen2_window_matters():
    """Dropped from the export, the window changes the tokens: the reference applies it."""
    causal_lm = _qwen2_windowed()
    decoder = describe_causal_lm(causal_lm, HUB_LENGTH)
    assert {block.attention.window for block in decoder.blocks} == {16}
    if OLDER_ONNXRUNTIME:
        pytest.skip("windows are refused below onnxruntime 1.32")
    case = {**decoder_cases(HUB_VOCABULARY, HUB_LENGTH)[1], "steps": 24}
    expected = keras_hub_greedy(causal_lm)(case["prompts"], case["mask"], case["steps"])

    def run(decoder):
        session = onnxruntime.InferenceSession(
            decoder_onnx(decoder).SerializeToString(), providers=["CPUExecutionProvider"]
        )
        return onnx_greedy(session, case["prompts"], case["mask"], case["steps"], HUB_LENGTH)

    assert compare_greedy(expected, run(decoder), case["mask"])["passed"]
    blocks = tuple(
        dataclasses.replace(block, attention=dataclasses.replace(block.attention, window=None))
        for block in decoder.blocks
    )
    unwindowed = dataclasses.replace(decoder, blocks=blocks)
    assert not compare_greedy(expected, run(unwindowed), case["mask"])["same_tokens"]
