"""Probes by name: every case of ``python -m grad_checks`` draws its probes (upstream gradients, sampled entries,
random directions) from a stream seeded by its builder's and its own name (grad_checks.cases.probe_seed), so the
figures of a case do not depend on which builders run before it, or whether they run at all. Run through the
command itself (--json), the builders in their order, shuffled, and a subset: every tensor's worst error is the
same bits."""
import json
import random

import pytest

import grad_checks.__main__ as command

# quick builders (a few seconds together); the model-sized ones draw their probes the same way
FAST = ["Linear", "Embedding", "OutputProjection", "PositionalEncoding", "Dropout", "ReLU", "LayerNorm", "Softmax",
        "FeedForward", "Residual", "LabelSmoothedCrossEntropy", "SiLU"]


def figures(layers, capsys) -> dict:
    """(layer, case, tensor) -> (probes, worst relative error) of ``python -m grad_checks --json --layer ...``."""
    argv = ["--json"] + [a for name in layers for a in ("--layer", name)]
    assert command.main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    return {(r["layer"], r["case"], r["tensor"]): (r["probes"], r["max_rel_error"]) for r in report["results"]}


def test_shuffled_or_left_out_builders_change_no_case_figures(capsys):
    ordered = figures(FAST, capsys)
    shuffled = FAST[:]
    random.Random(69).shuffle(shuffled)
    assert shuffled != FAST
    assert figures(shuffled, capsys) == ordered  # float equality: the same bits
    subset = FAST[1::3]
    alone = figures(subset, capsys)
    assert alone and alone == {k: v for k, v in ordered.items() if k in alone}


def test_a_shared_stream_is_caught(capsys, monkeypatch):
    """Planted: probes seeded by the case's position in the run (what one shared stream amounts to) move when
    the builders are reversed, and the comparison above sees it."""
    def by_position(layers):
        position = iter(range(10**6))
        monkeypatch.setattr(command, "probe_seed", lambda builder, case, seed: [seed, next(position)])
        return figures(layers, capsys)

    ordered, reversed_order = by_position(FAST), by_position(FAST[::-1])
    assert reversed_order.keys() == ordered.keys()
    assert reversed_order != ordered
