"""The hessian-blocks study (numformer/studies/hessian_blocks.py, Zhang et al. 2024): on its small configuration
each control block's Hessian spectrum (a kind one layer up) is closer to its own kind than that kind is to the
other kinds (block heterogeneity, the bounds of check() with margin); a planted change fails the check: the
controls paired with blocks of another kind. The spectra come from exact products, per block and per layer; the
products by float32 and by differences of gradients are measured against them."""
import numpy as np
import pytest

from numformer.studies import hessian_blocks as study


def _quiet(line):
    pass


@pytest.fixture(scope="module")
def results():
    return study.measure(study.SMALL, log=_quiet)


def test_blocks_differ_by_kind_at_initialisation(results):
    assert study.check(results) == []
    init = next(r for r in study.findings(results) if r["state"] == "initialisation")
    for control in init["controls"].values():
        assert control["kind_across"] > 1.5 * control["within"]  # margin over HETEROGENEITY_MIN
    blocks = results["states"]["initialisation"]
    assert set(blocks) == set(study.BLOCKS) | set(study.CONTROLS)
    for b in blocks.values():  # Lanczos's extremes bracket the quadrature's nodes (to the products' error)
        nodes, tol = np.array(b["nodes"]), 1e-6 * max(abs(b["min"]), abs(b["top"][0]))
        assert b["min"] <= nodes.min() + tol and nodes.max() <= b["top"][0] + tol


def test_the_check_fails_when_controls_are_paired_with_another_kind(results, monkeypatch):
    swapped = {name: (other, names) for (name, (_, names)), other in
               zip(study.CONTROLS.items(), ("LayerNorm", "query", "FFN"))}
    monkeypatch.setattr(study, "CONTROLS", swapped)
    failed = study.check(results)
    assert failed and all("from its kind in layer 1" in f for f in failed), failed


def test_js_distance_is_zero_for_equal_and_one_for_disjoint_spectra():
    p = np.array([0.5, 0.5, 0.0, 0.0])
    assert study.js_distance(p, p) == 0.0
    assert study.js_distance(p, np.array([0.0, 0.0, 0.5, 0.5])) == pytest.approx(1.0)


def test_spectra_per_layer_and_the_other_ways_measured_against_exact_products(results):
    for state, layers in results["layers"].items():
        assert set(layers) == set(study.SMALL.layers)
        for name, b in layers.items():  # a whole layer: every parameter of it
            assert b["dim"] > results["states"][state]["FFN"]["dim"] and b["min"] < 0 < b["top"][0]
    for state, blocks in results["precision"].items():
        assert set(blocks) == set(study.SMALL.precision_blocks)
        for b in blocks.values():
            e = b["product_errors"]
            assert e["differences float64"] < 1e-6 and e["exact float32"] < 1e-4
            assert e["differences float32"] > 10 * e["exact float32"]  # the old method in training's precision
            assert set(b["top_errors"]) == {"differences float64"} and b["top_errors"]["differences float64"] < 1e-5
