"""Whether TensorFlow can load what Keras's `model.export` writes from JAX (jax2tf).

The SavedModel holds an `XlaCallModule` of StableHLO at the version the writing jax
targets: jax 0.10 writes 1.15, jax 0.12 writes 1.18 (custom calls as
`vhlo.custom_call_v2`); TensorFlow 2.21 reads up to 1.13.7 and fails on 1.18 with
"unregistered operation 'vhlo.custom_call_v2'" (measured with jax 0.12.0.1, 2026-12-04).
"""

from __future__ import annotations

from packaging.version import Version

UNREADABLE_OPERATION = "custom_call_v2"


def tensorflow_reads_jax_exports(jax_version: str, tensorflow_version: str) -> bool:
    """False where TensorFlow `tensorflow_version` cannot load a jax `jax_version` export."""
    return Version(jax_version) < Version("0.12") or Version(tensorflow_version) >= Version("2.22")
