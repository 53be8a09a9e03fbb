"""The parts of a verification that hold a copy of the weights, made only while needed.

A decoder's description holds a float32 copy of every weight, and each runtime of the
written folder (an onnxruntime session, onnxruntime-genai's `og.Model`) holds one more.
`save_decoder` writes the files from the description, then verifies them; held all at
once these copies are what bounds the size of a model that can be exported on a machine
(issue 39). So:

- `on_demand(decoder, describe)`: what verification reads of a description (its
  vocabulary, widest window, whether it has a mixture of experts) without its arrays,
  and how to make it again; the float64 decode that judges a reference less exact than
  the file (`judge.py`) describes the model anew only where a runtime's logits fail.
- `OneAtATime`: runtimes opened on their first call, one open at a time: opening one
  releases the one before (and collects it), so a verification that runs each runtime's
  cases together (`check.verify_decoder`) holds one runtime's weights at a time.
"""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Callable

from keras_posenc.export.decoder.description import Decoder, Moe, widest_window


@dataclasses.dataclass(frozen=True)
class DescriptionOnDemand:
    """A description's settings that verification reads, without its arrays.

    Attributes:
        vocabulary: the description's vocabulary.
        window: its widest sliding window (`description.widest_window`), or None.
        moe: whether a block holds a mixture of experts (its router is judged by a
            float64 decode of every case).
        describe: makes the description (again).
    """

    vocabulary: int
    window: int | None
    moe: bool
    describe: Callable[[], Decoder]


def on_demand(
    decoder: Decoder | DescriptionOnDemand, describe: Callable[[], Decoder] | None = None
) -> DescriptionOnDemand:
    """`decoder`'s settings and `describe` to make it again (None: `decoder` is held and
    returned). A `DescriptionOnDemand` is returned as it is.

    Example:

    ```python
    decoder = describe_decoder(model, max_length)
    source = on_demand(decoder, lambda: describe_decoder(model, max_length))
    decoder = None  # the arrays are freed; source.describe() makes them again
    ```
    """
    if isinstance(decoder, DescriptionOnDemand):
        return decoder
    moe = any(isinstance(block.mlp, Moe) for block in decoder.blocks)
    if describe is None:
        describe = lambda: decoder  # noqa: E731 (the caller holds it anyway)
    return DescriptionOnDemand(decoder.vocabulary, widest_window(decoder), moe, describe)


class OneAtATime:
    """Greedy runtimes (`greedy(prompts, mask, steps) -> (tokens, logits)`) opened on
    their first call, at most one open at a time.

    Example:

    ```python
    slot = OneAtATime()
    runtimes = {"onnxruntime": slot.runtime("onnxruntime", open_session)}
    ```
    """

    def __init__(self):
        self._name = None
        self._open = None

    def runtime(self, name: str, open_runtime: Callable[[], Callable]) -> Callable:
        """The greedy function of runtime `name`: `open_runtime()` makes it at its first
        call after another runtime of this slot ran (that one released first)."""

        def greedy(prompts, mask, steps: int):
            if self._name != name:
                self.close()
                self._open, self._name = open_runtime(), name
            return self._open(prompts, mask, steps)

        return greedy

    def close(self) -> None:
        """Releases the open runtime; its native memory goes as its last reference does."""
        if self._open is not None:
            self._open = self._name = None
            gc.collect()  # a session held in a reference cycle is freed now, not later
