"""The layers and modes `python -m benchmarks` times: names only, so that its arguments are
parsed (and `--help` answered) before Keras and TensorFlow load."""

LAYERS = ("sinusoidal", "rotary", "learned")
MODES = ("eager", "function", "xla")
