"""Where one beam-search step's time goes, piece by piece, numformer against PyTorch eager on the same weights.

The profile behind docs/speed.md's decoding section. One decoder step of a batch in the middle of a beam
search (``--sentences`` sentences x ``--beam`` hypotheses, ``--cached`` positions already decoded, sources
of ``--source`` tokens) is cut into the pieces both systems compute, and each piece is timed on the same
inputs in numformer (its layers, kernels and cache, as ``numformer.decoding.search.beam_search`` calls
them) and in PyTorch (the reference decoder of ``tests/reference/torch_decode.py``: a fused Q/K/V map,
``F.scaled_dot_product_attention``, ``index_select`` reordering, ``log_softmax`` and ``topk``). Each side
runs in its own child process (PyTorch's OpenMP threads spin after each call and would slow a numformer
call that followed in the same process, as OpenBLAS's would PyTorch's), the two alternating ``--repeat``
times; reported: per piece the median over the runs of each run's median of ``--calls`` calls:

* per decoder layer: the linear maps of the self-attention, of the encoder-decoder attention and the
  feed-forward network; the three LayerNorms; the self-attention over the cached positions; the
  encoder-decoder attention over the source (numformer: a sentence's k queries against its one
  memory; PyTorch: the memory repeated per hypothesis, as its decoder keeps it); the reordering of
  the self-attention cache after a step (each new beam takes its parent's keys and values);
* per step: the output projection; the log-softmax over the vocabulary with the best 2k extensions
  per sentence; and the whole step (``Transformer.decode_step`` against ``TorchDecoder.step``);
* the float32 ``exp`` of a (rows, vocab) array alone, numpy against torch: the instruction set shows
  here first (numpy's float32 exp is not vectorised the same way on every CPU).

The per-step column multiplies a layer's pieces by the number of decoder layers. Weights come from
``--model`` (a run folder or checkpoint) or, without it, a randomly initialised ``--preset``.

    python3 bench/decode_profile.py --model runs/bible-en-es-small
    python3 bench/decode_profile.py --preset small --sentences 115 --cached 30 --repeat 3 --json
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the reference decoder (tests/reference/torch_decode.py)
from numformer.cli.arguments import OneLineParser, positive_int  # noqa: E402  (one-line usage errors)
from numformer.cli.front import command_line  # noqa: E402  (a bug says so; see numformer/cli/front.py)

from thread_env import pin_threads  # noqa: E402  (bench/thread_env.py: before numpy is imported)
from worker_process import run_worker  # noqa: E402  (a worker's failure passed on in its own line)

PROG = "bench/decode_profile.py"  # the name its one-line errors start with
SIDES = ("numformer", "torch")


def parse_args(argv=None):
    ap = OneLineParser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="run folder or checkpoint (default: a random --preset model)")
    ap.add_argument("--preset", default="small", help="model shape without --model (default small)")
    ap.add_argument("--sentences", type=positive_int, default=115, help="sentences in the batch (default 115: about "
                    "4,000 source tokens of bible-en-es, translate.py's batch)")
    ap.add_argument("--beam", type=positive_int, default=4)
    ap.add_argument("--cached", type=positive_int, default=30, help="positions already decoded (default 30)")
    ap.add_argument("--source", type=positive_int, default=36, help="source tokens per sentence (default 36)")
    ap.add_argument("--calls", type=positive_int, default=30, help="timed calls of each side per piece (default 30)")
    ap.add_argument("--threads", type=positive_int, default=2, help="threads of both sides (default 2)")
    ap.add_argument("--repeat", type=positive_int, default=2, help="alternating runs of each side (default 2)")
    ap.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)  # a child process: time this side only
    ap.add_argument("--json", action="store_true")
    return ap.parse_args(argv)


def time_pieces(pieces: dict, calls: int) -> dict:
    """{name: (fn, setup or None)} -> {name: median ms}: each call timed alone after two warm-up calls;
    ``setup`` (untimed) makes the argument of every call."""
    out = {}
    for name, (fn, setup) in pieces.items():
        times = []
        for i in range(calls + 2):
            arg = setup() if setup is not None else None
            t0 = time.perf_counter()
            fn() if arg is None else fn(arg)
            if i >= 2:
                times.append(time.perf_counter() - t0)
        out[name] = round(1e3 * statistics.median(times), 3)
    return out


def run_sides(args, argv) -> tuple[dict, dict]:
    """Each side in its own child process, alternating ``--repeat`` times -> (head, {side: {piece: [ms per run]}})."""
    runs = {side: {} for side in SIDES}
    head = None
    for _ in range(args.repeat):
        for side in SIDES:
            out = run_worker([sys.executable, __file__, *argv, "--side", side, "--json"], f"{side} worker").stdout
            report = json.loads(out)
            head = report["head"]
            for name, ms in report["ms"].items():
                runs[side].setdefault(name, []).append(ms)
    return head, runs


def side_pieces(side: str, args) -> tuple[dict, dict, dict]:
    """The pieces of one side at the batch's state after ``--cached`` steps -> (head, per-layer pieces, per-step
    pieces), each piece ``name: (fn, setup or None)``."""
    import numpy as np  # noqa: PLC0415

    from numformer.checkpoint.trained_model import load_model  # noqa: PLC0415
    from numformer.decoding.search import beam_candidates  # noqa: PLC0415
    from numformer.kernels import kernel  # noqa: PLC0415
    from numformer.layers.attention import attention_forward  # noqa: PLC0415
    from numformer.model import Transformer  # noqa: PLC0415
    from numformer.presets import get_preset  # noqa: PLC0415

    if args.model:
        model = load_model(args.model, None, "cpu")[0]
    else:
        model = Transformer(get_preset(args.preset), seed=0).eval()
    cfg = model.cfg
    rng = np.random.default_rng(0)
    m, k, t_cached, s_len = args.sentences, args.beam, args.cached, args.source
    rows, d, h, vocab, pad = m * k, cfg.d_model, cfg.heads, cfg.vocab_size, cfg.pad_id
    dk = d // h
    src = rng.integers(4, vocab, (m, s_len))
    tokens = rng.integers(4, vocab, rows)
    x = rng.standard_normal((rows, 1, d)).astype(np.float32)        # a sublayer's input
    q = rng.standard_normal((rows, h, 1, dk)).astype(np.float32)    # this step's queries
    origin = rng.integers(0, k, (m, k))                              # each new beam's parent in its sentence
    beam_rows = (np.arange(m)[:, None] * k + origin).reshape(-1)
    logits = rng.standard_normal((rows, vocab)).astype(np.float32) * 3
    scores = np.log(rng.uniform(0.01, 1, (m, k))).astype(np.float32)
    exp_in = logits - logits.max(axis=1, keepdims=True)
    memory, src_mask = model.encode(src)
    head = {"rows": rows, "sentences": m, "beam": k, "cached": t_cached, "source": s_len, "d_model": d, "heads": h,
            "layers": len(model.decoder.layers), "vocab": vocab, "threads": args.threads, "calls": args.calls,
            "repeat": args.repeat}
    names = {"self_maps": "self-attention maps (Q, K, V, O)", "cross_maps": "encoder-decoder maps (Q, O)",
             "ffn": "feed-forward", "norms": "LayerNorm x 3",
             "self_att": f"self-attention over {t_cached} cached positions",
             "cross_att": f"encoder-decoder attention over {s_len} source tokens",
             "reorder": "cache reorder (each beam takes its parent's keys/values)",
             "out": "output projection", "cand": f"log-softmax and best {2 * k} per sentence",
             "exp": f"float32 exp of ({rows}, {vocab})", "step": "whole decoder step"}
    if side == "numformer":
        cache = model.new_decoder_caches(beam=k)
        for pos in range(t_cached):
            model.decode_step(tokens, memory, src_mask, cache, position=pos)
        layer = model.decoder.layers[0]
        att, ln = layer.self_attn, (layer.self_attn_residual.norm, layer.cross_attn_residual.norm,
                                    layer.ffn_residual.norm)
        grouped_q = q.reshape(m, k, h, dk).transpose(0, 2, 1, 3)  # a sentence's k queries meet its one memory
        scale, no_force, exp_out = 1.0 / math.sqrt(dk), np.zeros(m, dtype=bool), np.empty_like(exp_in)
        c0 = cache[0]
        per_layer = {
            "self_maps": (lambda: [lin(x) for lin in (att.w_q, att.w_k, att.w_v, att.w_o)], None),
            "cross_maps": (lambda: [lin(x) for lin in (layer.cross_attn.w_q, layer.cross_attn.w_o)], None),
            "ffn": (lambda: layer.ffn(x), None),
            "norms": (lambda: [n(x) for n in ln], None),
            "self_att": (lambda: kernel(attention_forward)(q, c0.self_attn.k, c0.self_attn.v, None, scale), None),
            "cross_att": (lambda: kernel(attention_forward)(grouped_q, c0.cross_attn.k, c0.cross_attn.v, ~src_mask,
                                                            scale), None),
            "reorder": (lambda: c0.self_attn.take_rows_(beam_rows), None),
        }
        per_step = {
            "out": (lambda: model.logits(x), None),
            "cand": (lambda z: kernel(beam_candidates)(z, scores, 2 * k, pad, 1, 2, no_force),
                     logits.copy),  # the kernel overwrites its input: a fresh copy per call, not timed
            "exp": (lambda: np.exp(exp_in, out=exp_out), None),
            "step": (lambda: model.decode_step(tokens, memory, src_mask, cache, position=t_cached), None),
        }
    else:
        import torch  # noqa: PLC0415
        import torch.nn.functional as F  # noqa: PLC0415

        from reference.torch_decode import TorchDecoder, _log_probs  # noqa: PLC0415

        torch.set_num_threads(args.threads)
        torch.set_grad_enabled(False)
        dec = TorchDecoder.from_numformer(model, torch.float32)
        rep = torch.arange(m).repeat_interleave(k)  # its decoder keeps the memory once per hypothesis
        t_mask = torch.from_numpy(src_mask)[rep]    # True = attend, in both
        state = dec.start(torch.from_numpy(np.ascontiguousarray(memory))[rep], t_mask)
        t_tokens = torch.from_numpy(tokens)
        for pos in range(t_cached):
            dec.step(t_tokens, pos, state)
        tl, tx, tq, t_rows = dec.dec[0], torch.from_numpy(x), torch.from_numpy(q), torch.from_numpy(beam_rows)
        (sk, sv), (ck, cv) = state["self"][0], state["cross"][0]
        t_logits, t_scores = torch.from_numpy(logits), torch.from_numpy(scores)
        t_exp_in = torch.from_numpy(exp_in)
        t_exp_out, eps = torch.empty_like(t_exp_in), dec.arch.ln_eps

        def candidates():
            logp = _log_probs(t_logits, pad, 1).view(m, k, -1)
            return (t_scores[:, :, None] + logp).view(m, -1).topk(2 * k, dim=1)

        per_layer = {
            "self_maps": (lambda: (F.linear(tx, *tl["qkv"]), F.linear(tx, *tl["o"])), None),
            "cross_maps": (lambda: (F.linear(tx, *tl["cq"]), F.linear(tx, *tl["co"])), None),
            "ffn": (lambda: dec._ffn(tl, tx), None),
            "norms": (lambda: [F.layer_norm(tx, (d,), *tl[n], eps) for n in ("n1", "n2", "n3")], None),
            "self_att": (lambda: F.scaled_dot_product_attention(tq, sk, sv), None),
            "cross_att": (lambda: F.scaled_dot_product_attention(tq, ck, cv, attn_mask=t_mask), None),
            "reorder": (lambda: (sk.index_select(0, t_rows), sv.index_select(0, t_rows)), None),
        }
        per_step = {
            "out": (lambda: F.linear(tx[:, 0], dec.out_w), None),
            "cand": (candidates, None),
            "exp": (lambda: torch.exp(t_exp_in, out=t_exp_out), None),
            "step": (lambda: dec.step(t_tokens, t_cached, state), None),
        }
    return head, {names[n]: v for n, v in per_layer.items()}, {names[n]: v for n, v in per_step.items()}


@command_line(PROG)
def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.side is None:
        return report(args, argv)
    pin_threads(args.threads)
    from numformer.kernels.host import tune_host  # noqa: PLC0415

    tune_host(blas=False)  # as translate.py does
    head, per_layer, per_step = side_pieces(args.side, args)
    ms = time_pieces(per_layer, args.calls)
    head["per_layer"] = list(ms)
    ms.update(time_pieces(per_step, args.calls))
    print(json.dumps({"head": head, "ms": ms}))
    return 0


def report(args, argv) -> int:
    """The parent: both sides' runs, then the table (or JSON)."""
    import platform  # noqa: PLC0415

    head, runs = run_sides(args, [a for a in argv if a != "--json"])
    layers = head["layers"]
    table = []
    for name, nf_runs in runs["numformer"].items():
        a, b = statistics.median(nf_runs), statistics.median(runs["torch"][name])
        factor = layers if name in head["per_layer"] else 1
        table.append({"piece": name, "per": "layer" if name in head["per_layer"] else "step",
                      "numformer_ms": a, "torch_ms": b, "numformer_over_torch": round(a / b, 2) if b else None,
                      "numformer_ms_per_step": round(a * factor, 3), "torch_ms_per_step": round(b * factor, 3),
                      "numformer_runs": nf_runs, "torch_runs": runs["torch"][name]})
    head = {k: v for k, v in head.items() if k != "per_layer"}
    head["cpu"] = platform.processor() or platform.machine()
    if args.json:
        print(json.dumps({**head, "pieces": table}, indent=1))
        return 0
    print(f"one beam step: {head['sentences']} sentences x beam {head['beam']} = {head['rows']} rows, "
          f"{head['cached']} cached positions, source {head['source']}; d_model {head['d_model']}, {head['heads']} "
          f"heads, {layers} decoder layers, vocabulary {head['vocab']}; {args.threads} threads; each side in its own "
          f"process, {args.repeat} alternating runs of {args.calls} calls per piece (median of the runs' medians)")
    print(f"{'piece':<58} {'per':>5} {'numformer ms':>13} {'torch ms':>9} {'nf/torch':>9} {'nf ms/step':>11} "
          f"{'torch ms/step':>14}")
    for r in table:
        print(f"{r['piece']:<58} {r['per']:>5} {r['numformer_ms']:>13.3f} {r['torch_ms']:>9.3f} "
              f"{r['numformer_over_torch']:>8.2f}x {r['numformer_ms_per_step']:>11.2f} {r['torch_ms_per_step']:>14.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
