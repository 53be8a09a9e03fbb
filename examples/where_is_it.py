"""Where is it: a tiny ViT that must tell whether the red patch is left of the blue one.

Each image is a grid of `grid x grid` patches of grey noise; one patch is red, one is blue,
in different columns, their rows anywhere. The label says whether the red patch is left of
the blue one. Swapping the red and the blue patch gives an image with exactly the same
patches, only at other places, and the other label.

A Transformer without positions is permutation invariant over its patches (attention
permutes its outputs with its inputs, the mean over patches forgets the order), so it gives
an image and its swapped twin the same answer. The test set is made of such twins, so
without positions the accuracy is exactly 50% however well the model trains.

With 1D positions along the flattened (row-major) patch sequence, the column of patch `i`
is `i mod grid`: a sawtooth of the position, which a 1D encoding does not hold in any of its
channels. 2D sinusoidal positions (`SinusoidalPositionalEncoding(axes=2)`, half the width
for the row, half for the column) and 2D axial RoPE (`RotaryEmbedding(axes_dims=...)` on
queries and keys) give the column its own channels.

Run it:

    python examples/where_is_it.py           # the full run (see docs/where_is_it.md)
    python examples/where_is_it.py --tiny    # a few seconds (also KERAS_POSENC_EXAMPLE_TINY=1)
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_posenc import (  # noqa: E402
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    grid_positions,
)

VARIANTS = ("none", "sinusoidal_1d", "sinusoidal_2d", "rope_2d")
RED, BLUE = (0.9, 0.1, 0.1), (0.1, 0.1, 0.9)
TINY_ENVIRONMENT_VARIABLE = "KERAS_POSENC_EXAMPLE_TINY"


@dataclasses.dataclass(frozen=True)
class Size:
    """How big the images and the model are, and how long to train."""

    grid: int  # patches per side
    patch: int  # pixels per patch side
    train_examples: int
    test_pairs: int
    width: int
    num_heads: int
    epochs: int
    batch_size: int = 64
    learning_rate: float = 1e-3


FULL = Size(grid=8, patch=2, train_examples=4096, test_pairs=1024, width=32, num_heads=2, epochs=10)
# Few steps: a larger step size.
TINY = Size(
    grid=4,
    patch=2,
    train_examples=1024,
    test_pairs=256,
    width=32,
    num_heads=2,
    epochs=8,
    learning_rate=3e-3,
)


# --------------------------------------------------------------------------------------
# Data


def make_images(
    count: int, size: Size, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`count` images `(count, grid·patch, grid·patch, 3)`, their labels and patch coordinates.

    Returns:
        `(images, labels, where)`: `labels[n]` is 1 when the red patch is left of the blue
        one; `where[n]` is `[[red row, red column], [blue row, blue column]]`.
    """
    grid, patch = size.grid, size.patch
    pixels = grid * patch
    images = rng.uniform(0.3, 0.7, size=(count, pixels, pixels, 3)).astype(np.float32)
    rows = rng.integers(0, grid, size=(count, 2))
    columns = np.stack([rng.choice(grid, size=2, replace=False) for _ in range(count)])
    where = np.stack([rows, columns], -1)  # (count, 2 patches, (row, column))
    for image, ((red_row, red_column), (blue_row, blue_column)) in zip(images, where, strict=True):
        for (row, column), color in (((red_row, red_column), RED), ((blue_row, blue_column), BLUE)):
            block = image[row * patch : (row + 1) * patch, column * patch : (column + 1) * patch]
            block[:] = np.clip(color + rng.normal(0, 0.05, block.shape), 0, 1)
    labels = (where[:, 0, 1] < where[:, 1, 1]).astype(np.int32)
    return images, labels, where


def swap_red_and_blue(images: np.ndarray, where: np.ndarray, patch: int) -> np.ndarray:
    """The twins: the red and the blue patch trade places, every other patch stays."""
    twins = images.copy()
    for twin, image, (red, blue) in zip(twins, images, where, strict=True):
        red_block = (
            slice(red[0] * patch, (red[0] + 1) * patch),
            slice(red[1] * patch, (red[1] + 1) * patch),
        )
        blue_block = (
            slice(blue[0] * patch, (blue[0] + 1) * patch),
            slice(blue[1] * patch, (blue[1] + 1) * patch),
        )
        twin[red_block], twin[blue_block] = image[blue_block], image[red_block]
    return twins


def make_twin_test_set(
    pairs: int, size: Size, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """`pairs` images followed by their twins: each set of patches once with each label."""
    images, labels, where = make_images(pairs, size, rng)
    twins = swap_red_and_blue(images, where, size.patch)
    return np.concatenate([images, twins]), np.concatenate([labels, 1 - labels])


def patchify(images, grid: int, patch: int):
    """`(batch, grid·patch, grid·patch, 3)` to `(batch, grid·grid, patch·patch·3)`, row-major.

    Patch `i` of the sequence is the patch in row `i // grid`, column `i % grid`: the order
    of `grid_positions(grid, grid)`.
    """
    x = keras.ops.reshape(images, (-1, grid, patch, grid, patch, 3))
    x = keras.ops.transpose(x, (0, 1, 3, 2, 4, 5))
    return keras.ops.reshape(x, (-1, grid * grid, patch * patch * 3))


# --------------------------------------------------------------------------------------
# Model


class Patches(keras.layers.Layer):
    """Cuts images into a row-major sequence of flattened patches (see `patchify`)."""

    def __init__(self, grid: int, patch: int, **kwargs):
        super().__init__(**kwargs)
        self.grid = grid
        self.patch = patch

    def call(self, images):
        return patchify(images, self.grid, self.patch)

    def get_config(self):
        return {**super().get_config(), "grid": self.grid, "patch": self.patch}


class GridAttention(keras.layers.Layer):
    """Multi-head self-attention, with 2D axial RoPE on queries and keys when `axes_dims` is set.

    The same projections and softmax for every variant, so that the positions are the only
    difference. `RotaryMultiHeadAttention` takes 1D positions; this block rotates by the
    `(row, column)` of each patch with `RotaryEmbedding(axes_dims=axes_dims)`.

    Args:
        num_heads: attention heads.
        key_dim: channels per head of queries, keys and values.
        axes_dims: `None` (no rotation), or the channels of each head given to each axis,
            summing to `key_dim`.

    Call arguments:
        inputs: `(batch, sequence, width)`.
        positions: integer `(sequence, axes)` coordinates, needed when `axes_dims` is set.
    """

    def __init__(self, num_heads: int, key_dim: int, axes_dims=None, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.axes_dims = None if axes_dims is None else tuple(axes_dims)

    def build(self, input_shape):
        width = input_shape[-1]
        heads = (self.num_heads, self.key_dim)
        self.query, self.key, self.value = (
            keras.layers.EinsumDense("bsw,whd->bshd", (None, *heads), bias_axes="hd", name=name)
            for name in ("query", "key", "value")
        )
        self.output_dense = keras.layers.EinsumDense(
            "bshd,hdw->bsw", (None, width), bias_axes="w", name="attention_output"
        )
        for projection in (self.query, self.key, self.value):
            projection.build(input_shape)
        self.output_dense.build((None, None, *heads))
        self.rotary = None
        if self.axes_dims is not None:
            self.rotary = RotaryEmbedding(axes_dims=self.axes_dims, name="rotary")

    def call(self, inputs, positions=None):
        query, key, value = self.query(inputs), self.key(inputs), self.value(inputs)
        if self.rotary is not None:
            query = self.rotary(query, positions=positions)
            key = self.rotary(key, positions=positions)
        scores = keras.ops.einsum("bqhd,bkhd->bhqk", query, key) / np.sqrt(self.key_dim)
        weights = keras.ops.softmax(scores, axis=-1)
        return self.output_dense(keras.ops.einsum("bhqk,bkhd->bqhd", weights, value))

    def get_config(self):
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "key_dim": self.key_dim,
            "axes_dims": self.axes_dims,
        }


def build_classifier(variant: str, size: Size) -> keras.Model:
    """Patches, a linear embedding, the positions of `variant`, one encoder block, mean, output."""
    if variant not in VARIANTS:
        raise ValueError(f"Unknown variant {variant!r}; expected one of {VARIANTS}.")
    pixels = size.grid * size.patch
    positions = grid_positions(size.grid, size.grid)  # (row, column) of each patch
    images = keras.Input((pixels, pixels, 3), name="images")
    x = Patches(size.grid, size.patch, name="patches")(images)
    x = keras.layers.Dense(size.width, name="patch_embedding")(x)
    if variant == "sinusoidal_1d":
        x = SinusoidalPositionalEncoding(name="positions")(x)
    elif variant == "sinusoidal_2d":
        x = SinusoidalPositionalEncoding(axes=2, name="positions")(x, positions=positions)

    key_dim = size.width // size.num_heads
    rope = variant == "rope_2d"
    attention = GridAttention(
        size.num_heads,
        key_dim,
        axes_dims=(key_dim // 2, key_dim // 2) if rope else None,
        name="attention",
    )
    attended = attention(x, positions=positions if rope else None)
    x = keras.layers.LayerNormalization(name="attention_norm")(x + attended)
    hidden = keras.layers.Dense(2 * size.width, activation="gelu", name="feed_forward_in")(x)
    x = keras.layers.LayerNormalization(name="feed_forward_norm")(
        x + keras.layers.Dense(size.width, name="feed_forward_out")(hidden)
    )
    pooled = keras.layers.GlobalAveragePooling1D(name="mean_over_patches")(x)
    left_of = keras.layers.Dense(1, activation="sigmoid", name="red_left_of_blue")(pooled)
    return keras.Model(images, left_of, name=f"where_is_it_{variant}")


# --------------------------------------------------------------------------------------
# Training


def run(tiny: bool = False, seed: int = 0, verbose: bool = False) -> dict[str, dict[str, float]]:
    """Trains one classifier per variant and returns its accuracy on the twin test set.

    Args:
        tiny: train the small configuration (a few seconds) instead of the full one.
        seed: seeds the data and the weights.
        verbose: print each variant's result as it finishes.

    Returns:
        `{variant: {"accuracy": test accuracy, "seconds": wall time, "cpu_seconds": ...}}`
        for `"none"`, `"sinusoidal_1d"`, `"sinusoidal_2d"`, `"rope_2d"`.
    """
    size = TINY if tiny else FULL
    rng = np.random.default_rng(seed)
    train_images, train_labels, _ = make_images(size.train_examples, size, rng)
    test_images, test_labels = make_twin_test_set(size.test_pairs, size, rng)

    results = {}
    for variant in VARIANTS:
        keras.utils.set_random_seed(seed)
        start, cpu_start = time.perf_counter(), time.process_time()
        model = build_classifier(variant, size)
        model.compile(
            optimizer=keras.optimizers.Adam(size.learning_rate),
            loss="binary_crossentropy",
            metrics=["accuracy"],
        )
        model.fit(
            train_images, train_labels, batch_size=size.batch_size, epochs=size.epochs, verbose=0
        )
        predictions = model.predict(test_images, batch_size=512, verbose=0)[:, 0] > 0.5
        results[variant] = {
            "accuracy": float(np.mean(predictions == test_labels)),
            "seconds": time.perf_counter() - start,
            "cpu_seconds": time.process_time() - cpu_start,
        }
        if verbose:
            result = results[variant]
            print(
                f"  {variant:<14} test accuracy {result['accuracy']:.3f}  "
                f"({result['seconds']:.1f} s wall, {result['cpu_seconds']:.1f} s CPU)",
                flush=True,
            )
    return results


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--tiny",
        action="store_true",
        default=os.environ.get(TINY_ENVIRONMENT_VARIABLE, "") not in ("", "0"),
        help=f"train the small configuration (also {TINY_ENVIRONMENT_VARIABLE}=1)",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    size = TINY if args.tiny else FULL
    print(
        f"Training 4 tiny ViTs ({'tiny' if args.tiny else 'full'} size: {size.grid} x "
        f"{size.grid} patches of {size.patch} x {size.patch} pixels, width {size.width}, "
        f"{size.train_examples} images, {size.epochs} epochs); testing on "
        f"{2 * size.test_pairs} twin images."
    )
    start, cpu_start = time.perf_counter(), time.process_time()
    results = run(tiny=args.tiny, seed=args.seed, verbose=True)
    print(f"\n{'positions':<15}{'test accuracy':>14}")
    for variant, result in results.items():
        print(f"{variant:<15}{result['accuracy']:>14.3f}")
    print(
        f"(chance is 0.500; total {time.perf_counter() - start:.0f} s wall, "
        f"{time.process_time() - cpu_start:.0f} s CPU)"
    )
    return {variant: result["accuracy"] for variant, result in results.items()}


if __name__ == "__main__":
    main()
