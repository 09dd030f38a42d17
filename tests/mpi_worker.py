"""A small data-parallel training run for tests/training/test_distributed.py: ``mpirun -n K python tests/mpi_worker.py ...``
or plain ``python tests/mpi_worker.py ...`` (one process).

Trains a small Transformer on random in-memory sentence pairs (no vocabulary, no files to read) with
:class:`numformer.training.trainer.Trainer` in the world :func:`numformer.training.distributed.init_world` finds, then
every rank writes its parameters, Adam moments and step to ``OUT/rank<r>.npz`` so the test can compare
ranks with each other and with a one-process run.

``--signal-at S --signal-rank R``: rank R sends itself SIGTERM while computing step S (a stop asked of
one rank only); ``--max-minutes``: a time budget, decided by rank 0's clock.
"""
import argparse
import signal
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from numformer.backend import to_host  # noqa: E402
from numformer.kernels.host.threads import set_num_threads  # noqa: E402
from numformer.training.distributed import init_world  # noqa: E402
from numformer.model import Transformer  # noqa: E402
from numformer.data.prepared_dataset import PreparedData  # noqa: E402
from numformer.presets import get_preset  # noqa: E402
from numformer.training.config import TrainConfig  # noqa: E402
from numformer.training.trainer import Trainer  # noqa: E402

VOCAB = 40


class TinyVocab:
    """What the trainer needs of a vocabulary: sizes, special ids and bytes to fingerprint."""

    size, pad_id, unk_id, bos_id, eos_id = VOCAB, 0, 1, 2, 3

    def to_bytes(self) -> bytes:
        return b"mpi_worker vocabulary"


def pairs(n: int, seed: int = 0):
    """n random (source, reversed source) id sequences of 2-12 tokens."""
    rng = np.random.default_rng(seed)
    src = [rng.integers(4, VOCAB, size=int(rng.integers(2, 13))).tolist() for _ in range(n)]
    return src, [s[::-1] for s in src]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--accum", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=300)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--max-minutes", type=float)
    ap.add_argument("--signal-at", type=int)
    ap.add_argument("--signal-rank", type=int, default=1)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--save-every", type=int, default=0)
    ap.add_argument("--untied", action="store_true")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--loss-scale", type=float, help="the fp16 loss scaler's starting scale")
    ap.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    args = ap.parse_args(argv)
    set_num_threads(1)  # the same arithmetic in every process, whatever the core count
    world = init_world(args.device)
    out = Path(args.out)
    cfg = get_preset("tiny", vocab_size=VOCAB, d_model=32, d_ff=64, heads=4, layers=2, dropout=args.dropout,
                     tie_embeddings=not args.untied)
    model = Transformer(cfg, seed=5, dtype=np.dtype(args.dtype).type).to(world.device if world.parallel else args.device)
    data = PreparedData(TinyVocab(), {}, {"train": pairs(400)}, "task:worker")
    tcfg = TrainConfig(max_tokens=args.max_tokens, accum=args.accum, warmup=4, max_steps=args.steps,
                       max_minutes=args.max_minutes, save_every=args.save_every, keep_last=20, average_last=2,
                       eval_every=0, log_every=1, seed=7, dropout_rng="batch", precision=args.precision)
    if args.max_minutes is not None:
        tcfg.max_steps = None
    trainer = Trainer(model, data, tcfg, out, progress=False, world=world)
    if args.loss_scale is not None:
        trainer.scaler.scale = args.loss_scale
    if args.resume:
        trainer.resume()
    if args.signal_at is not None and world.rank == args.signal_rank:
        step_fn = trainer.train_step

        def train_step(*a, **k):
            if trainer.optimizer.step_count + 1 == args.signal_at:
                signal.raise_signal(signal.SIGTERM)
            return step_fn(*a, **k)

        trainer.train_step = train_step
    trainer.train()
    opt = trainer.optimizer
    model.eval()  # what the trained model computes, on a fixed batch: logits (B, T, V)
    src, tgt = pairs(8, seed=99)
    from numformer.data import TokenPairs  # noqa: PLC0415

    probe = TokenPairs.from_lists(src, tgt).batch(np.arange(len(src)), 0, 2, 3)
    logits = to_host(model(probe.src, probe.tgt_in))
    arrays = {f"param/{n}": to_host(p.data) for n, p in model.named_parameters()}
    arrays.update({f"m/{i}": to_host(a) for i, a in enumerate(opt.m)})
    arrays.update({f"v/{i}": to_host(a) for i, a in enumerate(opt.v)})
    np.savez(out / f"rank{world.rank}.npz", step=opt.step_count, interrupted=trainer.interrupted,
             elapsed=trainer.elapsed, size=world.size, epoch=trainer.epoch, batch_pos=trainer.batch_pos,
             logits=logits, loss_scale=trainer.scaler.scale if trainer.scaler is not None else 0.0,
             overflow_steps=trainer.scaler.skipped_steps if trainer.scaler is not None else 0, **arrays)
    world.barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
