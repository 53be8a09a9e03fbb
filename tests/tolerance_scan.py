"""Find float comparisons in tests/ whose tolerance is a bare literal (see test_tolerances.py).

A tolerance is "bare" when it is a number written in the source (`1e-5`, `-1e-3`, `2 * 1e-6`)
or a module-level name bound to one (`ATOL = 1e-5`), as opposed to a bound computed from the
computation (`float32_error`) or an expression of measured quantities.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

# Calls that compare floats within a tolerance, and the arguments that carry it.
CALLS = {
    "assert_allclose": ("atol", "rtol"),
    "allclose": ("atol", "rtol"),
    "isclose": ("atol", "rtol", "abs_tol", "rel_tol"),
    "assert_array_almost_equal": ("decimal",),
    "assert_almost_equal": ("decimal",),
    "approx": ("abs", "rel"),
}


@dataclasses.dataclass(frozen=True)
class Finding:
    path: str  # relative to tests/
    function: str  # the enclosing test or helper ("<module>" at top level)
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line} in {self.function}: {self.text}"


def _literal(node, constants) -> bool:
    """Whether `node` is a number known from the source alone."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
    if isinstance(node, ast.UnaryOp):
        return _literal(node.operand, constants)
    if isinstance(node, ast.BinOp):
        return _literal(node.left, constants) and _literal(node.right, constants)
    if isinstance(node, ast.Name):
        return node.id in constants
    return False


def _zero(node) -> bool:
    """`rtol=0` / `atol=0`: no tolerance of that kind, not a constant that passed."""
    return isinstance(node, ast.Constant) and node.value == 0


def _name(func) -> str:
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _is_difference(node) -> bool:
    """`abs(a - b)`, `np.abs(a - b).max()`, `np.max(np.abs(a - b))`, `(a - b).abs()`..."""
    return any(
        isinstance(n, ast.Call)
        and _name(n.func) in ("abs", "fabs", "absolute")
        and any(isinstance(m, ast.BinOp) and isinstance(m.op, ast.Sub) for m in ast.walk(n))
        for n in ast.walk(node)
    )


def scan_source(source: str, path: str) -> list[Finding]:
    tree = ast.parse(source)
    constants = {
        target.id
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name) and _literal(node.value, set())
    }
    findings = []

    def visit(node, function):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            function = node.name if function == "<module>" else f"{function}.{node.name}"
        if isinstance(node, ast.Call) and _name(node.func) in CALLS:
            names = CALLS[_name(node.func)]
            if any(
                k.arg in names and _literal(k.value, constants) and not _zero(k.value)
                for k in node.keywords
            ):
                findings.append(Finding(path, function, node.lineno, ast.unparse(node)[:120]))
        if isinstance(node, ast.Compare) and all(
            isinstance(op, (ast.Lt, ast.LtE)) for op in node.ops
        ):
            operands = [node.left, *node.comparators]
            for left, right in zip(operands, operands[1:], strict=False):
                if _is_difference(left) and _literal(right, constants):
                    findings.append(Finding(path, function, node.lineno, ast.unparse(node)[:120]))
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(tree, "<module>")
    return findings


def scan(folder: Path) -> list[Finding]:
    """Every bare-literal float tolerance in the `.py` files under `folder`."""
    findings = []
    for file in sorted(folder.rglob("*.py")):
        relative = file.relative_to(folder).as_posix()
        findings += scan_source(file.read_text(), relative)
    return findings


if __name__ == "__main__":
    for finding in scan(Path(__file__).parent):
        print(finding)
