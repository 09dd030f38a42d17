"""Studies: published experiments on Transformer gradients, rerun on numformer, one command each.

``python -m numformer.studies --list`` names them; ``python -m numformer.studies NAME [--out DIR]`` runs
one and writes ``DIR/NAME.png`` (the picture), ``DIR/NAME.md`` (a table that puts the paper's claim beside
what numformer measured) and ``DIR/NAME.json`` (every number). docs/studies.md describes each one.

A study module holds: ``NAME``, ``TITLE``, ``CITATION`` (the paper and the figure it reproduces),
``MINUTES`` (its stated time on 2 cores), a ``Config`` dataclass with ``FULL`` (the study) and ``SMALL``
(what its CI test runs), ``measure(cfg, ...)`` (numbers only), ``check(results)`` (the qualitative finding
as bounds; returns what fails) and ``run(out, cfg)`` (measure, draw, write). Its docstring states the
paper, the claim, what it runs, the shapes and seeds, where it differs, the command and the stated time;
what numformer found, and at which commit, is docs/studies.md's. A study with flags of its own also has
``add_arguments(parser)`` and ``config_from_args(args, cfg) -> cfg`` (table3's ``--rows``, ``--steps`` ...),
which ``python -m numformer.studies`` calls when that study is named. A study too large for one file keeps
its jobs in sibling modules that it imports (``table3_config``, ``table3_flags``, ``table3_record``,
``table3_compare``, ``table3_report``), and its module still holds every name above.

A finding that does not reproduce is a result: each study says what differs (initialisation, data,
scale) rather than being tuned until it agrees.
"""
from __future__ import annotations

import importlib

#: name -> module (under numformer.studies), in the order --list shows them
STUDIES = {
    "ln-placement": "ln_placement",
    "warmup": "warmup",
    "output-change": "output_change",
    "table3": "table3",
    "noise-scale": "noise_scale",
    "hessian-blocks": "hessian_blocks",
}


def get(name: str):
    """The study module called ``name`` (KeyError for an unknown name)."""
    return importlib.import_module(f"{__name__}.{STUDIES[name]}")
