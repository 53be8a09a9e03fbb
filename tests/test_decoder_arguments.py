"""`save_decoder`'s arguments checked at the entry, and files it did not write left alone.

`max_length` must be an integer (numpy's too), above 1 (the verification's prompt and a
step when it runs) and at most the positions the tables serve (2^24), before any work:
`2**31` built tables until memory ran out, `2**24 + 1` failed after 53 s inside
keras_hub, `np.int64(64)` failed inside json after the whole verification. A keras_hub
backbone is told to pass its CausalLM. The report of a failed verification is written
beside the folder only where no file of the user's is, and only the package's own report
is removed by a later success. The CLI's `--import MODULE` imports the user's layers
before loading a `.keras` file.
"""

from __future__ import annotations

import json
import sys
import textwrap

import keras
import numpy as np
import pytest
from keras_hub_models import MAX_LENGTH as HUB_LENGTH
from keras_hub_models import tiny_causal_lm
from test_decoder_save import step_model

from keras_posenc.export import VerificationError, save_decoder
from keras_posenc.export.decoder import save
from keras_posenc.export.errors import ExportError

MAX_POSITIONS = 2**24
SHORT = 16  # short exports: the verification's prompt of 8 and 8 steps


def _no_work(monkeypatch):
    def reached(*args, **kwargs):
        raise AssertionError("the export started before refusing")

    for name in ("describe_decoder", "decoder_onnx", "verify_decoder"):
        monkeypatch.setattr(save, name, reached)
    from keras_posenc import keras_hub

    monkeypatch.setattr(keras_hub, "describe_causal_lm", reached)


BAD_LENGTHS = [
    (0, ValueError),
    (-5, ValueError),
    (1, ValueError),
    ("128", TypeError),
    (2.5, TypeError),
    (64.0, TypeError),
    (True, TypeError),
    (None, TypeError),
    (2**31, ValueError),
    (MAX_POSITIONS + 1, ValueError),
]


@pytest.mark.parametrize("value, error", BAD_LENGTHS, ids=[repr(v) for v, _ in BAD_LENGTHS])
def test_max_length_is_checked_before_any_work(tmp_path, monkeypatch, value, error):
    model = step_model()
    _no_work(monkeypatch)
    with pytest.raises(error, match=rf"max_length.*{MAX_POSITIONS}"):
        save_decoder(model, tmp_path / "out", max_length=value, verify=False)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("value", [2, 8])
def test_max_length_below_the_verification_prompt_is_refused_with_the_way_out(
    tmp_path, monkeypatch, value
):
    _no_work(monkeypatch)
    with pytest.raises(ValueError, match=r"max_length.*verify=False"):
        save_decoder(step_model(), tmp_path / "out", max_length=value)


def test_max_length_past_the_tables_is_refused_for_keras_hub_too(tmp_path, monkeypatch):
    causal_lm = tiny_causal_lm("llama")
    _no_work(monkeypatch)
    with pytest.raises(ValueError, match=rf"max_length.*{MAX_POSITIONS}"):
        save_decoder(causal_lm, tmp_path / "out", max_length=MAX_POSITIONS + 1)
    from keras_posenc.keras_hub import backbone_reader

    with pytest.raises(TypeError, match="max_length"):
        backbone_reader.describe_causal_lm(causal_lm, "128")


def test_a_numpy_integer_max_length_works(tmp_path):
    report = save_decoder(step_model(), tmp_path / "out", max_length=np.int64(SHORT))
    assert report["passed"]
    config = json.loads((tmp_path / "out" / "genai_config.json").read_text())
    assert config["model"]["context_length"] == SHORT


def test_a_keras_hub_backbone_is_told_to_pass_its_causal_lm(tmp_path, monkeypatch):
    backbone = tiny_causal_lm("llama").backbone
    _no_work(monkeypatch)
    with pytest.raises(ExportError, match=r"pass the CausalLM.*keras_hub\.models\.LlamaCausalLM"):
        save_decoder(backbone, tmp_path / "out", max_length=HUB_LENGTH)


def _perturbed_onnx(monkeypatch):
    """A file whose cos table is wrong at row 12: its verification fails."""
    real = save.decoder_onnx

    def perturbed(decoder, attention):
        from onnx import numpy_helper

        onnx_model = real(decoder, attention)
        for tensor in onnx_model.graph.initializer:
            if tensor.name == "cos_cache":
                table = numpy_helper.to_array(tensor).copy()
                table[12] *= 1.01
                tensor.CopyFrom(numpy_helper.from_array(table, "cos_cache"))
        return onnx_model

    monkeypatch.setattr(save, "decoder_onnx", perturbed)


def test_a_users_file_at_the_report_name_survives_failure_and_success(tmp_path, monkeypatch):
    model = step_model()
    users = save.failed_report_path(tmp_path / "out")
    users.write_text("my notes\n")
    with monkeypatch.context() as patch:
        _perturbed_onnx(patch)
        with pytest.raises(VerificationError, match="not written by save_decoder") as error:
            save_decoder(model, tmp_path / "out", max_length=SHORT)
    assert users.read_text() == "my notes\n"
    assert not error.value.report["passed"]  # the report is on the error
    save_decoder(model, tmp_path / "out", max_length=SHORT)
    assert users.read_text() == "my notes\n"


def test_the_packages_own_report_is_replaced_and_removed(tmp_path, monkeypatch):
    model = step_model()
    report_path = save.failed_report_path(tmp_path / "out")
    # An earlier failure's report (as the package marks them), replaced by this one's.
    report_path.write_text(json.dumps({"written_by": save_marker(), "cases": "earlier"}))
    with monkeypatch.context() as patch:
        _perturbed_onnx(patch)
        with pytest.raises(VerificationError, match=str(report_path)) as error:
            save_decoder(model, tmp_path / "out", max_length=SHORT)
    assert json.loads(report_path.read_text()) == json.loads(json.dumps(error.value.report))
    save_decoder(model, tmp_path / "out", max_length=SHORT)
    assert not report_path.exists()


def save_marker() -> str:
    from keras_posenc.export.decoder import failed_report

    return failed_report.WRITTEN_BY


# The CLI: a `.keras` file holding the user's own layer.
_MODULE = """
import keras


@keras.saving.register_keras_serializable(package="{name}")
class Doubled(keras.layers.Layer):
    def call(self, x):
        return 2.0 * x
"""


def test_cli_imports_the_users_module_before_loading(tmp_path, monkeypatch):
    from keras_posenc_cli import job
    from keras_posenc_cli.arguments import parse_arguments

    name = "user_layers_for_the_cli_test"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(_MODULE.format(name=name)))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = __import__(name)
    inputs = keras.Input((None, 8))
    path = tmp_path / "mine.keras"
    keras.Model(inputs, module.Doubled()(inputs)).save(path)
    # As in a fresh process: the class is registered by nobody.
    keras.saving.get_custom_objects().pop(f"{name}>Doubled")
    monkeypatch.delitem(sys.modules, name)

    arguments = parse_arguments(["--model", str(path)])
    with pytest.raises(Exception, match=r"--import MODULE") as error:
        job.jobs(arguments)[0].load()
    assert "Doubled" in str(error.value)

    arguments = parse_arguments(["--model", str(path), "--import", name])
    model = job.jobs(arguments)[0].load()
    assert type(model.layers[-1]).__name__ == "Doubled"
    keras.saving.get_custom_objects().pop(f"{name}>Doubled", None)


def test_cli_refuses_a_module_that_does_not_import(capsys):
    from keras_posenc_cli.arguments import parse_arguments

    with pytest.raises(SystemExit):
        parse_arguments(["--import", "no_such_module_anywhere_4711"])
    assert "--import no_such_module_anywhere_4711" in capsys.readouterr().err
