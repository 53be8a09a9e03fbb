"""Decoders at their real size: weights in `model.onnx.data`, a tied head stored once, a
disk without room, LiteRT past 2 GB, progress lines (`weights_file.py`, `progress.py`).

The models are tiny; the code path of a large one is taken by forcing external data
(`external_data=True`) or lowering the limits.
"""

from __future__ import annotations

import errno
import importlib.util
import shutil
import weakref

import keras
import numpy as np
import onnx
import onnxruntime
import pytest
from decoder_reference import reference_greedy
from keras_hub_models import MAX_LENGTH as HUB_LENGTH
from keras_hub_models import tiny_causal_lm
from onnx import numpy_helper
from test_decoder_save import MAX_LENGTH, VOCABULARY, step_model

from keras_posenc.export import save_decoder
from keras_posenc.export.decoder import (
    check,
    decoder_cases,
    describe_decoder,
    onnx_greedy,
    save,
    weights_file,
)
from keras_posenc.export.decoder.genai_runtime import genai_model
from keras_posenc.export.errors import ExportError

GENAI = importlib.util.find_spec("onnxruntime_genai") is not None


def _session(folder):
    return onnxruntime.InferenceSession(
        str(folder / "model.onnx"), providers=["CPUExecutionProvider"]
    )


def _external(folder) -> list[onnx.TensorProto]:
    model = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    return [t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]


def _greedy_matches_keras(model, folder) -> None:
    case = decoder_cases(VOCABULARY, MAX_LENGTH)[1]  # batch 4, left-padded
    prompts, mask, steps = case["prompts"], case["mask"], 6
    tokens, logits = onnx_greedy(_session(folder), prompts, mask, steps, MAX_LENGTH)
    expected = reference_greedy(model, prompts, mask, steps)
    result = check.compare_greedy(expected, (tokens, logits), mask)
    assert result["passed"], result


def _genai_tokens(folder, prompt: np.ndarray, count: int) -> list[int]:
    import onnxruntime_genai as og

    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + count, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(prompt.astype(np.int32)[None])
    tokens = []
    while not generator.is_done() and len(tokens) < count:
        generator.generate_next_token()
        tokens.append(int(generator.get_next_tokens()[0]))
    return tokens


def test_forced_external_data_writes_a_verified_pair_of_files(tmp_path):
    model = step_model()
    folder = tmp_path / "out"
    report = save_decoder(model, folder, max_length=MAX_LENGTH, external_data=True, verbose=0)
    assert report["passed"]
    files = {path.name for path in folder.iterdir()}
    assert {"model.onnx", "model.onnx.data", "genai_config.json"} <= files
    external = _external(folder)
    assert {t.name for t in external} >= {"embed_tokens", "lm_head"}
    total = sum(int(np.prod(t.dims)) * 4 for t in external)
    data = (folder / "model.onnx.data").stat().st_size
    assert total <= data < total + len(external) * weights_file.ALIGNMENT
    # The graph alone: every weight is in the data file.
    assert (folder / "model.onnx").stat().st_size < total / 10
    for tensor in external:
        info = {entry.key: entry.value for entry in tensor.external_data}
        assert info["location"] == "model.onnx.data"  # relative: the folder can move
        assert int(info["offset"]) % weights_file.ALIGNMENT == 0
    _greedy_matches_keras(model, folder)
    if GENAI:
        prompt = decoder_cases(VOCABULARY, MAX_LENGTH)[0]["prompts"][0]
        expected = reference_greedy(model, prompt[None], np.ones((1, len(prompt)), np.int64), 4)
        assert _genai_tokens(folder, prompt, 4) == list(expected[0][0, :4])


def test_weights_streamed_into_one_file_parse_as_one_model(tmp_path, monkeypatch):
    """Below the limit, the large tensors are written into model.onnx as they are made
    (each as a ModelProto fragment that protobuf merges): one file, every weight inline."""
    monkeypatch.setattr(weights_file, "INLINE_BYTES", 4096)
    model = step_model()
    folder = tmp_path / "out"
    report = save_decoder(model, folder, max_length=MAX_LENGTH, verbose=0)
    assert report["passed"]
    assert sorted(p.name for p in folder.iterdir() if p.suffix != ".json") == [
        ".keras-posenc-files",
        "model.onnx",
    ]
    # The file opens with a graph fragment (ModelProto field 7), not the model's header.
    assert (folder / "model.onnx").read_bytes()[:1] == bytes([7 << 3 | 2])
    loaded = onnx.load(str(folder / "model.onnx"))
    assert not _external(folder)
    sizes = {t.name: numpy_helper.to_array(t).nbytes for t in loaded.graph.initializer}
    assert sizes["embed_tokens"] == VOCABULARY * 64 * 4 and len(set(sizes)) == len(sizes)
    _greedy_matches_keras(model, folder)


def test_the_folder_can_be_moved(tmp_path):
    model = step_model()
    save_decoder(model, tmp_path / "out", max_length=MAX_LENGTH, external_data=True, verify=False)
    moved = tmp_path / "elsewhere" / "decoder"
    moved.parent.mkdir()
    shutil.move(tmp_path / "out", moved)
    _greedy_matches_keras(model, moved)


def test_external_data_follows_the_limit_unless_forced(tmp_path, monkeypatch):
    model = step_model()
    save_decoder(model, tmp_path / "small", max_length=MAX_LENGTH, verify=False, verbose=0)
    assert not (tmp_path / "small" / "model.onnx.data").exists()
    assert not _external(tmp_path / "small")
    monkeypatch.setattr(weights_file, "EXTERNAL_DATA_LIMIT", 1000)
    save_decoder(model, tmp_path / "large", max_length=MAX_LENGTH, verify=False, verbose=0)
    assert (tmp_path / "large" / "model.onnx.data").exists()
    save_decoder(model, tmp_path / "one", max_length=MAX_LENGTH, verify=False, external_data=False)
    assert not (tmp_path / "one" / "model.onnx.data").exists()
    with pytest.raises(ValueError, match="external_data must be"):
        save_decoder(model, tmp_path / "bad", max_length=MAX_LENGTH, external_data="yes")
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("external", [False, True], ids=["inline", "external"])
def test_a_tied_head_is_stored_once(tmp_path, monkeypatch, external):
    monkeypatch.setattr(weights_file, "CHUNK_BYTES", 1000)  # the transpose in many blocks
    causal_lm = tiny_causal_lm("llama3", tie_word_embeddings=True)
    table = np.asarray(causal_lm.backbone.token_embedding.embeddings)
    folder = tmp_path / "out"
    report = save_decoder(
        causal_lm, folder, max_length=HUB_LENGTH, external_data=external, verbose=0
    )
    assert report["passed"]
    model = onnx.load(str(folder / "model.onnx"))  # with its external data
    copies = [
        t.name
        for t in model.graph.initializer
        if sorted(t.dims) == sorted(table.shape)
        and any(
            np.array_equal(numpy_helper.to_array(t), candidate) for candidate in (table, table.T)
        )
    ]
    assert copies == ["lm_head"]
    stored = sum(numpy_helper.to_array(t).nbytes for t in model.graph.initializer)
    assert stored < 2 * table.nbytes + _layer_bytes(causal_lm)


def _layer_bytes(causal_lm) -> int:
    embedding = causal_lm.backbone.token_embedding.embeddings
    weights = causal_lm.backbone.weights
    return sum(int(np.prod(w.shape)) * 4 for w in weights if w is not embedding) + 2**16


def test_litert_past_its_limit_is_refused_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setattr(weights_file, "LITERT_LIMIT", 1000)

    def converter(decoder):
        raise AssertionError("the converter ran")

    monkeypatch.setattr(save, "decoder_litert", converter)
    with pytest.raises(ExportError, match=r"LiteRT file .* holds at most 1,000"):
        save_decoder(step_model(), tmp_path / "out", max_length=MAX_LENGTH, formats=("litert",))
    assert list(tmp_path.iterdir()) == []


def _earlier_export(tmp_path):
    model = step_model()
    folder = tmp_path / "out"
    save_decoder(model, folder, max_length=MAX_LENGTH, verify=False, verbose=0)
    return model, folder, {p.name: p.read_bytes() for p in folder.iterdir()}


def test_a_disk_without_room_is_refused_before_writing(tmp_path, monkeypatch):
    model, folder, before = _earlier_export(tmp_path)

    def full(path):
        return shutil._ntuple_diskusage(10**9, 10**9 - 100, 100)

    monkeypatch.setattr(weights_file.shutil, "disk_usage", full)
    with pytest.raises(ExportError, match=r"need about [\d,]+ bytes .* has 100 free"):
        save_decoder(model, folder, max_length=MAX_LENGTH, external_data=True)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_disk_that_fills_while_writing_keeps_the_earlier_export(tmp_path, monkeypatch):
    model, folder, before = _earlier_export(tmp_path)

    class Full:
        """A file on a disk with room for 10 KB."""

        def __init__(self, real):
            self.real, self.written = real, 0

        def write(self, data):
            self.written += len(data)
            if self.written > 10_000:
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.real.write(data)

        def close(self):
            self.real.close()

    real_init = weights_file.WeightsFile.__init__

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        self._file = Full(self._file)

    monkeypatch.setattr(weights_file.WeightsFile, "__init__", init)
    with pytest.raises(OSError, match=r"ran out of room .*about [\d,]+ bytes needed") as error:
        save_decoder(model, folder, max_length=MAX_LENGTH, external_data=True)
    assert error.value.errno == errno.ENOSPC
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_verification_holds_no_description_and_one_runtime_at_a_time(tmp_path, monkeypatch):
    """The description (a float32 copy of every weight) is released once the files are
    written, and each runtime's session before the next one opens: while a runtime runs,
    the process holds the Keras model and that one runtime's weights, not four copies."""
    descriptions, sessions = [], []

    def describe(*args):
        decoder = describe_decoder(*args)
        descriptions.append(weakref.ref(decoder))
        return decoder

    def alive(refs) -> int:
        return sum(ref() is not None for ref in refs)

    def greedy(session, *args):
        assert not alive(descriptions), "the description is held while onnxruntime runs"
        sessions.append(weakref.ref(session))
        return onnx_greedy(session, *args)

    def genai(folder):
        assert not alive(descriptions), "the description is held while og opens"
        assert not alive(sessions), "onnxruntime's session is held while og opens"
        return genai_model(folder)

    monkeypatch.setattr(save, "describe_decoder", describe)
    monkeypatch.setattr(save, "onnx_greedy", greedy)
    monkeypatch.setattr(save, "genai_model", genai)
    report = save_decoder(step_model(), tmp_path / "out", max_length=MAX_LENGTH, verbose=0)
    assert report["passed"] and descriptions and sessions
    if GENAI:
        assert all("onnxruntime-genai" in case["runtimes"] for case in report["cases"])


@pytest.mark.skipif(
    keras.backend.backend() not in ("tensorflow", "jax"), reason="PyTorch assigns in place"
)
def test_the_description_holds_the_models_weights_not_a_copy():
    """A model that does not fit twice in memory: the description's arrays are the Keras
    variables' own buffers (read-only; TensorFlow's read of a variable aliases it, a JAX
    array is viewed), so describing adds no copy of the weights. A variable assigned later
    is copied by TensorFlow then (copy on write; JAX makes a new array): a description
    keeps the values it was made from."""
    from keras_posenc.keras_hub import describe_causal_lm

    model = step_model()
    first, second = (describe_decoder(model, MAX_LENGTH) for _ in range(2))
    causal_lm = tiny_causal_lm("llama")
    hub = [describe_causal_lm(causal_lm, HUB_LENGTH) for _ in range(2)]
    for a, b in ((first, second), tuple(hub)):
        assert np.shares_memory(a.embedding, b.embedding)
        assert np.shares_memory(a.head, b.head)
        assert np.shares_memory(a.blocks[-1].attention.query, b.blocks[-1].attention.query)
        assert np.shares_memory(a.blocks[-1].mlp.down, b.blocks[-1].mlp.down)
        assert not a.embedding.flags.writeable
    (table,) = (layer for layer in model.layers if isinstance(layer, keras.layers.Embedding))
    kept = first.embedding.copy()
    table.embeddings.assign(np.zeros(table.embeddings.shape, "float32"))
    np.testing.assert_array_equal(first.embedding, kept)
    assert not describe_decoder(model, MAX_LENGTH).embedding.any()


def test_progress_on_stderr_and_quiet_with_verbose_0(tmp_path, capsys):
    model = step_model()
    save_decoder(model, tmp_path / "a", max_length=MAX_LENGTH, verify=False, verbose=0)
    assert capsys.readouterr().err == ""
    save_decoder(model, tmp_path / "b", max_length=MAX_LENGTH, verify=True)
    lines = capsys.readouterr().err.splitlines()
    said = [line.split("]: ", 1)[1] for line in lines if line.startswith("save_decoder ")]
    assert said[0].startswith("describing the model")
    assert any(line.startswith("verifying case") for line in said)
    assert "write model.onnx: layer 2 of 2" in said
