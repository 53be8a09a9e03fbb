"""Serving a `keras_posenc.export.save_decoder` folder with onnxruntime and numpy only.

A package of its own, beside `keras_posenc`: importing it runs no Keras and no TensorFlow
(`keras_posenc/__init__.py` imports Keras), so a server needs neither installed.

Example:

```python
import keras_posenc_serve

decoder = keras_posenc_serve.load("decoder")  # model.onnx + genai_config.json
tokens = decoder.generate([[5, 9, 2], [7, 1]], steps=20)  # (2, 20): left-padded batch
sampled = decoder.generate([[5, 9, 2]], steps=20, temperature=0.8, top_p=0.9, seed=0)
```
"""

from keras_posenc_serve.folder import DecoderFolder, load
from keras_posenc_serve.sampling import next_tokens, probabilities
from keras_posenc_serve.session import SharedCacheSession, onnx_greedy

__all__ = [
    "DecoderFolder",
    "SharedCacheSession",
    "load",
    "next_tokens",
    "onnx_greedy",
    "probabilities",
]
