"""Decoding speed of a trained model against PyTorch on the same weights: beam and greedy search,
and the cost of one step by position.

1. Translation throughput: the first ``--sentences`` lines of ``--input`` (default: the
   bible-en-es test source) are encoded with the run's vocabulary and decoded the way
   ``translate.py`` does (length-sorted batches of ``--max-tokens`` source tokens), once
   with beam ``--beam`` (default 4, alpha 0.6) and once greedily. Reported: sentences/s
   and output tokens/s (subword pieces of the best hypothesis, EOS not counted).
   The same weights are loaded into a PyTorch eager decoder (``tests/reference/torch_decode.py``:
   fused Q/K/V, ``F.scaled_dot_product_attention``, a key/value cache, the same search rules,
   the same batches) that runs the same searches right after numformer's; each side's timed search runs in
   a child process of its own (a warm-up on 8 sentences first): the engines' worker threads spin for a while
   after each call and measurably slowed whichever side ran next in a shared process. Reported beside
   numformer's: its sentences/s and tokens/s, the ratio numformer/PyTorch of sentences/s,
   and the share of sentences where both found the same best hypothesis (with ``--dtype
   float64`` at least 99% is expected: a check of the search; in float32 rounding may
   tip near-ties). With references (``--reference``; by default the bible-en-es test target
   when the input is its source), every side's sacreBLEU too: where hypotheses differ
   (CTranslate2's int8, its length penalty), whether the translations got worse.
   CTranslate2 (when the ``ctranslate2`` package is installed; ``--no-ctranslate2`` skips it): the same
   weights exported by numformer's converter (:mod:`numformer.interop.ctranslate2`) into a temporary
   folder, decoded by ``ctranslate2.Translator`` once per ``--ct2-compute-types`` (default float32 and
   int8: weights and activations in 8 bits, quantized on load) right after numformer's run: the same
   length-sorted batches (one ``translate_batch`` call per numformer batch), ``intra_threads`` =
   ``--threads`` (one translation at a time), and numformer's search rules as
   ``numformer_search_options`` gives them to every comparison with the engine (the beam, pad and BOS
   never generated, an empty output allowed, no source cut; docs/interop.md lists each option). Two rules
   cannot be made equal: the length limit is per batch in CTranslate2, so each batch gets numformer's
   limit of its longest sentence (``a * (n + 1) + b`` tokens counting EOS -> ``max_decoding_length`` =
   that - 1, EOS not counted), looser for its shorter sentences; and CTranslate2 divides a beam's
   log-probability by ``length ** length_penalty`` where numformer divides by GNMT's
   ``((5 + length) / 6) ** alpha``: ``length_penalty`` is set to ``--alpha``, the same exponent in
   another form (greedy search has no penalty and should agree but for float32 near-ties). Reported like
   PyTorch's: sentences/s, tokens/s, numformer/CTranslate2 ratio, and the share
   of lines with the same best hypothesis as numformer's, also counted up to numformer's own limit (an
   output numformer cut at its sentence's limit is equal when the engine's longer one starts with it).
2. Cost of one decoder step by position: a batch of ``--step-batch`` sentences is encoded,
   then :meth:`Transformer.decode_step` is fed 101 steps (the greedy token each time);
   ms/step at position 1 and at position 100 (median over ``--step-repeat`` runs) and their
   ratio. The same for an uncached baseline that re-runs the decoder over the whole prefix
   at every step (what the key/value cache saves): its cost grows with the position.

    python bench/decode.py --model runs/bible-en-es-small
    python bench/decode.py --model runs/bible-en-es-small/averaged.npz --sentences 500 --json
    python bench/decode.py --model /tmp/run --input my.src --beam 5 --max-tokens 2000
    python bench/decode.py --model /tmp/run --dtype float64 --sentences 200 --no-uncached
    python bench/decode.py --model runs/reverse-tiny --input my.src --quick     # a small end-to-end check

Threads: ``--threads N`` (default 2) sets OMP/OPENBLAS/MKL_NUM_THREADS and numformer's host
threads before numpy is imported, ``torch.set_num_threads(N)`` and CTranslate2's ``intra_threads``; 0
leaves the environment (and CTranslate2's default).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from thread_env import pin_threads

ROOT = Path(__file__).resolve().parent.parent

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from numformer.cli.arguments import NUMBERS, OneLineParser, nonneg_int, positive_int  # noqa: E402  (one-line usage errors)
from numformer.cli.front import command_line  # noqa: E402  (a bug says so; see numformer/cli/front.py)
from numformer.errors import UsageError  # noqa: E402
from worker_process import run_worker  # noqa: E402  (a worker's failure passed on in its own line)

PROG = "bench/decode.py"  # the name its one-line errors start with


def parse_args(argv=None):
    ap = OneLineParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, metavar="RUN_DIR_or_CHECKPOINT",
                    help="a run folder (averaged.npz or its newest checkpoint) or a checkpoint file")
    ap.add_argument("--vocab", default=None, help="sentencepiece model (default: spm.model of the run)")
    ap.add_argument("--input", default=None, metavar="FILE",
                    help="source sentences, one per line (default: bible-en-es test.src)")
    ap.add_argument("--reference", default=None, metavar="FILE",
                    help="reference lines of --input: sacreBLEU of every side's best hypotheses (default with the "
                         "default input: its test.tgt; 'none' leaves BLEU out)")
    ap.add_argument("--sentences", type=nonneg_int, default=500, help="decode the first N non-empty lines (default 500; 0 = all)")
    ap.add_argument("--beam", type=positive_int, default=4, help="beam size of the beam-search run (default 4)")
    ap.add_argument("--alpha", type=NUMBERS["length penalty"], default=0.6, help="length penalty (default 0.6)")
    ap.add_argument("--max-tokens", type=positive_int, default=4000, help="source tokens per decoding batch (default 4000)")
    ap.add_argument("--no-greedy", dest="greedy", action="store_false", help="skip the greedy run")
    ap.add_argument("--step-batch", type=positive_int, default=64, help="batch size of the per-position timing (default 64)")
    ap.add_argument("--step-positions", type=positive_int, default=100, help="last position timed (default 100)")
    ap.add_argument("--step-repeat", type=positive_int, default=3, help="runs of the per-position timing (default 3)")
    ap.add_argument("--no-uncached", dest="uncached", action="store_false",
                    help="skip the uncached (full prefix re-run) baseline")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: $NUMFORMER_DEVICE or cpu)")
    ap.add_argument("--threads", type=nonneg_int, default=2, help="BLAS/OpenMP, numformer and torch threads (default 2)")
    ap.add_argument("--no-torch", dest="torch", action="store_false", help="skip the PyTorch side")
    ap.add_argument("--no-ctranslate2", dest="ctranslate2", action="store_false",
                    help="skip the CTranslate2 side (it runs when the ctranslate2 package is installed)")
    ap.add_argument("--ct2-compute-types", default="float32,int8", metavar="TYPES",
                    help="CTranslate2 compute types, comma-separated (default float32,int8)")
    ap.add_argument("--quick", action="store_true",
                    help="a small end-to-end check, not a timing: 32 sentences, per-position timing of a batch "
                         "of 8 over 10 positions, once")
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float32",
                    help="both sides compute in this dtype (default float32; float64 checks the search)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    # a child process timing one side's search (run_side): the side, the search's beam, CTranslate2's export
    ap.add_argument("--time-side", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--time-beam", type=positive_int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--ct2-folder", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.quick:
        args.sentences, args.step_batch, args.step_positions, args.step_repeat = 32, 8, 10, 1
    return args


def default_input() -> Path:
    from numformer.data import build_bible_corpus  # noqa: PLC0415

    return Path(build_bible_corpus()) / "test.src"


def make_sync(xp):
    import numpy as np  # noqa: PLC0415

    return (lambda: None) if xp is np else (lambda: xp.cuda.Stream.null.synchronize())


def _speed(best, ids, seconds, beam):
    out_tokens = sum(len(b) for b in best)
    src_tokens = sum(len(s) for s in ids)
    return {"beam": beam, "sentences": len(ids), "seconds": seconds,
            "sentences_per_s": len(ids) / seconds, "output_tokens": out_tokens,
            "output_tokens_per_s": out_tokens / seconds, "source_tokens_per_s": src_tokens / seconds}


def time_search(model, vocab, ids, opts, sync):
    """numformer's search (translate_ids, as translate.py runs it) -> (speed dict, best token lists)."""
    from numformer.decoding.translation import translate_ids  # noqa: PLC0415

    sync()
    t0 = time.perf_counter()
    found = translate_ids(model, ids, vocab.bos_id, vocab.eos_id, opts)
    sync()
    seconds = time.perf_counter() - t0
    best = [hyps[0][0] if hyps else [] for hyps in found]
    return _speed(best, ids, seconds, opts.beam), best


def time_torch_search(dec, vocab, ids, opts):
    """The same search in PyTorch (tests/reference/torch_decode.py) -> (speed dict, best token lists)."""
    from reference import torch_decode  # noqa: PLC0415

    t0 = time.perf_counter()
    found = torch_decode.translate_ids(dec, ids, vocab.bos_id, vocab.eos_id, opts.beam, opts.alpha,
                                       opts.max_len_a, opts.max_len_b, opts.max_tokens)
    seconds = time.perf_counter() - t0
    best = [h.tokens for h in found]
    return _speed(best, ids, seconds, opts.beam), best


def time_ct2_search(translator, vocab, ids, opts, max_len: int):
    """The search in CTranslate2, batch for batch as numformer's (see the module docstring for the length
    limit and the length penalty) -> (speed dict, best token lists)."""
    from numformer.decoding.translation import _batches_by_length  # noqa: PLC0415  (the same batches)
    from numformer.interop.ctranslate2 import ct2_tokens, numformer_search_options  # noqa: PLC0415

    if any(len(s) > max_len - 1 for s in ids):
        raise ValueError("a sentence is longer than the positional table: the bench does not split lines")
    tokens = ct2_tokens(vocab)
    index = {t: i for i, t in enumerate(tokens)}
    pieces = [[tokens[i] for i in s] for s in ids]
    lengths = [len(s) + 1 for s in ids]  # + EOS, as numformer counts the source
    calls, options = [], {}  # each batch's options (numformer's rules, one place for them), built before timing
    for idx in _batches_by_length(lengths, max(1, opts.max_tokens)):
        longest = max(lengths[i] for i in idx)
        # numformer's limit, EOS counted; at least 2: the engine cannot be told to decode no token
        limit = max(2, min(int(opts.max_len_a * longest + opts.max_len_b), max_len))
        if limit not in options:
            options[limit] = numformer_search_options(vocab, max(1, opts.beam), opts.alpha, limit)
        calls.append((idx, options[limit]))
    best = [None] * len(ids)
    t0 = time.perf_counter()
    for idx, batch_options in calls:
        found = translator.translate_batch([pieces[i] for i in idx], **batch_options)
        for i, r in zip(idx, found):
            best[i] = [index[t] for t in r.hypotheses[0]]
    seconds = time.perf_counter() - t0
    return _speed(best, ids, seconds, opts.beam), best


def same_within_limit(best, their_best, ids, opts, max_len: int) -> float:
    """Share of lines whose CTranslate2 hypothesis equals numformer's, up to numformer's own limit: where
    numformer's output was cut by its per-sentence limit (L - 1 tokens, EOS forced at the L-th), the engine's
    (whose per-batch limit may be longer) counts as equal when it starts with it. The difference between
    this share and ``same_hypotheses`` is the per-batch limit's, not the model's."""
    same = 0
    for ours, theirs, src in zip(best, their_best, ids):
        limit = max(1, min(int(opts.max_len_a * (len(src) + 1) + opts.max_len_b), max_len))
        same += ours == (theirs[: limit - 1] if len(ours) == limit - 1 else theirs)
    return same / max(len(ids), 1)


def step_times(model, src, bos_id: int, positions: int, cached: bool, sync):
    """ms of each decoder step 0..positions for the batch ``src`` (greedy tokens fed back)."""
    from numformer.model import causal_mask  # noqa: PLC0415

    xp = model.xp
    memory, src_mask = model.encode(src)
    n = src.shape[0]
    cache = model.new_decoder_caches()
    prefix = xp.full((n, 1), bos_id, dtype=src.dtype)
    out = []
    for t in range(positions + 1):
        sync()
        t0 = time.perf_counter()
        if cached:
            logits = model.decode_step(prefix[:, -1], memory, src_mask, cache, position=t)
        else:  # re-run the decoder over the whole prefix, keep the last position
            y = model.tgt_pos(model.tgt_embed(prefix))
            h = model.decoder(y, memory, causal_mask(t + 1, xp), src_mask)
            logits = model.generator(h[:, -1:, :])[:, 0, :]
        nxt = logits.argmax(axis=1)
        sync()
        out.append((time.perf_counter() - t0) * 1e3)
        prefix = xp.concatenate([prefix, nxt[:, None].astype(prefix.dtype)], axis=1)
    return out


def position_costs(model, src, bos_id: int, positions: int, repeat: int, cached: bool, sync):
    runs = [step_times(model, src, bos_id, positions, cached, sync) for _ in range(max(repeat, 1))]
    per_pos = [statistics.median(r[t] for r in runs) for t in range(positions + 1)]
    first, last = per_pos[1], per_pos[positions]
    window = per_pos[max(positions - 4, 1): positions + 1]
    return {"ms_at_1": first, f"ms_at_{positions}": last, "ratio": last / first,
            f"ms_mean_{max(positions - 4, 1)}_{positions}": statistics.fmean(window),
            "ms_total": sum(per_pos)}


def _has(package: str) -> bool:
    import importlib.util  # noqa: PLC0415

    return importlib.util.find_spec(package) is not None


def run_side(child_argv: list, side: str, beam: int):
    """One side's timed search in a child process of its own (other engines' threads, which spin after their
    calls, would slow it in a shared process) -> (speed dict with its backend, best token lists)."""
    out = run_worker([sys.executable, __file__, *child_argv, "--time-side", side, "--time-beam", str(beam)],
                     f"{side} worker")
    report = json.loads(out.stdout.strip().splitlines()[-1])
    return report["speed"], report["best"]


def time_side(args, model, vocab, ids, opts, sync) -> dict:
    """A child's work: a warm-up on 8 sentences (not counted), then the timed search of ``args.time_side``
    -> {"speed": speed dict with "backend", "best": best token lists}."""
    side = args.time_side
    if side == "numformer":
        from numformer.backend import describe  # noqa: PLC0415

        time_search(model, vocab, ids[:8], opts, sync)
        speed, best = time_search(model, vocab, ids, opts, sync)
        speed["backend"] = describe(model.xp)
    elif side == "torch":
        import torch  # noqa: PLC0415

        from reference.torch_decode import TorchDecoder  # noqa: PLC0415

        if args.threads:
            torch.set_num_threads(args.threads)
        dec = TorchDecoder.from_numformer(model, getattr(torch, args.dtype))
        time_torch_search(dec, vocab, ids[:8], opts)
        speed, best = time_torch_search(dec, vocab, ids, opts)
        speed["backend"] = f"torch {torch.__version__}, {torch.get_num_threads()} threads, eager"
    else:
        import ctranslate2  # noqa: PLC0415

        compute_type = side.split(":", 1)[1]
        device = "cpu" if args.device in (None, "cpu") else "cuda"
        translator = ctranslate2.Translator(args.ct2_folder, device=device, compute_type=compute_type,
                                            intra_threads=args.threads, inter_threads=1)
        time_ct2_search(translator, vocab, ids[:8], opts, model.cfg.max_len)
        speed, best = time_ct2_search(translator, vocab, ids, opts, model.cfg.max_len)
        speed["backend"] = (f"ctranslate2 {ctranslate2.__version__}, {device}, intra_threads "
                            f"{args.threads or 'default'}, compute type {compute_type} ({translator.compute_type})")
    return {"speed": speed, "best": best}


@command_line(PROG)
def main(argv=None) -> int:
    args = parse_args(argv)
    pin_threads(args.threads)
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "tests"))  # the reference decoder (tests/reference/)
    from numformer.kernels.host import tune_host  # noqa: PLC0415

    tune_host(blas=False)  # as translate.py does
    from numformer.backend import describe  # noqa: PLC0415
    from numformer.checkpoint.trained_model import load_model  # noqa: PLC0415
    from numformer.decoding.translation import DecodeOptions, clean_output, score_translations, source_batch  # noqa: PLC0415,E501

    # the input first: nothing to decode is said before a model is loaded
    src_path = Path(args.input) if args.input else default_input()
    all_lines = src_path.read_text(encoding="utf-8").splitlines()
    kept = [i for i, ln in enumerate(all_lines) if ln.strip()]
    if not kept:
        raise UsageError(f"{src_path} has no non-empty line, so nothing to decode: give --input a file of source "
                         "sentences, one per line")
    if args.sentences > 0:
        kept = kept[: args.sentences]
    lines = [all_lines[i] for i in kept]
    model, vocab, path = load_model(args.model, args.vocab, args.device)
    xp = model.xp
    ct2_dir = tempfile.TemporaryDirectory(prefix="bench_decode_ct2_") if args.time_side is None else None
    ct2_types = []
    if args.time_side is None and args.ctranslate2 and _has("ctranslate2"):
        # exported before a float64 cast: the weights as trained, float32; each child loads its translator
        from numformer.interop.ctranslate2 import export_model  # noqa: PLC0415

        ct2_folder = str(export_model(model, vocab, Path(ct2_dir.name) / "ct2"))
        ct2_types = [c for c in args.ct2_compute_types.split(",") if c]
    if args.dtype == "float64":
        model.to(xp, xp.float64)
    sync = make_sync(xp)
    ids = vocab.encode(lines)
    warm = DecodeOptions(beam=args.beam, alpha=args.alpha, max_tokens=args.max_tokens)
    searches = [warm] + ([DecodeOptions(beam=1, max_tokens=args.max_tokens)] if args.greedy else [])
    if args.time_side is not None:  # a child: one side, one search, then the JSON line
        opts = next(o for o in searches if o.beam == args.time_beam)
        print(json.dumps(time_side(args, model, vocab, ids, opts, sync)))
        return 0
    reference = args.reference or (None if args.input else str(src_path.with_suffix(".tgt")))
    refs = None
    if reference and reference != "none":
        all_refs = Path(reference).read_text(encoding="utf-8").splitlines()
        refs = [all_refs[i] for i in kept]
    cfg = model.cfg
    result = {"model": str(path), "input": str(src_path), "backend": describe(xp), "dtype": args.dtype,
              "config": {"d_model": cfg.d_model, "heads": cfg.heads, "layers": cfg.layers, "d_ff": cfg.d_ff,
                         "vocab": cfg.vocab_size},
              "threads": os.environ.get("OMP_NUM_THREADS"), "max_tokens": args.max_tokens,
              "sides": "each side's run in its own process, one after the other", "search": []}

    def add_bleu(speed, best_ids):  # the side's best hypotheses, detokenised, against the references
        if refs is not None:
            speed["bleu"] = score_translations([clean_output(t) for t in vocab.decode(best_ids)], refs)["bleu"]

    child_argv = [a for a in (sys.argv[1:] if argv is None else list(argv)) if a != "--json"]
    ct2_backends = {}  # compute type -> the engine as its child described it
    for opts in searches:
        ours, best = run_side(child_argv, "numformer", opts.beam)
        add_bleu(ours, best)
        if args.torch:  # right after numformer's run, on the same weights and batches
            theirs, their_best = run_side(child_argv, "torch", opts.beam)
            result["torch_backend"] = theirs.pop("backend")
            add_bleu(theirs, their_best)
            ours["torch"] = theirs
            ours["ratio_sentences_per_s"] = ours["sentences_per_s"] / theirs["sentences_per_s"]
            ours["same_hypotheses"] = sum(a == b for a, b in zip(best, their_best)) / max(len(ids), 1)
        for ct in ct2_types:  # right after numformer's run too, the same batches
            theirs, their_best = run_side(child_argv + ["--ct2-folder", ct2_folder], f"ctranslate2:{ct}", opts.beam)
            ct2_backends[ct] = theirs.pop("backend")
            add_bleu(theirs, their_best)
            theirs["ratio_sentences_per_s"] = ours["sentences_per_s"] / theirs["sentences_per_s"]
            theirs["same_hypotheses"] = sum(a == b for a, b in zip(best, their_best)) / max(len(ids), 1)
            theirs["same_within_limit"] = same_within_limit(best, their_best, ids, opts, cfg.max_len)
            ours.setdefault("ctranslate2", {})[ct] = theirs
        ours.pop("backend", None)
        result["search"].append(ours)
    if ct2_backends:
        result["ctranslate2_backend"] = "; ".join(ct2_backends.values())
    time_search(model, vocab, ids[:8], warm, sync)  # the per-position timing's warm-up (allocator, BLAS threads)

    limit = cfg.max_len - 1
    positions = min(args.step_positions, limit)
    batch = [s[: 60] for s in ids[: args.step_batch]]
    src = xp.asarray(source_batch(batch, cfg.pad_id, vocab.eos_id))
    step = {"batch": len(batch), "positions": positions, "repeat": args.step_repeat}
    step_times(model, src, vocab.bos_id, 3, True, sync)  # warm-up
    step["cached"] = position_costs(model, src, vocab.bos_id, positions, args.step_repeat, True, sync)
    if args.uncached:
        step["uncached"] = position_costs(model, src, vocab.bos_id, positions, args.step_repeat, False, sync)
    result["per_position"] = step

    if args.json:
        print(json.dumps(result))
        return
    print(f"model {result['model']} (d={cfg.d_model} h={cfg.heads} N={cfg.layers} d_ff={cfg.d_ff} "
          f"V={cfg.vocab_size}), {result['backend']}, threads {result['threads'] or 'default'}")
    print(f"input {src_path}: {len(ids)} sentences, batches of {args.max_tokens} source tokens, {args.dtype}"
          + (f"; sacreBLEU against {reference}" if refs is not None else "")
          + (f"; PyTorch: {result['torch_backend']}" if "torch_backend" in result else ""))
    if ct2_backends:
        print(f"CTranslate2: {result['ctranslate2_backend']}; the batches' limit is their longest sentence's, "
              f"length_penalty {args.alpha} divides by length^alpha (numformer: ((5 + length) / 6)^alpha)")
    for r in result["search"]:
        name = f"beam {r['beam']}" if r["beam"] > 1 else "greedy"
        rows = [("numformer", r)] + ([("pytorch", r["torch"])] if "torch" in r else [])
        rows += [(f"ct2 {ct}", x) for ct, x in r.get("ctranslate2", {}).items()]
        for side, x in rows:
            print(f"  {name:8s} {side:13s} {x['seconds']:7.2f} s  {x['sentences_per_s']:7.1f} sentences/s  "
                  f"{x['output_tokens_per_s']:8.0f} target tokens/s  ({x['output_tokens']} tokens)"
                  + (f"  BLEU {x['bleu']:.2f}" if "bleu" in x else ""))
        if "torch" in r:
            print(f"  {name:8s} ratio numformer/pytorch {r['ratio_sentences_per_s']:.2f}x sentences/s; "
                  f"same best hypothesis on {100 * r['same_hypotheses']:.1f}% of the lines")
        for ct, x in r.get("ctranslate2", {}).items():
            print(f"  {name:8s} ratio numformer/ct2 {ct} {x['ratio_sentences_per_s']:.2f}x sentences/s; "
                  f"same best hypothesis on {100 * x['same_hypotheses']:.1f}% of the lines "
                  f"({100 * x['same_within_limit']:.1f}% up to numformer's own length limit)")
    print(f"decode_step, batch {step['batch']}, median of {step['repeat']} runs:")
    for kind in ("cached", "uncached"):
        if kind in step:
            c = step[kind]
            print(f"  {kind:8s} position 1: {c['ms_at_1']:7.2f} ms/step  position {positions}: "
                  f"{c[f'ms_at_{positions}']:7.2f} ms/step  ratio {c['ratio']:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
