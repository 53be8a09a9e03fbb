"""`save_decoder(verbose=1)` (the default) says on stderr what it is doing, as Keras's `fit`
does: describing, writing, each verification case; and that it replaces its own earlier
folder. `verbose=0` says nothing."""

from __future__ import annotations

import re

import pytest
from test_decoder_save import MAX_LENGTH, step_model

from keras_posenc.export import save_decoder


@pytest.fixture(scope="module")
def model():
    return step_model(layers=1)


def test_the_phases_are_said_in_order_on_stderr(model, tmp_path, capsys):
    save_decoder(model, tmp_path / "out", max_length=MAX_LENGTH)
    out, err = capsys.readouterr()
    assert out == ""
    phases = [r"describ", r"writ", r"case 1 of 3", r"case 2 of 3", r"case 3 of 3", r"verified"]
    found = [re.search(phase, err) for phase in phases]
    assert all(found), err
    assert [m.start() for m in found] == sorted(m.start() for m in found), err
    assert str(tmp_path / "out") in err
    assert "replac" not in err


def test_replacing_its_own_earlier_folder_is_said(model, tmp_path, capsys):
    save_decoder(model, tmp_path / "out", max_length=MAX_LENGTH, verify=False)
    capsys.readouterr()
    save_decoder(model, tmp_path / "out", max_length=MAX_LENGTH, verify=False)
    err = capsys.readouterr().err
    assert re.search(r"replac\w* .*earlier|replac\w* .*wrote before", err), err


def test_verbose_0_says_nothing(model, tmp_path, capsys):
    save_decoder(model, tmp_path / "out", max_length=MAX_LENGTH, verbose=0)
    save_decoder(model, tmp_path / "out", max_length=MAX_LENGTH, verbose=0, verify=False)
    assert capsys.readouterr() == ("", "")


@pytest.mark.parametrize("verbose", [2, -1, "yes", None])
def test_other_verbose_values_are_refused_by_name(model, tmp_path, verbose):
    with pytest.raises(ValueError, match="verbose"):
        save_decoder(model, tmp_path / "out", max_length=MAX_LENGTH, verbose=verbose)
    assert not (tmp_path / "out").exists()
