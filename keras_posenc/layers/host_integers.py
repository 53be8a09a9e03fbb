"""A layer's numpy integer arguments past int32: refused before Keras converts them.

Keras converts a layer's array arguments to tensors before `call`. JAX without x64 holds
int64 as int32 and keeps the low 32 bits (2^32 + 5 becomes 5, 2^33 becomes 0); PyTorch
has no uint64. A start or positions past int32 would come to `call` as plausible
positions, or fail on a dtype. No argument of these layers is meant to hold such a
value (positions lie below 2^24, masks are 0 or 1), so one that does is refused here,
on every backend alike; a Python int past int32 is not converted, and reaches the
layer's own checks.
"""

from __future__ import annotations

import inspect

import numpy as np

_INT32 = np.iinfo(np.int32)


def _past_int32(value):
    """The first value of a numpy integer `value` past int32, else None."""
    if not isinstance(value, (np.ndarray, np.integer)) or value.dtype.kind not in "iu":
        return None
    if value.dtype.itemsize < 4 or value.size == 0:
        return None
    past = np.asarray(value)[(value < _INT32.min) | (value > _INT32.max)]
    return past.flat[0].item() if past.size else None


class RefusesHostIntegersPastInt32:
    """Mixin, listed before the Keras base class: a numpy integer argument with a value
    past int32 raises a ValueError naming it, before Keras converts it."""

    def __call__(self, *args, **kwargs):
        for index, value in [*enumerate(args), *kwargs.items()]:
            past = _past_int32(value)
            if past is not None:
                if isinstance(index, int):
                    index = list(inspect.signature(self.call).parameters)[index]
                raise ValueError(
                    f"{index} holds {past}, past int32: positions and start indices count "
                    "from 0 and must stay below the layer's limit (2^24 for the sinusoidal "
                    "and rotary tables, max_length for a learned one). Pass positions "
                    "within it."
                )
        return super().__call__(*args, **kwargs)
