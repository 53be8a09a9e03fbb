"""`RotaryEmbedding`: rotates channel pairs of queries and keys by `position·ω` (RoPE).

For a pair `(a, b)` at position `i` with frequency `ω`:
`(a, b) -> (a·cos(iω) - b·sin(iω), b·cos(iω) + a·sin(iω))`, so `q_i·k_j` depends on `i - j` only.
Written for the whole vector: `y = x·C + swap(x)·S`, where `swap` exchanges the two channels of
every pair and the tables hold `C = cos` and `S = ∓sin` (minus on a pair's first channel) per
channel. Both come ready from the shared frequency table: two multiplies, one swap and one add.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import keras
import numpy as np
from keras import ops

from keras_posenc.backend.lazy import tricks
from keras_posenc.frequencies import MAX_POSITIONS, PositionTable, held_tables
from keras_posenc.layers.checks import (
    checked_axis,
    checked_bool,
    checked_call_input,
    checked_choice,
    checked_even_width,
    checked_float_policy,
    checked_max_wavelength,
    rank_of,
)
from keras_posenc.layers.host_integers import RefusesHostIntegersPastInt32
from keras_posenc.layers.rotation_scope import rotation_scope
from keras_posenc.rope import check_shared_keys, checked_scaling, rope_parameters
from keras_posenc.tables.axes import axes_rotation_rows, checked_axes_dims, checked_mrope_section
from keras_posenc.tables.positions import position_rows, rows_of_run, static_dim
from keras_posenc.tables.rotary import (  # noqa: F401  swap_pairs, rotation_table: re-exported
    channel_tables,
    rotation_rows,
    rotation_table,
    scaled_inverse_frequencies,
    swap_pairs,
)

LAYOUTS = ("half", "interleaved")
_EARLY_CHECK_DIM = 2**14
_LIMIT_HINT = "the rotation is exact only below that."


@keras.saving.register_keras_serializable(package="keras_posenc")
class RotaryEmbedding(RefusesHostIntegersPastInt32, keras.layers.Layer):
    """Rotary position embedding (RoPE): rotates channel pairs by `position·ω_k`.

    Apply it to queries and keys (after projection, before the dot product); their
    dot product then depends on the relative position only. `ω_k =
    max_wavelength^(-2k/rotary_dim)`. The sin/cos tables are exact float32 roundings at
    every position below 2^24, whatever the dtype policy; only the result is cast.

    Example:

    >>> rope = RotaryEmbedding()
    >>> queries = np.random.uniform(-1, 1, size=(2, 10, 4, 32)).astype("float32")
    >>> tuple(rope(queries).shape)
    (2, 10, 4, 32)

    Args:
        max_wavelength: the base of the frequencies (10000 in RoFormer, 500000 in Llama 3).
        layout: `"half"` pairs channel `k` with `k + D/2` (GPT-NeoX, Llama in
            transformers; ONNX `interleaved=0`); `"interleaved"` pairs `2k` with `2k+1`
            (GPT-J, the RoFormer paper; ONNX `interleaved=1`).
        rotary_dim: rotate only the first `rotary_dim` channels (even) and pass the rest
            through unchanged; default all.
        sequence_axis: the axis of the positions in the input.
        feature_axis: the axis of the channels in the input.
        scaling: optional dict in the shape of transformers' `rope_scaling`: a `rope_type`
            and its keys (`keras_posenc.rope.ROPE_TYPES` holds the types, each with its
            keys). `from_transformers_config` builds the layer from a whole transformers
            config.
        positions_from_mask: when the input carries a padding mask `(batch, sequence)` and
            no `positions` are given, use `start_index + cumsum(mask) - 1` (clamped), so
            left-padded sequences rotate as if unpadded.
        axes_dims: axial RoPE (FLUX, DINOv3, SAM): the rotated channels of each axis, in
            order (even, summing to `rotary_dim`); each axis has its own frequencies
            `max_wavelength^(-2k/axes_dims[a])`. Positions are then required,
            `(sequence, axes)` or `(batch, sequence, axes)` (`keras_posenc.grid_positions`).
        mrope_section: multimodal RoPE (Qwen2-VL): the channel pairs of each axis
            `(time, height, width)`, summing to `rotary_dim / 2`; the frequencies stay
            the 1D ones and each pair takes the coordinate of its axis. Positions
            `(..., 3)` as `keras_posenc.multimodal_positions` makes them; a `start_index`
            run (text) puts every axis at the same position, which is plain RoPE.
        mrope_interleaved: with `mrope_section`, pairs take their axes interleaved
            (`t h w t h w ...`, Qwen3-VL) instead of in chunks (Qwen2-VL).
        **kwargs: base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: float tensor, `(batch, sequence, heads, head_dim)` or `(batch, sequence, dim)`
            (with the default axes).
        positions: optional integer tensor `(sequence,)` or `(batch, sequence)`.
        start_index: the position of the first step when `positions` is not given: a Python
            int or a scalar int tensor (decoding with a cache).

    Input shape: rank 3 or 4. Output shape: the same. A Keras mask passes through.
    """

    def __init__(
        self,
        max_wavelength: float = 10000.0,
        layout: str = "half",
        rotary_dim: int | None = None,
        sequence_axis: int = 1,
        feature_axis: int = -1,
        scaling: dict | None = None,
        positions_from_mask: bool = False,
        axes_dims: tuple[int, ...] | None = None,
        mrope_section: tuple[int, ...] | None = None,
        mrope_interleaved: bool = False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if axes_dims is not None and mrope_section is not None:
            raise ValueError("Give axes_dims (axial RoPE) or mrope_section (M-RoPE), not both.")
        self.axes_dims = None if axes_dims is None else checked_axes_dims(axes_dims, rotary_dim)
        self.mrope_section = (
            None if mrope_section is None else checked_mrope_section(mrope_section, rotary_dim)
        )
        self.mrope_interleaved = checked_bool(mrope_interleaved, "mrope_interleaved")
        if self.axes_dims is not None and scaling is not None:
            raise ValueError("axes_dims (axial RoPE) takes no scaling; leave scaling None.")
        self.max_wavelength = checked_max_wavelength(max_wavelength)
        self.layout = checked_choice("layout", layout, LAYOUTS)
        self.rotary_dim = (
            None if rotary_dim is None else checked_even_width(rotary_dim, "rotary_dim")
        )
        self.sequence_axis = checked_axis(sequence_axis, "sequence_axis")
        self.feature_axis = checked_axis(feature_axis, "feature_axis")
        self.scaling = checked_scaling(scaling)
        if self.scaling is not None:
            check_shared_keys(self.scaling, self.max_wavelength)  # rope_theta must agree
        self.positions_from_mask = checked_bool(positions_from_mask, "positions_from_mask")
        checked_float_policy(self)
        if self.rotary_dim is not None and self.rotary_dim <= _EARLY_CHECK_DIM:
            # Bad scaling values fail here, not at the first call. A rotary_dim larger than
            # any head is checked against the head in `build` before anything the size of
            # it is made: a crafted config must not allocate first.
            rope_parameters(self.rotary_dim, self.max_wavelength, self.scaling)
        self.supports_masking = True

    def build(self, input_shape) -> None:
        rank = len(input_shape)
        if rank not in (3, 4):
            raise ValueError(
                "RotaryEmbedding expects inputs of rank 3 (batch, sequence, dim) or 4 "
                f"(batch, sequence, heads, head_dim), got shape {tuple(input_shape)}."
            )
        for name in ("sequence_axis", "feature_axis"):
            if not -rank <= getattr(self, name) < rank:
                raise ValueError(
                    f"{name}={getattr(self, name)} does not fit inputs of rank {rank} "
                    f"(shape {tuple(input_shape)})."
                )
        self._sequence_axis = self.sequence_axis % rank
        self._feature_axis = self.feature_axis % rank
        if not 0 < self._sequence_axis < self._feature_axis:
            raise ValueError(
                f"sequence_axis={self.sequence_axis} and feature_axis={self.feature_axis} must "
                "be axes after the batch axis 0, the sequence axis before the feature axis "
                "(for example (batch, sequence, heads, head_dim) or (batch, heads, sequence, "
                "head_dim))."
            )
        head_dim = input_shape[self._feature_axis]
        if head_dim is None:
            raise ValueError("RotaryEmbedding needs the size of the feature axis to be known.")
        rotary_dim = self.rotary_dim or checked_even_width(head_dim, "the feature axis size")
        if rotary_dim > head_dim:
            raise ValueError(
                f"rotary_dim={rotary_dim} is larger than the feature axis ({head_dim}); "
                f"use rotary_dim <= {head_dim}."
            )
        self._rotary_dim = rotary_dim
        self._built_rank = rank
        self._head_dim = head_dim
        if self.axes_dims is None and self.mrope_section is None:
            self._axes = 1
            self._table = rotation_rows(rotary_dim, self.max_wavelength, self.layout, self.scaling)
        else:
            if self.axes_dims is not None:
                checked_axes_dims(self.axes_dims, rotary_dim)
            else:
                checked_mrope_section(self.mrope_section, rotary_dim)
            self._table = axes_rotation_rows(
                rotary_dim,
                self.max_wavelength,
                self.scaling,
                self.axes_dims,
                self.mrope_section,
                self.mrope_interleaved,
                lambda sin, cos: channel_tables(self.layout, sin, cos),
            )
            self._axes = self._table.axes
        super().build(input_shape)

    def position_tables(self) -> tuple[PositionTable, ...]:
        """The host position tables this layer reads its rows from, as a `PositionTable`.

        Empty before `build`, and where the rows are made otherwise (several axes, or a
        scaling that switches frequencies by length). What an export holds of each table:
        `PositionTable.stored_arrays(bound)`; layers of one configuration share one table.
        """
        return held_tables(getattr(self, "_table", None))

    def held_rows(self):
        """The rows of its positions (None before `build`), for an export's table audit."""
        return getattr(self, "_table", None)

    @property
    def position_axes(self) -> int:
        """The coordinates of one position (1, or the axes of axial RoPE and M-RoPE), once built."""
        return self._axes

    def call(self, inputs, positions=None, start_index=0, mask=None):
        (outputs,) = self.rotate_together((inputs,), positions, start_index, mask)
        return outputs

    def rotate_together(self, tensors: Sequence, positions=None, start_index=0, mask=None) -> tuple:
        """Rotates several inputs at the same positions with one lookup of their rows.

        What `call` does for each of `tensors` (the queries and keys of self-attention),
        with the rows looked up and checked once: an exported graph then holds one row
        lookup for both. The tensors must agree in batch and sequence length; `call`'s
        arguments otherwise. Call it on a built layer, inside the caller's own `call`.
        """
        t = tricks()
        for x in tensors:
            checked_call_input(self, x, self._built_rank, {self._feature_axis: self._head_dim})
        first = tensors[0]
        forms = [t.swap_form(x) for x in tensors]

        def rotate(cos_table, sin_table):
            # Shaped to broadcast once per rank and dtype: once for queries and keys.
            shaped = {}
            for x in tensors:
                key = (rank_of(x), t.accumulation_dtype(x.dtype))
                if key not in shaped:
                    shaped[key] = self._broadcast_tables(cos_table, sin_table, *key)
            return tuple(
                self._rotate(x, shaped[(rank_of(x), t.accumulation_dtype(x.dtype))], form)
                for x, form in zip(tensors, forms, strict=True)
            )

        length = static_dim(first, self._sequence_axis)
        traced = t.is_traced(first)
        rows = functools.partial(
            position_rows,
            self._table,
            length,
            positions,
            start_index,
            limit=MAX_POSITIONS,
            limit_hint=_LIMIT_HINT,
            mask=mask if self.positions_from_mask else None,
            batch=static_dim(first, 0),
            axes=self._axes,
            traced=traced,
        )
        if self.axes_dims is not None and positions is None and not self.positions_from_mask:
            raise ValueError(
                f"Axial RoPE needs positions of shape (sequence, {self._axes}) or (batch, "
                f"sequence, {self._axes}), one coordinate per axis; for a patch grid use "
                "positions=keras_posenc.grid_positions(height, width)."
            )
        run_only = positions is None and (mask is None or not self.positions_from_mask)
        if run_only and self._axes == 1 and not t.in_xla_context():
            # The rows of a run depend on the table, the start and the length alone: one
            # function of a SavedModel serves every layer (`tf_backend.shared_while_stored`).
            # (Outside XLA the rotation follows the rows whatever `rows_fuse_into_rotation`.)
            run = t.shared_while_stored(
                self._table,
                ("rows_of_run",),
                functools.partial(
                    rows_of_run,
                    self._table,
                    limit=MAX_POSITIONS,
                    limit_hint=_LIMIT_HINT,
                    traced=traced,
                ),
            )
            outputs = rotate(*run(length, start_index))
        elif all(t.rows_fuse_into_rotation(form) for form in forms):
            outputs = rows(combine=rotate)
        else:
            outputs = rotate(*rows())
        for x, output in zip(tensors, outputs, strict=True):
            t.keep_static_shape(output, x.shape)
        return tuple(outputs)

    def _broadcast_tables(self, cos_table, sin_table, rank: int, wide):
        """`(cos, sin, per_batch)`: the tables in `wide`, shaped to broadcast at `rank`."""
        t = tricks()
        # Tables are (sequence, rotary_dim) or (batch, sequence, rotary_dim): give them
        # size-1 axes so they broadcast against the input's axes.
        table_rank = rank_of(cos_table)
        table_axes = [0, self._sequence_axis, self._feature_axis][-table_rank:]
        per_batch = table_rank == 3  # for the ONNX marker of `_rotate`
        if table_axes != list(range(rank - len(table_axes), rank)):
            # Not the input's trailing axes (heads lie between sequence and features).
            broadcast_shape = [1] * rank
            for table_axis, input_axis in enumerate(table_axes):
                broadcast_shape[input_axis] = static_dim(cos_table, table_axis)
            broadcast_shape = t.int_array(broadcast_shape)
            cos_table = t.reshape(cos_table, broadcast_shape)
            sin_table = t.reshape(sin_table, broadcast_shape)
        # float16 / bfloat16 inputs rotate in float32: the result is rounded once.
        return t.cast(cos_table, wide), t.cast(sin_table, wide), per_batch

    def _rotate(self, inputs, tables, form: str):
        cos_table, sin_table, per_batch = tables
        t = tricks()
        wide = t.accumulation_dtype(inputs.dtype)
        # The ONNX passes find the rotation by this name scope on its nodes (`rotation_scope`).
        marker = rotation_scope(
            self.layout, rank_of(inputs), self._sequence_axis, self._feature_axis, per_batch
        )

        def rotate(x):
            with t.rotation_name_scope(marker):
                x = t.cast(x, wide)
                swapped = swap_pairs(x, self.layout, self._feature_axis, form)
                rotated = x * cos_table + swapped * sin_table
                return t.cast(rotated, inputs.dtype)

        if self._rotary_dim == inputs.shape[self._feature_axis]:
            return rotate(inputs)
        rotated, passed = t.split_channels(inputs, self._rotary_dim, self._feature_axis)
        return ops.concatenate([rotate(rotated), passed], self._feature_axis)

    @classmethod
    def from_transformers_config(
        cls, config, layer_type: str | None = None, **overrides
    ) -> RotaryEmbedding:
        """The `RotaryEmbedding` a transformers model config describes.

        Args:
            config: a transformers config or its dict (`config.json` of transformers 4 or 5,
                or `to_dict()`); see `keras_posenc.configs.arguments` for the families read.
            layer_type: the layer type to read when the config has RoPE per layer type
                (Gemma 3 and 4, ModernBERT, OLMo 3: `"full_attention"` /
                `"sliding_attention"`). `keras_posenc.rope_per_layer` gives the RoPE of
                every decoder layer at once, None for those without (NoPE, linear
                attention, convolution).
            **overrides: further `RotaryEmbedding` arguments (`name`, `sequence_axis`, ...),
                or ones that replace what the config gives.

        Example:

        >>> llama31 = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
        ...            "rope_theta": 500000.0, "max_position_embeddings": 131072,
        ...            "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
        ...                             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        ...                             "original_max_position_embeddings": 8192}}
        >>> rope = RotaryEmbedding.from_transformers_config(llama31)
        >>> rope.max_wavelength, rope.layout, rope.scaling["rope_type"]
        (500000.0, 'half', 'llama3')
        """
        from keras_posenc.configs.arguments import rotary_arguments

        arguments = rotary_arguments(config, layer_type, layout=overrides.get("layout"))
        return cls(**{**arguments, **overrides})

    def inverse_frequencies(self, total_length: int | None = None) -> np.ndarray:
        """The `ω` this layer rotates with when the total length is `total_length`.

        Differs from the plain `max_wavelength^(-2k/d)` under `scaling`; depends on the
        length only for `dynamic` and `longrope`. float64 (for dynamic scaling past
        `max_position_embeddings`, the layer holds them as two float32 words: within 2^-44).
        """
        if not self.built:
            raise ValueError("Call the layer (or build it) first: rotary_dim comes from the input.")
        return scaled_inverse_frequencies(
            self._rotary_dim, self.max_wavelength, self.scaling, total_length
        )

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(
            {
                "max_wavelength": self.max_wavelength,
                "layout": self.layout,
                "rotary_dim": self.rotary_dim,
                "sequence_axis": self.sequence_axis,
                "feature_axis": self.feature_axis,
                "scaling": self.scaling,
                "positions_from_mask": self.positions_from_mask,
                "axes_dims": self.axes_dims,
                "mrope_section": self.mrope_section,
                "mrope_interleaved": self.mrope_interleaved,
            }
        )
        return config
