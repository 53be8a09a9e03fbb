"""No test compares float outputs with a bare constant, except those listed here with a reason.

A tolerance that passed on one CPU fails on the next (issue 37: 1.48e-05 against atol=1e-05
on another machine). Comparisons against another library's or runtime's float32 output, or
a float64 formula, take their bound from the computation (`float32_error.py`). The scanner
(`tolerance_scan.py`, `ast` over tests/) finds the tolerances written as numbers: `atol=`,
`rtol=`, `abs=`/`rel=` of `pytest.approx`, `decimal=`, `np.allclose`/`isclose`, and
`abs(a - b) < c`, also through a module-level name bound to a number. Each comparison that
keeps one is listed in `ALLOWED` by (file, function) with why; a new one fails here.

The `PENDING_*` entries are comparisons not yet converted (issue 37): listed so that none is
added, to be converted and removed from the list. What the scanner cannot see: a constant
passed through a local variable or a helper's default argument.
"""

from __future__ import annotations

from pathlib import Path

from tolerance_scan import scan, scan_source

FLOAT64 = (
    "float64 values (frequencies, attention factors as Python floats on both sides, the "
    "bounds' own arithmetic) against float64 formulas: a relative constant of float64 "
    "rounding, the same on every CPU"
)
TABLE = (
    "a table entry rounded once to float32 (|entries| <= 1: within 2^-24, or TABLE_TOLERANCE "
    "for the package's split), not a fit"
)
HALF = (
    "float16 / bfloat16: the constant is a fraction of the narrow type's ulp, which no "
    "float32 reordering moves"
)
STATISTIC = "an accuracy (a fraction of examples that a model gets right), not a float output"
VERIFIER = (
    "the verifier's own threshold (optimum's atol=1e-5, rtol=1e-4) is what is tested, or a "
    "difference it reports, compared exactly"
)
PENDING_RUNTIME = (
    "PENDING: an exported file (onnxruntime, SavedModel, LiteRT) against Keras or a formula "
    "with a constant"
)
PENDING_FORMULA = "PENDING: float32 output against a float64 formula with a constant"
PENDING_SAME = (
    "PENDING: two float32 evaluations of this package (a trace and eager, a cache and the "
    "full pass, padded and unpadded) compared with a constant"
)

ALLOWED = {
    ("test_query_key_norm.py", "test_multi_head_attention_reads_and_computes_the_same_norms"): (
        PENDING_SAME
    ),
    ("test_decoder_verify_reference.py", "test_the_float64_decode_is_the_independent_references"): (
        "two float64 decodes of one model: the description's RoPE tables are the formula "
        "rounded once to float32 (2**-24 relative), the only difference from the reference's"
    ),
    (
        "backends/test_attention_behaviour.py",
        "test_attention_temperature_is_llama4s_formula",
    ): PENDING_FORMULA,
    (
        "backends/test_attention_behaviour.py",
        "test_the_attention_layers_train_and_round_trip_through_a_keras_file",
    ): PENDING_SAME,
    (
        "backends/test_distribution.py",
        "test_distributed_training_equals_one_device",
    ): PENDING_FORMULA,
    ("sweep.py", "outcome"): PENDING_SAME,
    ("test_benchmark_report.py", "test_sign_test_matches_the_binomial_tails"): FLOAT64,
    (
        "test_compact_artifacts.py",
        "test_the_stacked_saved_model_still_loads_with_tensorflow_alone_and_matches_keras",
    ): PENDING_RUNTIME,
    ("test_decoder_block.py", "test_training_model_is_the_cached_prefill"): PENDING_SAME,
    (
        "test_examples.py",
        "test_order_matters_without_positions_is_chance_and_with_positions_is_not",
    ): STATISTIC,
    (
        "test_examples.py",
        "test_serve_onnx_answers_like_keras_without_importing_tensorflow",
    ): PENDING_RUNTIME,
    (
        "test_examples.py",
        "test_where_is_it_without_positions_is_chance_and_2d_positions_solve_it",
    ): STATISTIC,
    ("test_export.py", "test_float16_model_is_compared_with_its_float32_twin"): HALF,
    ("test_export.py", "test_bfloat16_model_exports_a_float32_copy_that_loads"): HALF,
    (
        "test_float32_error.py",
        "test_a_dot_products_bound_is_gamma_n_times_the_absolute_products",
    ): FLOAT64,
    ("test_frequencies.py", "test_inverse_frequencies_of_the_seed_example"): FLOAT64,
    ("test_frequencies.py", "test_inverse_frequencies_match_the_formula"): FLOAT64,
    ("test_frequencies.py", "test_wavelengths_are_two_pi_times_base_to_the_2k_over_d"): FLOAT64,
    ("test_keras_hub_gpt_oss.py", "test_yarn_tables_are_numpy_float64"): TABLE,
    (
        "test_llama4_attention.py",
        "test_chunked_self_attention_on_a_slice_counts_chunks_from_its_start",
    ): PENDING_SAME,
    ("test_onnx_cse.py", "test_each_attention_layer_computes_its_rows_once"): PENDING_RUNTIME,
    ("test_onnx_pipeline.py", "test_exact_gelu_encoder_exports_and_matches_keras"): PENDING_RUNTIME,
    (
        "test_onnx_shapes.py",
        "test_blocks_of_one_length_share_their_rows_and_a_cropped_block_keeps_its_own",
    ): PENDING_RUNTIME,
    (
        "test_query_key_norm.py",
        "test_each_kind_normalizes_queries_and_keys_as_its_formula",
    ): PENDING_FORMULA,
    ("test_rope_per_layer.py", "test_hunyuan_alpha_is_a_fixed_base"): FLOAT64,
    (
        "test_rope_scaling.py",
        "test_longrope_chooses_factors_by_total_length_not_chunk_length",
    ): FLOAT64,
    (
        "test_rope_scaling.py",
        "test_rotary_attention_positions_from_mask_matches_unpadded",
    ): PENDING_SAME,
    (
        "test_rope_scaling.py",
        "test_legacy_type_next_to_rope_type_is_accepted_when_they_agree",
    ): FLOAT64,
    (
        "test_rope_scaling.py",
        "test_transformers5_rope_parameters_is_accepted_as_scaling",
    ): FLOAT64,
    ("test_rope_types_transformers.py", "_compare"): FLOAT64,
    ("test_sinusoidal.py", "test_position_zero_of_the_seed_example_is_0_1_0_1_0_1"): TABLE,
    ("test_sinusoidal.py", "test_bfloat16_encoding_is_within_2e_3_up_to_position_1e5"): HALF,
    ("test_sinusoidal.py", "test_tensor2tensor_spacing_is_whispers_table"): TABLE,
    (
        "test_transformers_parity.py",
        "test_published_configs_read_as_transformers_reads_them",
    ): FLOAT64,
    (
        "test_transformers_parity.py",
        "test_phi3_original_length_is_the_one_transformers_uses",
    ): FLOAT64,
    ("test_verify_compare.py", "test_compare_outputs_passes_exactly_when_allclose_does"): FLOAT64,
    ("test_verify_driver.py", "test_run_case_compares_each_artifact_with_keras"): VERIFIER,
    (
        "test_verify_driver.py",
        "test_a_wrong_file_fails_by_the_difference_of_the_tables_and_the_report_is_written",
    ): VERIFIER,
    (
        "test_verify_tables.py",
        "test_a_row_changed_at_the_start_middle_or_end_of_any_table_fails",
    ): VERIFIER,
}


def test_no_new_bare_constant_tolerances():
    findings = scan(Path(__file__).parent)
    new = [str(f) for f in findings if (f.path, f.function) not in ALLOWED]
    assert not new, (
        "compare with a bound from tests/float32_error.py, not a constant that passed on "
        "this CPU (or list the comparison in test_tolerances.ALLOWED with why):\n" + "\n".join(new)
    )


def test_every_reason_is_given():
    assert all(isinstance(reason, str) and reason for reason in ALLOWED.values())


def test_the_scanner_finds_each_form():
    source = """
import numpy as np, pytest
ATOL = 1e-5
def test_a(x, y):
    np.testing.assert_allclose(x, y, atol=1e-5)
    np.testing.assert_allclose(x, y, rtol=2 ** -20)
    assert np.allclose(x, y, atol=ATOL)
    assert abs(x - y) < 1e-6
    assert np.abs(x - y).max() <= -1e-3 * 2
    assert x == pytest.approx(y, abs=1e-7)
def test_b(x, y, bound):
    np.testing.assert_allclose(x, y, atol=bound)
    np.testing.assert_allclose(x, y, rtol=0, atol=4 * bound)
    assert abs(x - y) > 1e-3
    assert np.abs(x - y).max() <= bound.max()
"""
    findings = scan_source(source, "example.py")
    assert [f.function for f in findings] == ["test_a"] * 6
    assert [f.line for f in findings] == [5, 6, 7, 8, 9, 10]
