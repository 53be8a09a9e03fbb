"""`save_saved_model` (`keras_posenc.export.saved_model`): what the folder holds and serves.

The SavedModel is loaded with TensorFlow alone and checked against numpy formulas
(`reference.sinusoidal`, the learned table's own rows), not against Keras's outputs.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import reference
import tensorflow as tf
from float32_error import TABLE_ERROR, assert_within_bound, gamma

from keras_posenc import LearnedPositionalEmbedding, SinusoidalPositionalEncoding
from keras_posenc.export import save_saved_model

WIDTH, ROWS = 8, 12


def _model() -> keras.Model:
    x = keras.Input((None, WIDTH), name="embeddings")
    learned = LearnedPositionalEmbedding(ROWS, name="learned")(x)
    return keras.Model(x, {"encoded": SinusoidalPositionalEncoding(name="posenc")(learned)})


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    keras.utils.set_random_seed(3)
    model = _model()
    path = save_saved_model(model, tmp_path_factory.mktemp("saved") / "saved_model")
    table = model.get_layer("learned").weights[0].numpy()
    return model, path, table


def test_the_signature_takes_the_inputs_by_name_with_dynamic_axes(saved):
    _, path, _ = saved
    serve = tf.saved_model.load(str(path)).signatures["serving_default"]
    (spec,) = serve.structured_input_signature[1].values()
    assert spec.name == "embeddings" and spec.shape.as_list() == [None, None, WIDTH]
    assert list(serve.structured_outputs) == ["encoded"]


@pytest.mark.parametrize("batch, length", [(1, 1), (3, 5), (2, ROWS)])
def test_the_loaded_signature_computes_the_formula(saved, batch, length):
    _, path, table = saved
    serve = tf.saved_model.load(str(path)).signatures["serving_default"]
    x = np.random.default_rng([batch, length]).standard_normal((batch, length, WIDTH))
    got = serve(embeddings=tf.constant(x, tf.float32))["encoded"].numpy()
    expected = x + table[:length] + reference.sinusoidal(np.arange(length), WIDTH)
    # x rounded to float32, the sinusoidal entries within TABLE_ERROR, two sums in any order.
    rounded = np.abs(x - x.astype(np.float32))
    carried = rounded + TABLE_ERROR
    bound = carried + gamma(2) * (np.abs(x) + np.abs(table[:length]) + 1 + carried)
    assert_within_bound(got, expected, bound)


def test_each_weight_is_saved_once(saved):
    model, path, _ = saved
    stored = [
        name
        for name, _ in tf.train.list_variables(str(path / "variables" / "variables"))
        if "OPTIMIZER" not in name and not name.startswith("_CHECKPOINTABLE")
    ]
    assert len(model.weights) == 1
    assert len(stored) == len(model.weights), stored


def test_past_the_learned_table_the_saved_model_raises(saved):
    _, path, _ = saved
    serve = tf.saved_model.load(str(path)).signatures["serving_default"]
    with pytest.raises(tf.errors.InvalidArgumentError):
        serve(embeddings=tf.zeros((1, ROWS + 1, WIDTH)))


def test_a_bound_below_the_table_is_served_and_checked(tmp_path):
    path = save_saved_model(_model(), tmp_path / "bounded", max_sequence_length=4)
    serve = tf.saved_model.load(str(path)).signatures["serving_default"]
    assert serve(embeddings=tf.zeros((1, 4, WIDTH)))["encoded"].shape == (1, 4, WIDTH)
    with pytest.raises(tf.errors.InvalidArgumentError):
        serve(embeddings=tf.zeros((1, 5, WIDTH)))


def test_a_saved_model_is_replaced_and_another_folder_is_left_alone(tmp_path):
    model = _model()
    path = save_saved_model(model, tmp_path / "out")
    before = (path / "saved_model.pb").stat().st_mtime_ns
    save_saved_model(model, path)
    assert (path / "saved_model.pb").stat().st_mtime_ns != before
    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="left as it is"):
        save_saved_model(model, other)
    assert (other / "keep.txt").read_text() == "mine"
