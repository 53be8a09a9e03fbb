"""Attention masks made of ops every converter has built in.

Example:

```python
from keras_posenc.export import causal_mask

x = keras.Input((None, 64))
y = keras.layers.MultiHeadAttention(4, 16)(x, x, attention_mask=causal_mask(x))
```
"""

from __future__ import annotations

import keras


def causal_mask(inputs) -> keras.KerasTensor:
    """`(1, sequence, sequence)` booleans, True where step `i` may attend to step `j <= i`.

    The same mask as `use_causal_mask=True`, made of ops LiteRT has built in: Keras's own
    causal path (`dot_product_attention(is_causal=True)`) indexes the mask with
    `mask[None, None]`, a `StridedSlice` with new axes that only a Flex op can run.

    Args:
        inputs: a `(batch, sequence, ...)` tensor; only its sequence length is read.
    """
    steps = keras.ops.arange(keras.ops.shape(inputs)[1])
    later = keras.ops.expand_dims(steps, 1) >= keras.ops.expand_dims(steps, 0)
    return keras.ops.expand_dims(later, 0)
