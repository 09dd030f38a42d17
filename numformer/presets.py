"""Model configurations: the paper's base and big models, Table 3's variants, and CPU presets.

Parameter count (what :func:`count_parameters` computes and the tests check),
with V the vocabulary, d = d_model, h heads, N layers per stack, biases included,
LayerNorm gain and bias counted:

* one attention block: ``d*h*d_k*2 + d*h*d_v + h*d_v*d + 2*h*d_k + h*d_v + d``
* one feed-forward block: ``2*d*d_ff + d_ff + d``
* encoder layer: attention + FFN + 2 LayerNorms (4d); decoder layer: 2 attentions + FFN + 3 LayerNorms (6d)
* embeddings: ``V*d`` once when source, target and pre-softmax weights are tied;
  ``3*V*d`` untied (source and target vocabularies equal); pre-LN adds 2 final LayerNorms (4d).

For base with V = 37,000 this gives 63.1M against the paper's 65M: the paper's
exact vocabulary is not stated, so the tests accept 60M-66M.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

from .errors import UsageError
from .layers.init import DEFAULT_SCHEME, SCHEMES


@dataclass(frozen=True)
class ModelConfig:
    """Every hyper-parameter of the architecture (Section 3 and Table 3).

    vocab_size: shared source/target vocabulary (Section 5.1's shared BPE);
    d_k / d_v default to d_model // heads; pad_id is the padding token id.
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
    ln_eps: float = 1e-5
    pad_id: int = 0
    init: str = DEFAULT_SCHEME  # weight initialisation of the linear maps: one of layers/init.py's SCHEMES

    @property
    def n_decoder_layers(self) -> int:
        return self.layers if self.decoder_layers is None else self.decoder_layers

    @property
    def head_dim_k(self) -> int:
        return self.d_k if self.d_k is not None else self.d_model // self.heads

    @property
    def head_dim_v(self) -> int:
        return self.d_v if self.d_v is not None else self.head_dim_k

    def checked(self) -> "ModelConfig":
        """Refuse, in one line (UsageError), a config the layers cannot be built from; returns self.

        Checked here, up front, so that a bad preset override or an edited run.json fails before any
        layer is built, instead of as a ValueError deep inside a layer constructor."""
        def need(ok, what):
            if not ok:
                raise UsageError(f"model config: {what}")
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
        need(isinstance(self.ln_eps, (int, float)) and self.ln_eps > 0, f"ln_eps must be positive, got {self.ln_eps!r}")
        need(self.init in SCHEMES, f"init must be one of {', '.join(SCHEMES)}, got {self.init!r}")
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
    # CPU presets: "small" is the model of the PyTorch CPU baseline the README compares with.
    "small": _BASE.replace(d_model=256, d_ff=1024, heads=4, layers=3, vocab_size=8000),
    "tiny": _BASE.replace(d_model=128, d_ff=512, heads=4, layers=2, vocab_size=4000),
}

# Table 3 variants: each changes base in the named columns only.
TABLE3: dict[str, tuple[ModelConfig, float]] = {
    "base": (_BASE, 65e6),
    "B_dk16": (_BASE.replace(d_k=16, d_v=64), 58e6),
    "B_dk32": (_BASE.replace(d_k=32, d_v=64), 60e6),
    "C_N2": (_BASE.replace(layers=2), 36e6),
    "C_N4": (_BASE.replace(layers=4), 50e6),
    "C_N8": (_BASE.replace(layers=8), 80e6),
    "C_dmodel256": (_BASE.replace(d_model=256, d_k=32), 28e6),
    "C_dmodel1024": (_BASE.replace(d_model=1024, d_k=128), 168e6),
    "C_dff1024": (_BASE.replace(d_ff=1024), 53e6),
    "C_dff4096": (_BASE.replace(d_ff=4096), 90e6),
    "big": (PRESETS["big"], 213e6),
}


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
    enc = cfg.layers * (attn + ffn + 4 * d)
    dec = cfg.n_decoder_layers * (2 * attn + ffn + 6 * d)
    emb = cfg.vocab_size * d * (1 if cfg.tie_embeddings else 3)
    final = 4 * d if cfg.pre_norm else 0
    return enc + dec + emb + final
