"""Graphs on which `onnx_shapes` claims a shape that onnxruntime does not compute, or on
which `merge_common_subexpressions` changes what onnxruntime computes.

The truth is onnxruntime on the unmerged graph: each claimed size (a monomial of the
inputs' axes) is evaluated at the fed shapes and compared with the `Shape` onnxruntime
returns, and the merged graph must return every output of the unmerged one.
"""

from __future__ import annotations

import copy

import hand_built
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from keras_posenc.export import onnx_passes
from keras_posenc.export.onnx_passes.shapes import SymbolicShapes

_INT64_MAX = 2**63 - 1


def _run(proto: onnx.ModelProto, feeds: dict) -> dict[str, np.ndarray]:
    session = hand_built.session(proto)
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds), strict=True))


_model, _int64 = hand_built.model, hand_built.int64


def _info(name, kind, shape):
    return helper.make_tensor_value_info(name, kind, shape)


def _evaluate(dims, feeds: dict) -> list[int]:
    """The claimed sizes at the fed shapes (symbols are `("input", name, axis)`)."""
    sizes = []
    for coefficient, symbols in dims:
        for _, name, axis in symbols:
            coefficient *= feeds[name].shape[axis]
        sizes.append(coefficient)
    return sizes


def _claim_error(proto, feeds, tensor: str, shape_output: str) -> str | None:
    claimed = SymbolicShapes.of_graph(proto.graph).proven_dims(tensor)
    actual = _run(proto, feeds)[shape_output].tolist()
    if claimed is not None and _evaluate(claimed, feeds) != actual:
        return f"proven_dims({tensor!r}) = {claimed} is {_evaluate(claimed, feeds)}, ran {actual}"
    return None


def _merge_error(proto, feeds) -> str | None:
    expected = _run(proto, feeds)
    merged = copy.deepcopy(proto)
    onnx_passes.merge_common_subexpressions(merged)
    actual = _run(merged, feeds)
    wrong = {
        name: (expected[name].tolist(), actual[name].tolist())
        for name in expected
        if expected[name].shape != actual[name].shape
        or not np.array_equal(expected[name], actual[name])
    }
    return f"merged outputs differ (unmerged, merged): {wrong}" if wrong else None


def _assert_sound(proto, feeds, tensor: str | None = None, shape_output: str | None = None):
    errors = [_merge_error(proto, feeds)]
    if tensor is not None:
        errors.insert(0, _claim_error(proto, feeds, tensor, shape_output))
    errors = [e for e in errors if e]
    assert not errors, "\n".join(errors)


def _shape_pair(x: str, y: str) -> list[onnx.NodeProto]:
    """`Shape(x)` and `Shape(y)`, each returned through an Identity (a merge candidate)."""
    return [
        helper.make_node("Shape", [x], [f"shape_{x}"]),
        helper.make_node("Shape", [y], [f"shape_{y}"]),
        helper.make_node("Identity", [f"shape_{x}"], [f"out_{x}"]),
        helper.make_node("Identity", [f"shape_{y}"], [f"out_{y}"]),
    ]


def _pair_outputs(x: str, y: str):
    return [
        _info(f"out_{x}", TensorProto.INT64, [None]),
        _info(f"out_{y}", TensorProto.INT64, [None]),
    ]


# -- proven_dims claims a wrong shape --------------------------------------------------


def test_a_size_cast_to_uint8_wraps_around():
    # Cast to a narrow integer type is not the identity on sizes: 300 -> 44.
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Cast", ["s"], ["narrow"], to=TensorProto.UINT8),
        helper.make_node("Cast", ["narrow"], ["wide"], to=TensorProto.INT64),
        helper.make_node("ConstantOfShape", ["wide"], ["c"]),
        *_shape_pair("x", "c"),
    ]
    proto = _model(nodes, [_info("x", TensorProto.BOOL, ["n"])], _pair_outputs("x", "c"))
    _assert_sound(proto, {"x": np.zeros(300, bool)}, "c", "out_c")


def test_a_reshape_target_size_that_is_zero_at_run_time_copies_the_input_axis():
    # allowzero=0: a 0 in the target copies the input's axis, and a size read from a
    # Shape can be 0 at run time, so Reshape(x, Shape(y)) need not have y's shape.
    nodes = [
        helper.make_node("Shape", ["y"], ["target"]),
        helper.make_node("Reshape", ["x", "target"], ["r"]),
        *_shape_pair("y", "r"),
    ]
    proto = _model(
        nodes,
        [_info("x", TensorProto.FLOAT, ["t"]), _info("y", TensorProto.FLOAT, ["s"])],
        _pair_outputs("y", "r"),
    )
    feeds = {"x": np.zeros(5, np.float32), "y": np.zeros(0, np.float32)}
    _assert_sound(proto, feeds, "r", "out_r")


def test_a_reshape_to_a_zero_size_and_minus_one():
    # Target [b, -1] of x (a, b) with b = 0: the 0 copies a, the -1 becomes 0: (a, 0),
    # not the claimed (b, a).
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "one"], ["b"]),
        helper.make_node("Concat", ["b", "minus_one"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["r"]),
        *_shape_pair("x", "r"),
    ]
    proto = _model(
        nodes,
        [_info("x", TensorProto.FLOAT, ["a", "b"])],
        _pair_outputs("x", "r"),
        [_int64("one", [1]), _int64("minus_one", [-1])],
    )
    _assert_sound(proto, {"x": np.zeros((4, 0), np.float32)}, "r", "out_r")


def test_a_squeeze_whose_axes_are_only_known_at_run_time():
    # Axes given but not known here is not "no axes": only axis 0 of (1, 1, 3) goes.
    nodes = [
        helper.make_node("Squeeze", ["x", "axes"], ["q"]),
        *_shape_pair("q", "z"),
    ]
    proto = _model(
        nodes,
        [
            _info("x", TensorProto.FLOAT, [1, 1, 3]),
            _info("axes", TensorProto.INT64, [1]),
            _info("z", TensorProto.FLOAT, [3]),
        ],
        _pair_outputs("q", "z"),
    )
    feeds = {
        "x": np.zeros((1, 1, 3), np.float32),
        "axes": np.array([0], np.int64),
        "z": np.zeros(3, np.float32),
    }
    _assert_sound(proto, feeds, "q", "out_q")


def test_a_slice_with_a_negative_step_clamps_its_start_to_zero():
    # ONNX clamps a negative step's start to [0, dim - 1] (Python's slice to -1): x[-100
    # :-100:-1] of 5 elements is [x[0]], 1 element, not 0.
    nodes = [
        helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["q"]),
        *_shape_pair("q", "empty"),
    ]
    proto = _model(
        nodes,
        [_info("x", TensorProto.FLOAT, [5])],
        _pair_outputs("q", "empty"),
        [
            _int64("starts", [-100]),
            _int64("ends", [-100]),
            _int64("axes", [0]),
            _int64("steps", [-1]),
            numpy_helper.from_array(np.zeros(0, np.float32), "empty"),
        ],
    )
    _assert_sound(proto, {"x": np.zeros(5, np.float32)}, "q", "out_q")


def test_a_slice_of_a_shape_with_a_negative_step_clamps_its_start_to_zero():
    # The same clamp on a shape value: Shape(x)[-100:-100:-1] is [2], so the
    # ConstantOfShape is (2,), not a scalar.
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Slice", ["s", "starts", "ends", "axes", "steps"], ["picked"]),
        helper.make_node("ConstantOfShape", ["picked"], ["c"]),
        *_shape_pair("c", "two"),
    ]
    proto = _model(
        nodes,
        [_info("x", TensorProto.FLOAT, [2, 3, 4])],
        _pair_outputs("c", "two"),
        [
            _int64("starts", [-100]),
            _int64("ends", [-100]),
            _int64("axes", [0]),
            _int64("steps", [-1]),
            numpy_helper.from_array(np.zeros(2, np.float32), "two"),
        ],
    )
    _assert_sound(proto, {"x": np.zeros((2, 3, 4), np.float32)}, "c", "out_c")


def test_a_slice_whose_steps_are_only_known_at_run_time():
    # Steps given but not known are not steps of 1: x[0::2] of n is not n.
    nodes = [
        helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["q"]),
        *_shape_pair("x", "q"),
    ]
    proto = _model(
        nodes,
        [_info("x", TensorProto.FLOAT, ["n"]), _info("steps", TensorProto.INT64, [1])],
        _pair_outputs("x", "q"),
        [_int64("starts", [0]), _int64("ends", [_INT64_MAX]), _int64("axes", [0])],
    )
    feeds = {"x": np.zeros(6, np.float32), "steps": np.array([2], np.int64)}
    _assert_sound(proto, feeds, "q", "out_q")


def test_a_slice_of_a_shape_whose_steps_are_only_known_at_run_time():
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Slice", ["s", "starts", "ends", "axes", "steps"], ["picked"]),
        helper.make_node("ConstantOfShape", ["picked"], ["c"]),
        *_shape_pair("x", "c"),
    ]
    proto = _model(
        nodes,
        [_info("x", TensorProto.FLOAT, [2, 3, 4, 5]), _info("steps", TensorProto.INT64, [1])],
        _pair_outputs("x", "c"),
        [_int64("starts", [0]), _int64("ends", [4]), _int64("axes", [0])],
    )
    feeds = {"x": np.zeros((2, 3, 4, 5), np.float32), "steps": np.array([2], np.int64)}
    _assert_sound(proto, feeds, "c", "out_c")


def test_a_split_whose_sizes_are_only_known_at_run_time():
    # Sizes given but not known are not equal parts: 6 split [1, 5] is not 3 and 3.
    nodes = [
        helper.make_node("Split", ["x", "split"], ["a", "b"]),
        *_shape_pair("a", "b"),
    ]
    proto = _model(
        nodes,
        [_info("x", TensorProto.FLOAT, [6]), _info("split", TensorProto.INT64, [2])],
        _pair_outputs("a", "b"),
    )
    feeds = {"x": np.zeros(6, np.float32), "split": np.array([1, 5], np.int64)}
    _assert_sound(proto, feeds, "a", "out_a")


def test_an_input_with_a_default_initializer_can_be_fed_another_shape():
    # An initializer that is also a graph input is only a default: its shape is not known.
    nodes = _shape_pair("x", "c")
    proto = _model(
        nodes,
        [_info("x", TensorProto.FLOAT, [None])],
        _pair_outputs("x", "c"),
        [
            numpy_helper.from_array(np.zeros(3, np.float32), "x"),
            numpy_helper.from_array(np.zeros(3, np.float32), "c"),
        ],
    )
    _assert_sound(proto, {"x": np.zeros(5, np.float32)}, "x", "out_x")


def test_an_einsum_is_followed_without_raising():
    # The equation attribute is bytes: `"..." in equation` raised TypeError, so any graph
    # with an Einsum of known input ranks could not be merged at all.
    nodes = [
        helper.make_node("Einsum", ["x", "w"], ["e"], equation="ij,jk->ik"),
        *_shape_pair("e", "z"),
    ]
    proto = _model(
        nodes,
        [
            _info("x", TensorProto.FLOAT, ["b", 4]),
            _info("w", TensorProto.FLOAT, [4, 3]),
            _info("z", TensorProto.FLOAT, ["b", 3]),
        ],
        _pair_outputs("e", "z"),
    )
    feeds = {
        "x": np.ones((2, 4), np.float32),
        "w": np.ones((4, 3), np.float32),
        "z": np.ones((5, 3), np.float32),
    }
    _assert_sound(proto, feeds, "e", "out_e")


# -- merge_common_subexpressions changes the outputs -----------------------------------


def test_slices_with_axes_omitted_and_steps_given_are_not_slices_with_those_axes():
    # Slice(x, s, e, "", v) (v as steps) and Slice(x, s, e, v) (v as axes) got one shape
    # key: the empty input was dropped before the positions were compared.
    nodes = [
        helper.make_node("Add", ["a", "b"], ["x"]),  # a shape nothing can prove
        helper.make_node("Slice", ["x", "starts", "ends", "", "v"], ["rows"]),
        helper.make_node("Slice", ["x", "starts", "ends", "v"], ["columns"]),
        *_shape_pair("rows", "columns"),
    ]
    proto = _model(
        nodes,
        [_info("a", TensorProto.FLOAT, ["s", 8]), _info("b", TensorProto.FLOAT, ["t", 8])],
        _pair_outputs("rows", "columns"),
        [_int64("starts", [0]), _int64("ends", [2]), _int64("v", [1])],
    )
    feeds = {"a": np.zeros((8, 8), np.float32), "b": np.zeros((8, 8), np.float32)}
    _assert_sound(proto, feeds)


def _branch(nodes, output, kind=TensorProto.FLOAT):
    return helper.make_graph(nodes, "branch", [], [_info(output, kind, [None])])


def test_a_merge_in_one_branch_does_not_rename_the_other_branchs_tensor():
    # Both branches name a local tensor `t` (valid: sibling scopes). The else branch's
    # `t` merges into the outer `w`; the then branch's own `t` must not read `w`.
    then_branch = _branch(
        [helper.make_node("Mul", ["x", "two"], ["t"]), helper.make_node("Neg", ["t"], ["o"])], "o"
    )
    else_branch = _branch(
        [helper.make_node("Add", ["x", "two"], ["t"]), helper.make_node("Neg", ["t"], ["o"])], "o"
    )
    nodes = [
        helper.make_node("Add", ["x", "two"], ["w"]),
        helper.make_node("If", ["cond"], ["r"], then_branch=then_branch, else_branch=else_branch),
    ]
    proto = _model(
        nodes,
        [_info("x", TensorProto.FLOAT, [3]), _info("cond", TensorProto.BOOL, [])],
        [_info("w", TensorProto.FLOAT, [3]), _info("r", TensorProto.FLOAT, [None])],
        [numpy_helper.from_array(np.float32(2.0), "two")],
    )
    _assert_sound(proto, {"x": np.ones(3, np.float32), "cond": np.array(True)})


def test_the_shape_of_one_branchs_tensor_is_not_that_of_the_other_branchs_namesake():
    # Sizes are remembered by name: the else branch's `t` is (2, 3), the then branch's
    # `t` is (3, 2), and its Shape must not merge with Shape(z) of (2, 3).
    def branch(target):
        nodes = [
            helper.make_node("Reshape", ["x", target], ["t"]),
            helper.make_node("Shape", ["t"], ["shape_t"]),
            helper.make_node("Identity", ["shape_t"], ["o"]),
        ]
        return _branch(nodes, "o", TensorProto.INT64)

    nodes = [
        helper.make_node("Shape", ["z"], ["shape_z"]),
        helper.make_node("Identity", ["shape_z"], ["out_z"]),
        helper.make_node(
            "If", ["cond"], ["r"], then_branch=branch("to_3_2"), else_branch=branch("to_2_3")
        ),
    ]
    proto = _model(
        nodes,
        [
            _info("x", TensorProto.FLOAT, [6]),
            _info("z", TensorProto.FLOAT, [2, 3]),
            _info("cond", TensorProto.BOOL, []),
        ],
        [_info("out_z", TensorProto.INT64, [2]), _info("r", TensorProto.INT64, [2])],
        [_int64("to_2_3", [2, 3]), _int64("to_3_2", [3, 2])],
    )
    feeds = {
        "x": np.ones(6, np.float32),
        "z": np.ones((2, 3), np.float32),
        "cond": np.array(True),
    }
    _assert_sound(proto, feeds)


def test_nested_branches_reading_their_outer_branchs_tensor_are_not_equal():
    # Two Ifs whose branches compute t = x + 3 or t = x * 3 and return it through an
    # inner If: the inner graphs read `t` by name, so their keys were equal, and the
    # outer branches' keys were too, though the two `t` differ.
    def branch(op):
        inner = _branch([helper.make_node("Identity", ["t"], ["v"])], "v")
        nodes = [
            helper.make_node(op, ["x", "three"], ["t"]),
            helper.make_node("If", ["cond"], ["u"], then_branch=inner, else_branch=inner),
        ]
        return _branch(nodes, "u")

    nodes = [
        helper.make_node(
            "If", ["cond"], ["r1"], then_branch=branch("Add"), else_branch=branch("Add")
        ),
        helper.make_node(
            "If", ["cond"], ["r2"], then_branch=branch("Mul"), else_branch=branch("Mul")
        ),
        helper.make_node("Identity", ["r1"], ["o1"]),
        helper.make_node("Identity", ["r2"], ["o2"]),
    ]
    proto = _model(
        nodes,
        [_info("x", TensorProto.FLOAT, [3]), _info("cond", TensorProto.BOOL, [])],
        [_info("o1", TensorProto.FLOAT, [None]), _info("o2", TensorProto.FLOAT, [None])],
        [numpy_helper.from_array(np.float32(3.0), "three")],
    )
    _assert_sound(proto, {"x": np.ones(3, np.float32), "cond": np.array(True)})


# -- tricky cases the rules get right (coverage) ---------------------------------------


def test_tricky_shape_arithmetic_that_holds():
    # Shape start/end negative, Gather with negative indices, ReduceProd keepdims=0 then
    # Unsqueeze, an Expand to a size that is 0, a Reshape allowzero=1 with -1.
    nodes = [
        helper.make_node("Shape", ["x"], ["middle"], start=-2, end=-1),
        helper.make_node("ConstantOfShape", ["middle"], ["c"]),
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "last_two"], ["g"]),
        helper.make_node("ReduceProd", ["g"], ["p"], keepdims=0),
        helper.make_node("Unsqueeze", ["p", "zero"], ["flat_size"]),
        helper.make_node("Reshape", ["y", "flat_size"], ["flat"]),
        helper.make_node("Shape", ["e_like"], ["e_shape"]),
        helper.make_node("Expand", ["row", "e_shape"], ["e"]),
        helper.make_node("Shape", ["e"], ["out_e"]),
        helper.make_node("Shape", ["c"], ["out_c"]),
        helper.make_node("Shape", ["flat"], ["out_flat"]),
    ]
    proto = _model(
        nodes,
        [
            _info("x", TensorProto.FLOAT, [2, "m", 4]),
            _info("y", TensorProto.FLOAT, ["m", 4]),
            _info("e_like", TensorProto.FLOAT, ["k", 1]),
            _info("row", TensorProto.FLOAT, [1, "n"]),
        ],
        [_info(n, TensorProto.INT64, [None]) for n in ("out_e", "out_c", "out_flat")],
        [_int64("last_two", [-1, -2]), _int64("zero", [0])],
    )
    feeds = {
        "x": np.zeros((2, 3, 4), np.float32),
        "y": np.zeros((3, 4), np.float32),
        "e_like": np.zeros((0, 1), np.float32),
        "row": np.zeros((1, 5), np.float32),
    }
    for tensor in ("e", "c", "flat"):
        assert _claim_error(proto, feeds, tensor, f"out_{tensor}") is None
    # x's "m" and y's "m" are two sizes to the rules (a dim_param promises nothing at run
    # time), so `flat` is not proven; `e` and `c` are.
    shapes = SymbolicShapes.of_graph(proto.graph)
    assert shapes.proven_dims("flat") is None
    assert shapes.proven_dims("c") is not None and shapes.proven_dims("e") is not None
    assert _merge_error(proto, feeds) is None
