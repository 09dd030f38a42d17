"""The model flags of ``train.py``: one row per flag, from which everything that names them is derived.

A model flag changes one field of :class:`numformer.presets.ModelConfig` away from the preset's value. Its
row says which field, how the flag reads (a switch such as ``--pre-norm``, or a value such as ``--dropout
0.3``), whether it changes the architecture (then ``--init-from``, which takes a model file's architecture as
it is, refuses it), and the parser's type, choices and help. From this table come: the flags of ``train.py``'s
"model" group (:func:`add_model_flags`), the flags ``--init-from`` refuses (:func:`clashing_with_init_from`),
the fields a resumed run takes from its ``run.json`` unless a flag is given and the flags a refusal names
(numformer/training/config.py's ``RESUMED_MODEL_FIELDS`` and ``VALUE_FLAGS``), the changes a run makes to the
preset (:func:`model_changes`), and the fields a fine-tuning run may still set (:data:`TRAINING_ONLY`).
Adding a model flag is one row here (docs/layout.md, "Adding a model flag").
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..activations import ACTIVATIONS
from ..cli.arguments import probability
from ..layers.init import SCHEMES as INIT_SCHEMES
from ..presets import POSITIONAL, ModelConfig

DEFAULTS = ModelConfig()


@dataclass(frozen=True)
class ModelFlag:
    """``flag`` sets ``ModelConfig.<field>``: a switch (``switch_value``: what the field becomes when the flag is
    given) or a value (``parser``: the argparse keywords, type and choices); ``architecture``: a change of the
    model's shape or function, which a fine-tuning run (``--init-from``) cannot make."""

    flag: str
    field: str
    help: str
    architecture: bool = True
    switch_value: object = None            # a switch: the field's value when the flag is given
    parser: dict = field(default_factory=dict)

    @property
    def dest(self) -> str:
        """The argparse attribute: ``--pre-norm`` -> ``pre_norm``."""
        return self.flag[2:].replace("-", "_")

    @property
    def is_switch(self) -> bool:
        return self.switch_value is not None


MODEL_FLAGS = (
    ModelFlag("--pre-norm", "pre_norm", "pre-LN residual blocks instead of the paper's post-LN", switch_value=True),
    ModelFlag("--untied", "tie_embeddings", "separate source, target and output embeddings", switch_value=False),
    ModelFlag("--dropout", "dropout", "dropout probability (default: the preset's)", architecture=False,
              parser={"type": probability}),
    ModelFlag("--label-smoothing", "label_smoothing", f"label smoothing epsilon (default {DEFAULTS.label_smoothing})",
              architecture=False, parser={"type": probability}),
    ModelFlag("--positional", "positional", "sinusoidal (Section 3.5, the paper's) or learned position embeddings "
              "(Table 3 row E) (default: the preset's)", parser={"choices": list(POSITIONAL)}),
    ModelFlag("--init", "init", "initialisation of the linear maps: pytorch (torch.nn.Transformer's, the default) or "
              "xavier (Xavier-uniform everywhere); see numformer/layers/init.py", parser={"choices": list(INIT_SCHEMES)}),
    ModelFlag("--activation", "activation", "the feed-forward network's activation (Eq. 2's relu, the default; "
              "numformer/activations.py lists each)", parser={"choices": list(ACTIVATIONS)}),
)

#: The fields a resumed run takes from its run.json unless the flag is given.
RESUMED_MODEL_FIELDS = tuple(f.field for f in MODEL_FLAGS)
#: field -> the flag that sets it to any value (a refusal of a value read from run.json suggests it).
VALUE_FLAGS = {f.field: f.flag for f in MODEL_FLAGS if not f.is_switch}
#: The fields a fine-tuning run may set: the others are the model file's own.
TRAINING_ONLY = tuple(f.field for f in MODEL_FLAGS if not f.architecture)


def add_model_flags(group) -> None:
    """Every flag of :data:`MODEL_FLAGS` on ``group`` (an argparse parser or argument group)."""
    for f in MODEL_FLAGS:
        if f.is_switch:
            group.add_argument(f.flag, action="store_true", help=f.help)
        else:
            group.add_argument(f.flag, help=f.help, **f.parser)


def given(flags: dict, f: ModelFlag) -> bool:
    """Whether the flag was typed: a switch set, a value given (``flags``: the parsed arguments as a dict)."""
    value = flags.get(f.dest)
    return bool(value) if f.is_switch else value is not None


def clashing_with_init_from(flags: dict) -> list:
    """The architecture flags given, which ``--init-from`` refuses (it takes the model file's architecture)."""
    return [f.flag for f in MODEL_FLAGS if f.architecture and given(flags, f)]


def model_changes(flags: dict) -> tuple[dict, dict]:
    """(the changes the flags make to the preset: {field: value}, {field: whether its flag was given}). An
    absent switch still sets its field to the preset's paper value (``--pre-norm`` absent: post-LN), so that
    a resumed run's own value is taken only where no flag speaks."""
    typed = {f.field: given(flags, f) for f in MODEL_FLAGS}
    changes = {}
    for f in MODEL_FLAGS:
        if f.is_switch:
            changes[f.field] = f.switch_value if typed[f.field] else getattr(DEFAULTS, f.field)
        elif typed[f.field]:
            changes[f.field] = flags[f.dest]
    return changes, typed
