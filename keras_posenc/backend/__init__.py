"""What differs by backend: `tensorflow/` (TensorFlow/XLA tricks and private APIs),
`keras_ops/` (the same names for JAX and PyTorch), `lazy` (TensorFlow imported on first use),
`keras_private` (every private Keras API the package touches)."""
