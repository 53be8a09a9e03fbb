"""Figures of the encodings: the sinusoidal table, its relative-distance property, the
wavelengths per channel pair, the RoPE attention score against relative distance, and the
2D table of a patch grid (how alike the encodings of two patches are).

The arrays come from the package's own layers and tables (`figure_data`); matplotlib, an
optional extra (`pip install "keras-posenc[plot]"`), is needed only to draw them.

Run it:

    python examples/plot_encodings.py --out figures            # writes figures/*.png
    python examples/plot_encodings.py --out docs               # the README's figures, anew
    python examples/plot_encodings.py --out figures --tiny     # small tables (also by
                                                               # KERAS_POSENC_EXAMPLE_TINY=1)
    python examples/plot_encodings.py --out figures --only 2d  # only figures/sinusoidal_2d.png
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from keras_posenc import (  # noqa: E402
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    grid_positions,
    inverse_frequencies,
    sinusoidal_table,
)

TINY_ENVIRONMENT_VARIABLE = "KERAS_POSENC_EXAMPLE_TINY"


@dataclasses.dataclass(frozen=True)
class Size:
    """The tables the figures show."""

    length: int  # positions in the heatmap
    width: int  # channels of the sinusoidal encoding
    max_offset: int  # relative distances -max_offset .. max_offset
    anchors: tuple[int, ...]  # absolute positions the relative curves start from
    head_dim: int  # channels of the rotated query and key
    max_wavelength: float = 10000.0


FULL = Size(length=128, width=128, max_offset=128, anchors=(128, 4000, 100_000), head_dim=64)
TINY = Size(length=16, width=16, max_offset=8, anchors=(8, 4090), head_dim=8)


@dataclasses.dataclass(frozen=True)
class FigureData:
    """What the four figures plot.

    Attributes:
        table: the sinusoidal encoding `P`, `(length, width)`, interleaved layout.
        offsets: relative distances `j - i`, `(2·max_offset + 1,)`.
        dot_products: `{anchor i: p_i·p_(i + offset) for each offset}`.
        wavelengths: `λ_k = 2π/ω_k` for each channel pair `k`, `(width/2,)`.
        rope_scores: `{anchor i: RoPE(q, i)·RoPE(k, i + offset) for each offset}` with
            all-ones `q` and `k` of `head_dim` channels (the RoFormer paper's decay plot).
        max_wavelength: the base of the frequencies.
    """

    table: np.ndarray
    offsets: np.ndarray
    dot_products: dict[int, np.ndarray]
    wavelengths: np.ndarray
    rope_scores: dict[int, np.ndarray]
    max_wavelength: float


def relative_dot_products(size: Size) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """`p_i·p_(i + offset)` for each anchor `i`: the curves coincide (they depend on the offset)."""
    offsets = np.arange(-size.max_offset, size.max_offset + 1)
    dot_products = {}
    for anchor in size.anchors:
        rows = sinusoidal_table(anchor + size.max_offset + 1, size.width, size.max_wavelength)
        dot_products[anchor] = rows[anchor + offsets] @ rows[anchor]
    return offsets, dot_products


def rope_scores(size: Size) -> dict[int, np.ndarray]:
    """All-ones query at position `i` against all-ones keys at `i + offset`, rotated by RoPE."""
    rope = RotaryEmbedding(max_wavelength=size.max_wavelength)
    ones = np.ones((1, 2 * size.max_offset + 1, size.head_dim), dtype=np.float32)
    scores = {}
    for anchor in size.anchors:
        query = np.asarray(rope(ones[:, :1], start_index=anchor))[0, 0]
        keys = np.asarray(rope(ones, start_index=anchor - size.max_offset))[0]
        scores[anchor] = keys @ query
    return scores


def figure_data(tiny: bool = False) -> FigureData:
    """The arrays of every figure, from the package's tables and layers (no matplotlib)."""
    size = TINY if tiny else FULL
    if min(size.anchors) < size.max_offset:
        raise ValueError("Every anchor must be >= max_offset so that positions stay >= 0.")
    offsets, dot_products = relative_dot_products(size)
    return FigureData(
        table=sinusoidal_table(size.length, size.width, size.max_wavelength),
        offsets=offsets,
        dot_products=dot_products,
        wavelengths=2 * np.pi / inverse_frequencies(size.width, size.max_wavelength),
        rope_scores=rope_scores(size),
        max_wavelength=size.max_wavelength,
    )


def draw_figures(data: FigureData, out: Path) -> list[Path]:
    """Writes the four PNG figures into `out` and returns their paths."""
    try:
        import matplotlib
    except ImportError as error:
        raise ImportError(
            'Drawing the figures needs matplotlib: pip install "keras-posenc[plot]" '
            "(or pip install matplotlib)."
        ) from error
    matplotlib.use("Agg")
    from matplotlib import pyplot

    out.mkdir(parents=True, exist_ok=True)
    length, width = data.table.shape
    written = []

    def save(figure, name: str) -> None:
        # Written whole or not at all: draw into a temporary file, then rename it.
        path = out / name
        with tempfile.NamedTemporaryFile(dir=out, suffix=".png", delete=False) as temporary:
            figure.savefig(temporary, format="png", dpi=100)
        os.chmod(temporary.name, 0o644)  # NamedTemporaryFile makes it private (0600)
        os.replace(temporary.name, path)
        pyplot.close(figure)
        written.append(path)

    figure, axes = pyplot.subplots(figsize=(6.4, 4.2))
    image = axes.imshow(
        data.table, aspect="auto", cmap="RdBu", vmin=-1, vmax=1, interpolation="nearest"
    )
    axes.set(
        xlabel="channel (even: sin, odd: cos)",
        ylabel="position i",
        title=f"Sinusoidal encoding P, {length} positions × {width} channels",
    )
    figure.colorbar(image, ax=axes)
    figure.tight_layout()
    save(figure, "sinusoidal_table.png")

    def save_against_offset(curves: dict, ylabel: str, title: str, legend: str, name: str) -> None:
        # One curve per anchor position: that they coincide is the point of the figure.
        figure, axes = pyplot.subplots(figsize=(6.4, 3.6))
        for (anchor, values), style in zip(curves.items(), ("-", "--", ":"), strict=False):
            axes.plot(data.offsets, values, style, linewidth=1.5, label=f"i = {anchor:,}")
        axes.set(xlabel="relative distance j − i", ylabel=ylabel, title=title)
        axes.legend(title=legend)
        axes.grid(alpha=0.3)
        figure.tight_layout()
        save(figure, name)

    save_against_offset(
        data.dot_products,
        "p_i · p_j",
        "The dot product depends on j − i only",
        "anchor position",
        "sinusoidal_dot_product.png",
    )

    figure, axes = pyplot.subplots(figsize=(6.4, 3.6))
    pairs = np.arange(len(data.wavelengths))
    base = f"{data.max_wavelength:g}"
    axes.semilogy(pairs, data.wavelengths, "o", markersize=3)
    axes.axhline(2 * np.pi, color="gray", linewidth=0.8, linestyle="--")
    axes.set(
        xlabel="channel pair k (channels 2k, 2k+1)",
        ylabel="wavelength λ_k (positions)",
        title=f"λ_k = 2π · {base}^(2k/d), d = {width}: from 2π to about 2π·{base}",
    )
    axes.grid(alpha=0.3, which="both")
    figure.tight_layout()
    save(figure, "sinusoidal_wavelengths.png")

    save_against_offset(
        data.rope_scores,
        "RoPE(q, i) · RoPE(k, j)",
        "RoPE attention score (q = k = all ones) depends on j − i only",
        "query position",
        "rope_score.png",
    )
    return written


# --------------------------------------------------------------------------------------
# The 2D table of a patch grid


@dataclasses.dataclass(frozen=True)
class GridSize:
    """The patch grid of the 2D figure."""

    grid: int  # patches per side
    width: int  # channels of the encoding (half for the row, half for the column)
    references: tuple[tuple[int, int], ...]  # (row, column) of the patches compared against
    max_wavelength: float = 10000.0


GRID_FULL = GridSize(grid=14, width=64, references=((0, 0), (3, 10), (7, 7), (12, 2)))
GRID_TINY = GridSize(grid=4, width=16, references=((0, 0), (2, 1)))


@dataclasses.dataclass(frozen=True)
class GridFigureData:
    """What the 2D figure plots: for each reference patch, how alike every patch's encoding is.

    Attributes:
        positions: `(row, column)` of each patch, row-major, `(grid², 2)`.
        table_2d: `SinusoidalPositionalEncoding(axes=2)` at those positions, `(grid², width)`.
        table_1d: the 1D encoding of the flattened index `row·grid + column`, `(grid², width)`.
        similarity_2d: `{(row, column): cosine similarity of each patch's 2D encoding to that
            reference patch's, (grid, grid)}`.
        similarity_1d: the same for the 1D encoding of the flattened index.
    """

    positions: np.ndarray
    table_2d: np.ndarray
    table_1d: np.ndarray
    similarity_2d: dict[tuple[int, int], np.ndarray]
    similarity_1d: dict[tuple[int, int], np.ndarray]


def grid_figure_data(tiny: bool = False) -> GridFigureData:
    """The 2D figure's arrays, from the package's layer and table (no matplotlib)."""
    size = GRID_TINY if tiny else GRID_FULL
    grid = size.grid
    positions = grid_positions(grid, grid)
    layer = SinusoidalPositionalEncoding(axes=2, max_wavelength=size.max_wavelength)
    zeros = np.zeros((1, grid * grid, size.width), np.float32)
    table_2d = np.asarray(layer(zeros, positions=positions))[0]
    table_1d = sinusoidal_table(grid * grid, size.width, size.max_wavelength)

    def similarities(table: np.ndarray) -> dict[tuple[int, int], np.ndarray]:
        unit = table / np.linalg.norm(table, axis=1, keepdims=True)
        return {
            (row, column): (unit @ unit[row * grid + column]).reshape(grid, grid)
            for row, column in size.references
        }

    return GridFigureData(
        positions=positions,
        table_2d=table_2d,
        table_1d=table_1d,
        similarity_2d=similarities(table_2d),
        similarity_1d=similarities(table_1d),
    )


def draw_grid_figure(data: GridFigureData, out: Path) -> Path:
    """Writes `sinusoidal_2d.png` into `out` and returns its path."""
    try:
        import matplotlib
    except ImportError as error:
        raise ImportError(
            'Drawing the figures needs matplotlib: pip install "keras-posenc[plot]" '
            "(or pip install matplotlib)."
        ) from error
    matplotlib.use("Agg")
    from matplotlib import pyplot

    out.mkdir(parents=True, exist_ok=True)
    grid = int(np.sqrt(len(data.positions)))
    width = data.table_2d.shape[1]
    references = list(data.similarity_2d)
    figure, axes = pyplot.subplots(
        2,
        len(references),
        figsize=(2.2 * len(references) + 1.0, 5.0),
        squeeze=False,
        layout="constrained",
    )
    # One colour scale for all panels, from the least similar pair shown up to 1.
    lowest = min(
        s.min() for rows in (data.similarity_2d, data.similarity_1d) for s in rows.values()
    )
    rows = (
        (data.similarity_2d, "2D: axes=2"),
        (data.similarity_1d, "1D: index row·grid + col"),
    )
    for line, (similarity, label) in enumerate(rows):
        for column, reference in enumerate(references):
            ax = axes[line, column]
            image = ax.imshow(similarity[reference], cmap="viridis", vmin=lowest, vmax=1)
            ax.plot(reference[1], reference[0], "x", color="red", markersize=7, mew=2)
            ax.set_xticks([])
            ax.set_yticks([])
            if line == 0:
                ax.set_title(f"patch (row {reference[0]}, col {reference[1]})", fontsize=9)
            if column == 0:
                ax.set_ylabel(label, fontsize=10)
    figure.colorbar(image, ax=axes, shrink=0.8, label="cosine similarity")
    figure.suptitle(
        f"Similarity of each patch's encoding to the patch at ×, {grid} × {grid} grid, "
        f"width {width}",
        fontsize=11,
    )
    # Written whole or not at all: draw into a temporary file, then rename it.
    path = out / "sinusoidal_2d.png"
    with tempfile.NamedTemporaryFile(dir=out, suffix=".png", delete=False) as temporary:
        figure.savefig(temporary, format="png", dpi=100)
    os.chmod(temporary.name, 0o644)  # NamedTemporaryFile makes it private (0600)
    os.replace(temporary.name, path)
    pyplot.close(figure)
    return path


def main(argv: list[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out",
        type=Path,
        required=True,
        help="folder for the PNG files (created if missing; `docs` replaces the README's)",
    )
    parser.add_argument(
        "--tiny",
        action="store_true",
        default=os.environ.get(TINY_ENVIRONMENT_VARIABLE, "") not in ("", "0"),
        help=f"small tables (also {TINY_ENVIRONMENT_VARIABLE}=1)",
    )
    parser.add_argument(
        "--only",
        choices=("all", "1d", "2d"),
        default="all",
        help="1d: the four figures of 1D positions; 2d: the patch-grid figure",
    )
    args = parser.parse_args(argv)
    written = []
    if args.only in ("all", "1d"):
        written += draw_figures(figure_data(tiny=args.tiny), args.out)
    if args.only in ("all", "2d"):
        written.append(draw_grid_figure(grid_figure_data(tiny=args.tiny), args.out))
    for path in written:
        print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KB)")
    return written


if __name__ == "__main__":
    main()
