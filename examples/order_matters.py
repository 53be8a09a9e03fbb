"""Order matters: "dog bites man" against "man bites dog", with and without positions.

Every sentence holds the same three words, "dog", "bites" and "man", at random places among
filler words; the label says who bites whom (1: the dog comes first). A sentence and its twin
with "dog" and "man" swapped hold exactly the same bag of words and have opposite labels.

A Transformer encoder without position information is permutation invariant (self-attention
permutes its outputs with its inputs, and the mean over the sequence forgets the order), so
it gives a sentence and its twin the same answer. The test set is made of such twins, so
without positions the accuracy is exactly 50% however well the model trains. With sinusoidal,
learned or rotary positions the same encoder learns the task.

Run it:

    python examples/order_matters.py           # the full run, about a minute on 2 CPU cores
    python examples/order_matters.py --tiny    # a few seconds (also KERAS_POSENC_EXAMPLE_TINY=1)
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
    LearnedPositionalEmbedding,
    RotaryMultiHeadAttention,
    SinusoidalPositionalEncoding,
)

VARIANTS = ("none", "sinusoidal", "learned", "rotary")
DOG, MAN, BITES = 0, 1, 2
FILLERS = ("the", "a", "big", "old", "small", "brown", "angry", "today", "again", "in", "park")
WORDS = ("dog", "man", "bites", *FILLERS)
TINY_ENVIRONMENT_VARIABLE = "KERAS_POSENC_EXAMPLE_TINY"


@dataclasses.dataclass(frozen=True)
class Size:
    """How big the data and the model are, and how long to train."""

    sequence_length: int
    train_examples: int
    test_pairs: int
    width: int
    num_heads: int
    epochs: int
    batch_size: int = 64
    learning_rate: float = 3e-3


FULL = Size(
    sequence_length=32, train_examples=4096, test_pairs=1024, width=32, num_heads=2, epochs=10
)
TINY = Size(sequence_length=8, train_examples=1024, test_pairs=256, width=32, num_heads=2, epochs=8)


def make_sentences(
    count: int, sequence_length: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """`count` random sentences `(count, sequence_length)` of word ids, and their labels.

    "dog", "bites" and "man" sit at three random places in that order (label 1) or with
    "man" first (label 0); every other place holds a random filler word.
    """
    tokens = rng.integers(len(WORDS) - len(FILLERS), len(WORDS), size=(count, sequence_length))
    labels = rng.integers(0, 2, size=count)
    for row, label in zip(tokens, labels, strict=True):
        first, verb, last = np.sort(rng.choice(sequence_length, size=3, replace=False))
        row[first], row[verb], row[last] = (DOG, BITES, MAN) if label else (MAN, BITES, DOG)
    return tokens, labels


def swap_dog_and_man(tokens: np.ndarray) -> np.ndarray:
    """The twin sentences: the same words, "dog" and "man" trading places."""
    swapped = tokens.copy()
    swapped[tokens == DOG] = MAN
    swapped[tokens == MAN] = DOG
    return swapped


def make_twin_test_set(
    pairs: int, sequence_length: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """`pairs` sentences followed by their twins: each bag of words once with each label."""
    tokens, labels = make_sentences(pairs, sequence_length, rng)
    return np.concatenate([tokens, swap_dog_and_man(tokens)]), np.concatenate([labels, 1 - labels])


def build_classifier(variant: str, size: Size) -> keras.Model:
    """Embedding, position information of `variant`, one encoder block, mean, logistic output."""
    if variant not in VARIANTS:
        raise ValueError(f"Unknown variant {variant!r}; expected one of {VARIANTS}.")
    tokens = keras.Input((size.sequence_length,), dtype="int32", name="tokens")
    x = keras.layers.Embedding(len(WORDS), size.width, name="words")(tokens)
    if variant == "sinusoidal":
        x = SinusoidalPositionalEncoding(name="positions")(x)
    elif variant == "learned":
        x = LearnedPositionalEmbedding(size.sequence_length, name="positions")(x)

    # Rotary positions live inside the attention (on projected queries and keys); the other
    # variants use the plain Keras attention layer with the same shapes.
    attention_class = (
        RotaryMultiHeadAttention if variant == "rotary" else keras.layers.MultiHeadAttention
    )
    key_dim = size.width // size.num_heads
    attended = attention_class(num_heads=size.num_heads, key_dim=key_dim, name="attention")(x, x)
    x = keras.layers.LayerNormalization(name="attention_norm")(x + attended)
    hidden = keras.layers.Dense(2 * size.width, activation="gelu", name="feed_forward_in")(x)
    x = keras.layers.LayerNormalization(name="feed_forward_norm")(
        x + keras.layers.Dense(size.width, name="feed_forward_out")(hidden)
    )
    pooled = keras.layers.GlobalAveragePooling1D(name="mean_over_sequence")(x)
    dog_bites = keras.layers.Dense(1, activation="sigmoid", name="dog_bites")(pooled)
    return keras.Model(tokens, dog_bites, name=f"order_matters_{variant}")


def run(tiny: bool = False, seed: int = 0, verbose: bool = False) -> dict[str, float]:
    """Trains one classifier per variant and returns its accuracy on the twin test set.

    Args:
        tiny: train the small configuration (a few seconds) instead of the full one.
        seed: seeds the data and the weights.
        verbose: print each variant's result as it finishes.

    Returns:
        `{variant: test accuracy}` for `"none"`, `"sinusoidal"`, `"learned"`, `"rotary"`.
    """
    size = TINY if tiny else FULL
    rng = np.random.default_rng(seed)
    train_tokens, train_labels = make_sentences(size.train_examples, size.sequence_length, rng)
    test_tokens, test_labels = make_twin_test_set(size.test_pairs, size.sequence_length, rng)

    accuracies = {}
    for variant in VARIANTS:
        keras.utils.set_random_seed(seed)
        model = build_classifier(variant, size)
        model.compile(
            optimizer=keras.optimizers.Adam(size.learning_rate),
            loss="binary_crossentropy",
            metrics=["accuracy"],
        )
        start = time.perf_counter()
        model.fit(
            train_tokens,
            train_labels,
            batch_size=size.batch_size,
            epochs=size.epochs,
            verbose=0,
        )
        predictions = model.predict(test_tokens, batch_size=512, verbose=0)[:, 0] > 0.5
        accuracies[variant] = float(np.mean(predictions == test_labels))
        if verbose:
            print(
                f"  {variant:<11} test accuracy {accuracies[variant]:.3f}  "
                f"({time.perf_counter() - start:.1f} s)",
                flush=True,
            )
    return accuracies


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
    rng = np.random.default_rng(args.seed)
    example, _ = make_sentences(1, size.sequence_length, rng)
    print("A test pair (same words, opposite labels):")
    for sentence in (example[0], swap_dog_and_man(example)[0]):
        print("   ", " ".join(WORDS[token] for token in sentence))
    print(
        f"Training 4 encoders ({'tiny' if args.tiny else 'full'} size: sequence "
        f"{size.sequence_length}, width {size.width}, {size.train_examples} sentences, "
        f"{size.epochs} epochs); testing on {2 * size.test_pairs} twin sentences."
    )
    start = time.perf_counter()
    accuracies = run(tiny=args.tiny, seed=args.seed, verbose=True)
    print(f"\n{'positions':<12}{'test accuracy':>14}")
    for variant, accuracy in accuracies.items():
        print(f"{variant:<12}{accuracy:>14.3f}")
    print(f"(chance is 0.500; total {time.perf_counter() - start:.0f} s)")
    return accuracies


if __name__ == "__main__":
    main()
