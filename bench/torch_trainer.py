#!/usr/bin/env python3
"""train.py with the training step computed by PyTorch at its best: the reference side of a race at equal budgets.

Everything around the step is train.py's own flow (``train.train_with``): the same flags and presets, the
same corpus preparation and vocabulary, the same batches (``EpochWalk``: token-bucketed, the same seed and
order), the same Eq. 3 schedule, the same clock (the budget counts training steps only), checkpoints,
averaging of the last checkpoints, the length penalty chosen on the validation split, and numformer's beam
search on the test set. Only :meth:`TorchStepTrainer.train_step` differs: the model's weights live in a
PyTorch module written the way a user would for speed in eager mode (``tests/reference/torch_reference.py``
``TorchTransformer`` with ``FusedMHA``: one fused Q/K/V in-projection, ``F.scaled_dot_product_attention``),
the label-smoothed loss is one ``log_softmax`` read twice (as ``F.cross_entropy(label_smoothing=)`` does),
and the update is ``torch.optim.Adam(fused=True)`` (``foreach`` where the fused kernel is missing) with
betas (0.9, 0.98), eps 1e-9 and Eq. 3's learning rate set before each step.

The PyTorch model starts from the numformer model's initial weights (same seed, same initialisation) and
its weights are copied back into the numformer model whenever the flow reads them during training (checkpoints,
validation) and once at its end, so checkpoints, ``averaged.npz`` and ``translate.py --model RUN`` work on its run folder as on any
other. Its checkpoints carry no Adam state of their own (``--resume`` is refused).

    python3 bench/torch_trainer.py --corpus bible-en-es --max-minutes 50 --out runs/bible-torch
    python3 bench/torch_trainer.py --task reverse --preset tiny --max-steps 300 --out /tmp/reverse-torch

bench/budget_race.py runs train.py for T minutes and this for k x T on the same data, one after the other.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the PyTorch model (tests/reference/torch_reference.py)

import train  # noqa: E402  (train.py's flow; it tunes the host before numpy loads)
from numformer.cli.front import command_line  # noqa: E402  (a bug says so; see numformer/cli/front.py)
from numformer.errors import UsageError  # noqa: E402

PROG = "bench/torch_trainer.py"  # the name its one-line errors start with

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from numformer.training.step_hooks import StepResult, StepStatus  # noqa: E402
from numformer.training.trainer import Trainer  # noqa: E402
from reference.torch_reference import FusedMHA, TorchTransformer, fast_adam  # noqa: E402

#: numformer's name of each attention's residual LayerNorm, by the PyTorch layer's norm attribute.
ENCODER_NORMS = {"n1": "self_attn_residual", "n2": "ffn_residual"}
DECODER_NORMS = {"n1": "self_attn_residual", "n2": "cross_attn_residual", "n3": "ffn_residual"}
NO_RESUME = ("the PyTorch side does not resume (its checkpoints hold no PyTorch Adam state): start a new run with a "
             "new --out")


def check_architecture(cfg) -> None:
    """The PyTorch model is the paper's base architecture family (post-LN, tied embeddings, sinusoids, ReLU,
    d_k = d_model / h, no attention or ReLU dropout, as many decoder as encoder layers): one line otherwise."""
    odd = [name for name, ok in (
        ("--pre-norm", not cfg.pre_norm), ("--untied", cfg.tie_embeddings),
        ("--positional learned", cfg.positional == "sinusoidal"),
        (f"the {cfg.activation} activation", cfg.activation == "relu"),
        ("a logits bias", not cfg.logits_bias), ("attention dropout", not cfg.attn_dropout),
        ("ReLU dropout", not cfg.relu_dropout), ("d_k other than d_model / heads",
                                                 cfg.head_dim_k * cfg.heads == cfg.d_model == cfg.head_dim_v * cfg.heads),
        ("a decoder depth other than the encoder's", cfg.n_decoder_layers == cfg.layers),
        ("a pad row without gradient", cfg.pad_row_gradient)) if not ok]
    if odd:
        raise UsageError(f"the PyTorch side trains the paper's architecture only: leave out {', '.join(odd)}")


def torch_model_for(cfg) -> TorchTransformer:
    """The PyTorch model of a numformer ModelConfig (weights to be copied in with :func:`load_into_torch`)."""
    check_architecture(cfg)
    return TorchTransformer(cfg.vocab_size, cfg.d_model, cfg.heads, cfg.layers, cfg.d_ff, cfg.dropout,
                            max_len=cfg.max_len, pad_id=cfg.pad_id, attn=FusedMHA)


def weight_map(cfg) -> list[tuple[str, tuple[str, ...], bool]]:
    """Every PyTorch parameter as ``(its name, the numformer arrays stacked into it along axis 0, whether each is
    transposed)``: nn.Linear keeps (d_out, d_in) where numformer keeps (d_in, d_out), and one in-projection holds
    Q, K and V as ``nn.MultiheadAttention`` does."""
    out = [("embed", ("src_embed.weight",), False)]
    layers = [(f"encoder.layers.{i}", f"enc.{i}", (("self_attn", "attn"),), ENCODER_NORMS) for i in range(cfg.layers)]
    layers += [(f"decoder.layers.{i}", f"dec.{i}", (("self_attn", "self_attn"), ("cross_attn", "cross_attn")),
                DECODER_NORMS) for i in range(cfg.n_decoder_layers)]
    for nf, pt, attentions, norms in layers:
        for a_nf, a_pt in attentions:
            for x, linear in (("weight", True), ("bias", False)):
                out.append((f"{pt}.{a_pt}.in_proj.{x}", tuple(f"{nf}.{a_nf}.w_{q}.{x}" for q in "qkv"), linear))
                out.append((f"{pt}.{a_pt}.w_o.{x}", (f"{nf}.{a_nf}.w_o.{x}",), linear))
        for w in ("w_1", "w_2"):
            for x, linear in (("weight", True), ("bias", False)):
                out.append((f"{pt}.ffn.{w}.{x}", (f"{nf}.ffn.{w}.{x}",), linear))
        for n_pt, n_nf in norms.items():
            for x in ("weight", "bias"):
                out.append((f"{pt}.{n_pt}.{x}", (f"{nf}.{n_nf}.norm.{x}",), False))
    return out


def numformer_to_torch(cfg, state: dict) -> dict:
    """numformer's state dict -> the PyTorch model's arrays (:func:`weight_map`)."""
    return {name: np.concatenate([state[n].T if transposed else state[n] for n in parts], 0)
            for name, parts, transposed in weight_map(cfg)}


def torch_to_numformer(cfg, state: dict) -> dict:
    """The inverse of :func:`numformer_to_torch`: the PyTorch model's arrays under numformer's names and layout."""
    out = {}
    for name, parts, transposed in weight_map(cfg):
        for n, a in zip(parts, np.split(state[name], len(parts), axis=0)):
            out[n] = a.T if transposed else a
    return out


def load_into_torch(module, cfg, state: dict) -> None:
    """Copy numformer arrays into the PyTorch module (every parameter, none left over)."""
    arrays = numformer_to_torch(cfg, state)
    params = dict(module.named_parameters())
    if set(arrays) != set(params):
        raise RuntimeError(f"bug: weight names differ: {sorted(set(arrays) ^ set(params))[:4]}")
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(torch.from_numpy(np.ascontiguousarray(arrays[name])).to(p.dtype))


def torch_state(module) -> dict:
    """The PyTorch module's parameters as host numpy arrays."""
    return {n: p.detach().cpu().numpy() for n, p in module.named_parameters()}


def label_smoothed_sum(logits, target, eps: float, pad_id: int):
    """(loss sum, NLL sum) over the non-pad targets: ``(1 - eps) NLL + eps mean_v(-log p_v)`` per token (Section
    5.4; eps spread over all V classes as numformer's loss and ``F.cross_entropy(label_smoothing=)`` do), from
    one ``log_softmax``."""
    logp = F.log_softmax(logits.reshape(-1, logits.shape[-1]), dim=-1)
    target = target.reshape(-1)
    keep = target != pad_id
    nll = -logp.gather(1, target[:, None])[:, 0]
    smooth = -logp.mean(dim=1)
    return (((1.0 - eps) * nll + eps * smooth) * keep).sum(), (nll * keep).sum().detach()


class TorchStepTrainer(Trainer):
    """numformer's :class:`~numformer.training.trainer.Trainer` whose step runs in PyTorch (see the module
    docstring): the loop, the batches, the clock and the run folder are the parent's."""

    def __init__(self, model, data, cfg, out, **kw):
        super().__init__(model, data, cfg, out, **kw)
        torch.manual_seed(cfg.seed)  # dropout masks: PyTorch's generator, seeded as numformer's is
        self.torch_model = torch_model_for(model.cfg)
        load_into_torch(self.torch_model, model.cfg, model.state_dict())
        self.torch_model.train()
        params = list(self.torch_model.parameters())
        self.torch_optimizer, self.adam_kind = fast_adam(params, lr=self.schedule(1), betas=(0.9, 0.98), eps=1e-9)
        self.log(f"{PROG}: the step in PyTorch {torch.__version__} ({torch.get_num_threads()} threads, "
                 f"scaled_dot_product_attention, Adam {self.adam_kind})")

    def train_step(self, batches, keys=None) -> StepResult:
        """One optimizer step in PyTorch over ``batches``: per batch forward, loss divided by the target tokens of
        the whole step, backward; then the global gradient norm (clipped when ``clip_norm``), Eq. 3's rate and
        one Adam step. A non-finite loss or norm drops the step, as numformer's does."""
        model, cfg = self.torch_model, self.model.cfg
        n_tokens = sum(b.n_tgt_tokens for b in batches)
        loss = nll = 0.0
        for b in batches:
            logits = model(torch.from_numpy(b.src), torch.from_numpy(b.tgt_in))
            batch_loss, batch_nll = label_smoothed_sum(logits, torch.from_numpy(b.tgt_out), cfg.label_smoothing,
                                                       cfg.pad_id)
            (batch_loss / n_tokens).backward()
            loss, nll = loss + batch_loss.item() / n_tokens, nll + batch_nll.item()
        clip = self.cfg.clip_norm if self.cfg.clip_norm > 0 else math.inf
        gnorm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip, foreach=True))
        if not (math.isfinite(loss) and math.isfinite(gnorm)):
            self.torch_optimizer.zero_grad(set_to_none=True)
            return StepResult(loss, nll, n_tokens, gnorm, StepStatus.NONFINITE)
        for group in self.torch_optimizer.param_groups:
            group["lr"] = self.schedule(self.optimizer.step_count + 1)
        self.torch_optimizer.step()
        self.torch_optimizer.zero_grad(set_to_none=True)
        self.optimizer.step_count += 1  # the loop's step counter (numformer's Adam holds it; its update is unused)
        return StepResult(loss, nll, n_tokens, gnorm, StepStatus.OK)

    def sync_weights(self) -> None:
        """Copy the PyTorch weights into the numformer model, which checkpoints, validates and translates."""
        self.model.load_state_dict(torch_to_numformer(self.model.cfg, torch_state(self.torch_model)))

    def save(self):
        self.sync_weights()
        return super().save()

    def validate(self) -> dict:
        """Validation during training: of the PyTorch weights. (Not :meth:`evaluate`: after training the flow
        loads the averaged checkpoint into the numformer model and evaluates that, which a copy would overwrite.)"""
        self.sync_weights()
        return super().validate()

    def train(self) -> dict:
        record = super().train()
        self.sync_weights()
        return record

    def resume(self) -> bool:
        raise UsageError(NO_RESUME)


@command_line(PROG)
def main(argv=None) -> int:
    """train.py's flow with :class:`TorchStepTrainer`; ``--out`` is required (so that no numformer run folder of
    train.py's default name is taken over)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not any(a == "--out" or a.startswith("--out=") for a in args) and not {"-h", "--help"} & set(args):
        raise UsageError("give --out RUN, a run folder of its own (train.py's default names numformer's runs)")
    if "--resume" in args:  # before a folder is opened: a refusal leaves everything as it was
        raise UsageError(NO_RESUME)
    return train.train_with(TorchStepTrainer, args, prog=PROG)


if __name__ == "__main__":
    sys.exit(main())
