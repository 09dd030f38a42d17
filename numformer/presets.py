"""Model configurations: the paper's base and big models, Table 3's variants, and CPU presets.

Parameter count (what :func:`count_parameters` computes and the tests check),
with V the vocabulary, d = d_model, h heads, N layers per stack, biases included,
LayerNorm gain and bias counted:

* one attention block: ``d*h*d_k*2 + d*h*d_v + h*d_v*d + 2*h*d_k + h*d_v + d``
* one feed-forward block: ``2*d*d_ff + d_ff + d``
* one norm: ``n*d``, n its row's parameters in numformer.norms (LayerNorm's gain and bias: 2d)
* encoder layer: attention + FFN + 2 norms (4d); decoder layer: 2 attentions + FFN + 3 norms (6d)
* embeddings: ``V*d`` once when source, target and pre-softmax weights are tied;
  ``3*V*d`` untied (source and target vocabularies equal); pre-LN adds 2 final norms (4d);
  learned positions (row E) add one ``max_len*d`` table per stack.

Not counted: the frozen logits bias of ``logits_bias=True`` (``final_logits_bias``, V numbers), a buffer that
is saved with the model but never trained (numformer.module), as PyTorch's ``num_parameters`` leaves it out.

For base with V = 37,000 (Section 5.1's "about 37000 tokens") this gives 63.1M against the paper's 65M.
Table 3's parameter column fits V = 41,000: with it every row the paper counts is within the paper's
rounding to 1M (base 65.1, B 58.0 / 60.4, C 35.7 / 50.4 / 79.8 / 27.9 / 168.0 / 52.5 / 90.3) except big,
218.3M against the paper's 213M. That gap is the paper's own: its big is 45M above its d_model-1024 row,
which differs from big only in d_ff 2048 -> 4096, and doubling d_ff in 12 layers adds 2 * 1024 * 2048 * 12
= 50.3M weights, so no one vocabulary reproduces both figures (tests/layers/test_presets.py).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

from .errors import UsageError
from .activations import ACTIVATIONS
from .norms import NORMS
from .layers.init import DEFAULT_SCHEME, SCHEMES


#: The positional encodings ModelConfig.positional names (Section 3.5 and Table 3 row E).
POSITIONAL = ("sinusoidal", "learned")


@dataclass(frozen=True)
class ModelConfig:
    """Every hyper-parameter of the architecture (Section 3 and Table 3).

    vocab_size: shared source/target vocabulary (Section 5.1's shared BPE);
    d_k / d_v default to d_model // heads; pad_id is the padding token id.

    Three fields represent what a Hugging Face ``MarianMTModel`` (opus-mt) computes differently; their defaults
    are the paper's, and a model file written before they existed loads with them:

    * ``activation``: the feed-forward network's, ``"relu"`` (Eq. 2) or another row of
      :data:`numformer.activations.ACTIVATIONS` (``"silu"``, Marian's ``swish``; ``"gelu"``);
    * ``logits_bias``: the model holds a frozen vector ``final_logits_bias`` (vocab,) added to the logits,
      ``logits = h W^T + b``: saved and loaded with the weights, never trained (no gradient, not in
      ``parameters()``);
    * ``pad_row_gradient``: False gives the ``pad_id`` row of the embedding matrix no gradient from the
      lookups (PyTorch's ``nn.Embedding(padding_idx=pad)``); the tied pre-softmax projection still gives it
      its gradient through the logits.

    ``norm``: every residual sub-layer's norm and a pre-LN stack's final ones, ``"layernorm"`` (Section 3.1) or
    another row of :data:`numformer.norms.NORMS`. A model option is a field here with its check, read where it
    matters (a layer's ``from_config``, its table's row), and threaded through no constructor.

    The decoder input starts with a start token, BOS in numformer's vocabularies and pad in Marian's
    (``decoder_start_token_id = pad``): position 0 is never padding-masked (numformer.model.decoder_self_mask),
    so either works without a field.
    """

    vocab_size: int = 37000
    d_model: int = 512
    d_ff: int = 2048
    heads: int = 8
    layers: int = 6
    decoder_layers: int | None = None  # defaults to ``layers``
    d_k: int | None = None
    d_v: int | None = None
    dropout: float = 0.1
    attn_dropout: float = 0.0
    relu_dropout: float = 0.0
    label_smoothing: float = 0.1
    pre_norm: bool = False
    tie_embeddings: bool = True
    max_len: int = 1024
    positional: str = "sinusoidal"  # Section 3.5: "sinusoidal" (the paper's) or "learned" (Table 3 row E)
    ln_eps: float = 1e-5
    pad_id: int = 0
    init: str = DEFAULT_SCHEME  # weight initialisation of the linear maps: one of layers/init.py's SCHEMES
    activation: str = "relu"  # the feed-forward network's: a name of numformer.activations.ACTIVATIONS
    logits_bias: bool = False  # a frozen (vocab,) final_logits_bias added to the logits (Marian's), never trained
    pad_row_gradient: bool = True  # False: embedding lookups give the pad_id row no gradient (padding_idx)
    norm: str = "layernorm"  # every residual sub-layer's norm and the final ones: a name of numformer.norms.NORMS

    @property
    def n_decoder_layers(self) -> int:
        return self.layers if self.decoder_layers is None else self.decoder_layers

    @property
    def head_dim_k(self) -> int:
        return self.d_k if self.d_k is not None else self.d_model // self.heads

    @property
    def head_dim_v(self) -> int:
        return self.d_v if self.d_v is not None else self.head_dim_k

    def checked(self, source: str | None = None) -> "ModelConfig":
        """Refuse, in one line (UsageError), a config the layers cannot be built from; returns self.

        Checked here, up front, so that a bad preset override or an edited run.json fails before any
        layer is built, instead of as a ValueError deep inside a layer constructor. ``source``: the file the
        values were read from (a resumed run's run.json), which the line then names, ``SOURCE's
        model_config.FIELD``, so that the user is sent to that file rather than to a flag never typed."""
        def need(ok, what):  # every ``what`` starts with the field's name
            if not ok:
                raise UsageError(f"{source}'s model_config.{what}: correct it in that file" if source
                                 else f"model config: {what}")
        for name in ("d_model", "d_ff", "heads", "layers"):
            need(isinstance(getattr(self, name), int) and getattr(self, name) >= 1,
                 f"{name} must be a positive integer, got {getattr(self, name)!r}")
        for name in ("decoder_layers", "d_k", "d_v"):
            value = getattr(self, name)
            need(value is None or (isinstance(value, int) and value >= 1),
                 f"{name} must be a positive integer or unset, got {value!r}")
        need(self.d_k is not None or self.d_model % self.heads == 0,
             f"d_model {self.d_model} is not divisible by heads {self.heads}: choose heads that divide it or set d_k")
        need(isinstance(self.vocab_size, int) and self.vocab_size >= 5,
             f"vocab_size must be at least 5 (4 special pieces and one more), got {self.vocab_size!r}")
        need(isinstance(self.pad_id, int) and 0 <= self.pad_id < self.vocab_size,
             f"pad_id {self.pad_id!r} is not an id of the {self.vocab_size}-piece vocabulary")
        for name in ("dropout", "attn_dropout", "relu_dropout", "label_smoothing"):
            value = getattr(self, name)
            need(isinstance(value, (int, float)) and 0 <= value < 1, f"{name} must be in [0, 1), got {value!r}")
        need(isinstance(self.max_len, int) and self.max_len >= 2,
             f"max_len (the positional table) must be at least 2, got {self.max_len!r}")
        need(self.positional in POSITIONAL,
             f"positional must be one of {', '.join(POSITIONAL)}, got {self.positional!r}")
        need(isinstance(self.ln_eps, (int, float)) and self.ln_eps > 0, f"ln_eps must be positive, got {self.ln_eps!r}")
        need(self.init in SCHEMES, f"init must be one of {', '.join(SCHEMES)}, got {self.init!r}")
        need(self.activation in ACTIVATIONS,
             f"activation must be one of {', '.join(ACTIVATIONS)}, got {self.activation!r}")
        need(self.norm in NORMS, f"norm must be one of {', '.join(NORMS)}, got {self.norm!r}")
        for name in ("logits_bias", "pad_row_gradient"):
            need(isinstance(getattr(self, name), bool), f"{name} must be true or false, got {getattr(self, name)!r}")
        return self

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown model config keys: {sorted(unknown)}")
        return cls(**d)

    def replace(self, **changes) -> "ModelConfig":
        return replace(self, **changes)


_BASE = ModelConfig()

PRESETS: dict[str, ModelConfig] = {
    # Table 3, "base": N=6, d_model 512, d_ff 2048, h 8, P_drop 0.1, eps_ls 0.1 (65M)
    "base": _BASE,
    # Table 3, "big": d_model 1024, d_ff 4096, h 16, P_drop 0.3 (213M)
    "big": _BASE.replace(d_model=1024, d_ff=4096, heads=16, dropout=0.3),
    # CPU presets: "small" is the model of the PyTorch CPU baseline the README compares with. How each trains
    # (batches, warmup, rate, checkpoints; for small, as functions of the time budget, with the sweeps'
    # figures behind them): numformer/training/config.py's RECIPES and numformer/training/budget_recipe.py.
    "small": _BASE.replace(d_model=256, d_ff=1024, heads=4, layers=3, vocab_size=8000),
    "tiny": _BASE.replace(d_model=128, d_ff=512, heads=4, layers=2, vocab_size=4000),
}

@dataclass(frozen=True)
class Table3Row:
    """One row of the paper's Table 3 ("Variations on the Transformer architecture", Section 6.2): the base
    model changed in ``changes`` (ModelConfig fields -> values, the paper's columns), trained ``steps``
    steps, and what the paper measured on newstest2013 En-De (beam search, no checkpoint averaging):
    ``ppl`` (per word-piece), ``bleu`` and ``params`` (millions; None where the paper leaves it blank)."""

    name: str
    group: str
    changes: tuple  # ((field, value), ...): the paper's columns that differ from base
    ppl: float
    bleu: float
    params: float | None = None
    steps: int = 100_000

    def _settings(self) -> dict:
        """The row's changes as ModelConfig must be told them: a row that changes d_k alone keeps base's d_v
        (row B leaves the d_v column blank), which ModelConfig, whose d_v follows d_k when unset, is told
        explicitly."""
        changes = dict(self.changes)
        if "d_k" in changes and "d_v" not in changes:
            changes["d_v"] = _BASE.head_dim_v
        return changes

    @property
    def config(self) -> ModelConfig:
        """Base with the row's changes."""
        return _BASE.replace(**self._settings())

    def applied_to(self, base: ModelConfig) -> ModelConfig:
        """The row's change made to another ``base`` (a CPU-sized one): the size columns (N, d_model, d_ff,
        h, d_k, d_v) scaled by the row's ratio to the paper's base (h 1 of base's 8 -> an eighth of
        ``base.heads``), the others (P_drop, eps_ls, positions) set to the row's value. A ratio that leaves
        a fraction (``base.heads`` 4 and row A's h 1) is a UsageError naming the column."""
        changes = {}
        effective = {"d_k": "head_dim_k", "d_v": "head_dim_v"}
        for name, value in self._settings().items():
            if name in SIZE_COLUMNS:
                attr = effective.get(name, name)
                scaled = getattr(base, attr) * value / getattr(_BASE, attr)
                if scaled != int(scaled) or scaled < 1:
                    raise UsageError(f"row {self.name}: {PAPER_COLUMNS[name]} {value} is {value}/{getattr(_BASE, attr)} "
                                     f"of base's, which leaves {scaled:g} of this base's {getattr(base, attr)}: "
                                     "choose a base whose sizes it divides")
                changes[name] = int(scaled)
            else:
                changes[name] = value
        return base.replace(**changes).checked()

    @property
    def label(self) -> str:
        """The row as the paper prints it: ``(A) h 1, d_k 512, d_v 512``."""
        if not self.changes:
            return self.group
        cols = ", ".join(f"{PAPER_COLUMNS[k]} {v}" for k, v in self.changes)
        return f"({self.group}) {cols}" if len(self.group) == 1 else f"{self.group}: {cols}"


#: ModelConfig field -> the paper's name for its column in Table 3 (row E adds the positional encoding).
PAPER_COLUMNS = {"layers": "N", "d_model": "d_model", "d_ff": "d_ff", "heads": "h", "d_k": "d_k", "d_v": "d_v",
                 "dropout": "P_drop", "label_smoothing": "eps_ls", "positional": "positions"}


#: The columns that are sizes: a row's change to them is a ratio when applied to another base.
SIZE_COLUMNS = ("layers", "d_model", "d_ff", "heads", "d_k", "d_v")


def _row(name, group, ppl, bleu, params=None, steps=100_000, **changes) -> Table3Row:
    return Table3Row(name, group, tuple(changes.items()), ppl, bleu, params, steps)


#: Every row of Table 3, in the paper's order, named as its presets are (``train.py --preset A-h1``).
#: Figures from the paper's Table 3 (dev = newstest2013; PPL per word-piece; params x 10^6).
TABLE3: dict[str, Table3Row] = {r.name: r for r in (
    _row("base", "base", 4.92, 25.8, 65),
    _row("A-h1", "A", 5.29, 24.9, heads=1, d_k=512, d_v=512),
    _row("A-h4", "A", 5.00, 25.5, heads=4, d_k=128, d_v=128),
    _row("A-h16", "A", 4.91, 25.8, heads=16, d_k=32, d_v=32),
    _row("A-h32", "A", 5.01, 25.4, heads=32, d_k=16, d_v=16),
    _row("B-dk16", "B", 5.16, 25.1, 58, d_k=16),
    _row("B-dk32", "B", 5.01, 25.4, 60, d_k=32),
    _row("C-N2", "C", 6.11, 23.7, 36, layers=2),
    _row("C-N4", "C", 5.19, 25.3, 50, layers=4),
    _row("C-N8", "C", 4.88, 25.5, 80, layers=8),
    _row("C-dmodel256", "C", 5.75, 24.5, 28, d_model=256, d_k=32, d_v=32),
    _row("C-dmodel1024", "C", 4.66, 26.0, 168, d_model=1024, d_k=128, d_v=128),
    _row("C-dff1024", "C", 5.12, 25.4, 53, d_ff=1024),
    _row("C-dff4096", "C", 4.75, 26.2, 90, d_ff=4096),
    _row("D-drop0.0", "D", 5.77, 24.6, dropout=0.0),
    _row("D-drop0.2", "D", 4.95, 25.5, dropout=0.2),
    _row("D-ls0.0", "D", 4.67, 25.3, label_smoothing=0.0),
    _row("D-ls0.2", "D", 5.47, 25.7, label_smoothing=0.2),
    _row("E-learned", "E", 4.92, 25.7, positional="learned"),
    _row("big", "big", 4.33, 26.4, 213, steps=300_000, d_model=1024, d_ff=4096, heads=16, dropout=0.3),
)}
_BASE_AND_BIG = {"base", "big"}
PRESETS.update({name: row.config for name, row in TABLE3.items() if name not in _BASE_AND_BIG})
assert PRESETS["big"] == TABLE3["big"].config  # one definition of big


def get_preset(name: str, **overrides) -> ModelConfig:
    """The named preset with fields overridden, validated; an unknown name or a config the layers cannot
    be built from gives a one-line UsageError (a ValueError)."""
    if name not in PRESETS:
        raise UsageError(f"unknown preset {name!r}: choose one of {', '.join(PRESETS)}")
    return (PRESETS[name].replace(**overrides) if overrides else PRESETS[name]).checked()


def count_parameters(cfg: ModelConfig) -> int:
    """The closed-form parameter count in this module's docstring (matches Transformer.num_parameters())."""
    d, h, dk, dv, dff = cfg.d_model, cfg.heads, cfg.head_dim_k, cfg.head_dim_v, cfg.d_ff
    attn = 2 * (d * h * dk + h * dk) + (d * h * dv + h * dv) + (h * dv * d + d)
    ffn = 2 * d * dff + dff + d
    norm = len(NORMS[cfg.norm].parameters) * d  # each of the row's parameters a (d,) vector
    enc = cfg.layers * (attn + ffn + 2 * norm)
    dec = cfg.n_decoder_layers * (2 * attn + ffn + 3 * norm)
    emb = cfg.vocab_size * d * (1 if cfg.tie_embeddings else 3)
    final = 2 * norm if cfg.pre_norm else 0
    positions = 2 * cfg.max_len * d if cfg.positional == "learned" else 0  # one table per stack
    return enc + dec + emb + final + positions
