#!/usr/bin/env python3
"""Kernel launches of one training step, counted on the CuPy stand-in: the CPU's proxy for the host's share of a GPU
step (about 20 us of Python and CUDA launch each on the H200, docs/gpu.md).

    python3 bench/gpu_launches.py                    # base's architecture: the eager step and the captured body
    python3 bench/gpu_launches.py --shape quick      # tiny shapes (the acceptance dry run)
    python3 bench/gpu_launches.py --json --top 40    # one JSON line: totals and the launches by kernel or operation

The model is base's (6 + 6 layers, d_model 512, 8 heads, d_ff 2048, vocabulary 16,000, dropout 0.1, label smoothing
0.1), the step bench/gpu_train_step.py's; the batch is small (4 x 16 tokens a side): a launch count does not depend
on the batch's size. numformer runs on the CuPy stand-in (tests/cupy_standin.py, which counts a launch per ufunc
call, reduction, array method or function that writes or makes an array, CuPy matmul's copies of non-contiguous
operands, cuBLAS call and fused kernel) with every fused CUDA kernel on (NUMFORMER_CUDA_UNPROVEN=1) run by the host
emulator (numformer/kernels/cuda_emulator.py). Counted: ``eager`` (the step as Trainer.train_step runs it: forward,
loss, backward, the norm, the read-back, Adam) and ``graph body`` (the step as ``--cuda-graphs`` captures it, on
numformer's own cuBLAS handle: a replay issues it as one graph launch). Needs cupy importable (it knows CuPy's
names) and g++ (the emulator); no GPU.
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "tests", ROOT / "bench"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))
from numformer.cli.arguments import OneLineParser, positive_int  # noqa: E402
from numformer.cli.front import command_line  # noqa: E402

PROG = "bench/gpu_launches.py"
SHAPES = {
    "base": dict(d_model=512, heads=8, layers=6, d_ff=2048, vocab=16000, batch=4, src_len=16, tgt_len=16),
    "quick": dict(d_model=32, heads=2, layers=1, d_ff=64, vocab=100, batch=4, src_len=8, tgt_len=8),
}


def parse_args(argv=None):
    ap = OneLineParser(prog=PROG, description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="base")
    ap.add_argument("--top", type=positive_int, default=25, help="the most frequent launches listed (default 25)")
    ap.add_argument("--plain", action="store_true",
                    help="without the fused CUDA kernels (what a GPU runs until cuda_proofs.json proves them)")
    ap.add_argument("--json", action="store_true")
    return ap.parse_args(argv)


def grouped(counts: collections.Counter) -> dict:
    """Launches by kind: fused kernels (kernel:function), cuBLAS (numformer's handle), CuPy's matmul and its
    operand copies, and CuPy's own elementwise and reduction kernels."""
    kinds = collections.Counter()
    for name, n in counts.items():
        if ":" in name:
            kinds["fused kernels"] += n
        elif name.startswith("cublas"):
            kinds["cuBLAS (numformer's handle)"] += n
        elif name.startswith("matmul"):
            kinds["CuPy matmul and its copies"] += n
        else:
            kinds["CuPy elementwise, reductions, copies"] += n
    return dict(kinds.most_common())


def count(shape: dict, fused: bool = True) -> dict:
    import numpy as np  # noqa: PLC0415
    import pytest  # noqa: PLC0415

    import cupy_standin as cs  # noqa: PLC0415
    from gpu_train_step import _eager_passes  # noqa: PLC0415
    from train_step import benched_model  # noqa: PLC0415
    from numformer.backend import read_scalars, to_xp  # noqa: PLC0415
    from numformer.kernels.cuda_emulator import emulated  # noqa: PLC0415
    from numformer.precision import half_weights  # noqa: PLC0415

    patch = pytest.MonkeyPatch()
    if fused:
        patch.setenv("NUMFORMER_CUDA_UNPROVEN", "1")
    else:
        patch.delenv("NUMFORMER_CUDA_UNPROVEN", raising=False)
    try:
        xp = cs.install(patch)
        model, opt, crit = benched_model(shape, xp)
        rng = np.random.default_rng(0)
        batch = tuple(to_xp(rng.integers(1, shape["vocab"], (shape["batch"], n)), xp)
                      for n in (shape["src_len"], shape["tgt_len"], shape["tgt_len"]))
        result = {}
        with emulated():
            for counted in (False, True):  # the first step compiles every kernel (not counted)
                cs.reset_counts()
                with half_weights(opt.buffer):
                    loss, gnorm = _eager_passes(model, crit, opt, None, *batch)
                read_scalars(xp, loss, gnorm)
                opt.step(zero_grad=True)
            eager = collections.Counter(cs.LAUNCHES)
            result["eager"] = {"total": sum(eager.values()), "by_kind": grouped(eager), "by_name": eager}
            if fused:  # the captured body needs the fused Adam, norm and attention kernels
                body = graph_body_launches(cs, xp, model, opt, crit, batch)
                result["graph body"] = {"total": sum(body.values()), "by_kind": grouped(body), "by_name": body}
        return result
    finally:
        patch.undo()


def graph_body_launches(cs, xp, model, opt, crit, batch) -> collections.Counter:
    """The launches of the body ``--cuda-graphs`` captures (numformer/training/step_graphs.py, rehearsed)."""
    import numpy as np  # noqa: PLC0415

    from gpu_train_step import _host_batch  # noqa: PLC0415
    from numformer.training.step_graphs import StepGraphs  # noqa: PLC0415
    from types import SimpleNamespace  # noqa: PLC0415
    from numformer.training.config import TrainConfig  # noqa: PLC0415
    from numformer.training.distributed import SINGLE  # noqa: PLC0415
    from numformer.training.step_hooks import StepHooks  # noqa: PLC0415

    trainer = SimpleNamespace(xp=xp, model=model, criterion=crit, optimizer=opt, cfg=TrainConfig(), scaler=None,
                              world=SINGLE, hooks=StepHooks(None), grad_stats=None, batch_seeded=False,
                              my_share=lambda batches: list(range(len(batches))), log=lambda *a: None)
    trainer.step_graphs = graphs = StepGraphs(trainer, rehearse=True)
    b = _host_batch(batch)
    graphs.step([b], b.n_tgt_tokens)  # compiles (not counted)
    captured = {}
    real_body = type(next(iter(graphs.steps.values()))).body

    def counted_body(self, bound=False):
        cs.reset_counts()
        real_body(self, bound)
        captured.update(cs.LAUNCHES)
    step = next(iter(graphs.steps.values()))
    step.body = counted_body.__get__(step)
    graphs.step([b], b.n_tgt_tokens)
    assert np.isfinite(graphs.judge((step.loss, step.nll, step.gnorm), b.n_tgt_tokens).loss)
    return collections.Counter(captured)


@command_line(PROG)
def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        import cupy  # noqa: F401,PLC0415  (the stand-in lends only the names cupy has)
    except ImportError as exc:
        print(json.dumps({"status": "skipped", "why": f"cupy is not importable here ({exc})"}) if args.json
              else f"skipped: cupy is not importable here ({exc})")
        return 0
    result = count(SHAPES[args.shape], fused=not args.plain)
    for part in result.values():
        part["by_name"] = dict(part["by_name"].most_common(args.top))
    result["shape"], result["fused_kernels"] = args.shape, not args.plain
    if args.json:
        print(json.dumps(result))
        return 0
    for name in ("eager", "graph body"):
        part = result.get(name)
        if part is None:
            continue
        print(f"{name}: {part['total']} launches a step ({args.shape}, "
              f"{'plain math' if args.plain else 'fused kernels on'})")
        for kind, n in part["by_kind"].items():
            print(f"  {n:6d}  {kind}")
        for launch, n in part["by_name"].items():
            print(f"    {n:6d}  {launch}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
