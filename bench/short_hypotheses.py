"""Why a trained model's translations come out short: length by source length, the length penalty, the
end-of-sentence probability where the reference ends, and the averaged checkpoints against the last one.

For a run folder and a split of its corpus (source and reference lines), one beam search keeps every finished
hypothesis (beam 4, alpha 0; numformer/decoding/valid_choice.py), re-ranked for each alpha: the exact result of
a beam search with that alpha. Reported:

* per alpha: sacreBLEU, its brevity penalty, and the length ratio (hypothesis / reference words) in four
  buckets of source length (subword tokens: up to 15, 16-30, 31-50, more);
* the model's end-of-sentence probability under teacher forcing on the references: at the position where the
  reference ends (where EOS is right), and its mean over the positions before (where EOS ends a hypothesis
  too early), with the share of sentences whose most probable token at some position before the end is EOS;
* with ``--last``: the same BLEU and brevity penalty for the run's newest checkpoint, against its average.

    python3 bench/short_hypotheses.py --run runs/bible-en-es --source test.src --reference test.tgt
    python3 bench/short_hypotheses.py --run RUN --source S --reference R --sentences 500 --last --json
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from numformer.cli.arguments import OneLineParser, positive_int  # noqa: E402  (one-line usage errors)
from numformer.cli.front import command_line  # noqa: E402  (a bug says so; see numformer/cli/front.py)
from numformer.errors import UsageError  # noqa: E402

PROG = "bench/short_hypotheses.py"  # the name its one-line errors start with

import numpy as np  # noqa: E402

from numformer import run_file_names  # noqa: E402
from numformer.checkpoint.trained_model import load_model  # noqa: E402
from numformer.data import read_lines  # noqa: E402
from numformer.data.batching import pad_rows  # noqa: E402
from numformer.decoding.search import log_softmax  # noqa: E402
from numformer.decoding.translation import source_batch  # noqa: E402
from numformer.decoding.valid_choice import bleu_figures, finished_hypotheses, texts_under  # noqa: E402

ALPHAS = (0.6, 1.0, 1.2, 1.5)
BUCKETS = ((1, 15), (16, 30), (31, 50), (51, 10**9))


def _ratios(hyps, refs, src_len) -> dict:
    """Hypothesis / reference words per bucket of source length."""
    out = {}
    for lo, hi in BUCKETS:
        idx = [i for i, n in enumerate(src_len) if lo <= n <= hi]
        if idx:
            h = sum(len(hyps[i].split()) for i in idx)
            r = sum(len(refs[i].split()) for i in idx)
            out[f"{lo}-{hi if hi < 10**9 else ''}"] = {"sentences": len(idx), "ratio": round(h / max(r, 1), 4)}
    return out


def decode_every_alpha(model, vocab, src_ids, refs) -> dict:
    found = finished_hypotheses(model, vocab, src_ids, beam=4)
    src_len = [len(s) for s in src_ids]
    out = {}
    for alpha in ALPHAS:
        hyps = texts_under(vocab, found, alpha)
        out[f"{alpha:g}"] = {**bleu_figures(hyps, refs), "by_source_length": _ratios(hyps, refs, src_len)}
    return out


def eos_probabilities(model, vocab, src_ids, ref_ids, batch: int = 32) -> dict:
    """Teacher-forced p(EOS): at the reference's end, and before it."""
    pad, eos, bos = model.cfg.pad_id, vocab.eos_id, vocab.bos_id
    at_end, before, early = [], [], 0
    for at in range(0, len(src_ids), batch):
        src = source_batch(src_ids[at: at + batch], pad, eos)
        tgt = [r for r in ref_ids[at: at + batch]]
        lengths = np.array([len(t) + 1 for t in tgt], dtype=np.int64)
        tgt_in = pad_rows(np.concatenate([np.asarray([bos] + t, dtype=np.int64) for t in tgt]), lengths, pad)
        logp = log_softmax(model.forward(src, tgt_in).astype(np.float64))
        p_eos = np.exp(logp[..., eos])
        best = logp.argmax(axis=-1)
        for row, t in enumerate(tgt):
            at_end.append(p_eos[row, len(t)])
            before.extend(p_eos[row, :len(t)])
            early += bool((best[row, :len(t)] == eos).any())
    return {"p_eos_at_reference_end": round(float(np.mean(at_end)), 4),
            "p_eos_before_the_end": round(float(np.mean(before)), 5),
            "sentences_with_eos_most_probable_before_the_end": round(early / len(src_ids), 4)}


@command_line(PROG)
def main(argv=None) -> int:
    ap = OneLineParser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True, help="the run folder (its averaged model)")
    ap.add_argument("--source", required=True, help="source lines")
    ap.add_argument("--reference", required=True, help="reference lines, one per source line")
    ap.add_argument("--sentences", type=positive_int, help="only the first N lines (default: all)")
    ap.add_argument("--last", action="store_true", help="also decode the run's newest checkpoint (alpha 0.6 and 1.2)")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the text")
    args = ap.parse_args(argv)
    src, refs = read_lines(args.source), read_lines(args.reference)
    pairs = [(s, r) for s, r in zip(src, refs) if s.strip()][: args.sentences]
    if not pairs:
        raise UsageError(f"{args.source} has no non-empty line beside a reference, so nothing to decode: give "
                         "--source a file of source sentences and --reference their references, one per line")
    src, refs = [s for s, _ in pairs], [r for _, r in pairs]
    model, vocab, path = load_model(args.run)
    src_ids, ref_ids = vocab.encode_source(src), vocab.encode_target(refs)
    report = {"model": str(path), "sentences": len(src), "by_alpha": decode_every_alpha(model, vocab, src_ids, refs),
              "eos": eos_probabilities(model, vocab, src_ids, ref_ids)}
    if args.last:
        newest = sorted((Path(args.run) / run_file_names.CHECKPOINTS).glob("step_*.npz"))[-1]
        last, _, _ = load_model(newest)
        report["last_checkpoint"] = {"model": str(newest),
                                     "by_alpha": decode_every_alpha(last, vocab, src_ids, refs)}
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"{report['model']}: {report['sentences']} sentences")
    for name, key in (("averaged", None), ("last checkpoint", "last_checkpoint")):
        table = report["by_alpha"] if key is None else report.get(key, {}).get("by_alpha")
        for alpha, row in (table or {}).items():
            buckets = ", ".join(f"{b} {v['ratio']:.3f} ({v['sentences']})" for b, v in row["by_source_length"].items())
            print(f"{name:<16} alpha {alpha:<4} BLEU {row['bleu']:6.2f}  BP {row['bp']:.3f}  "
                  f"ratio {row['length_ratio']:.3f}  by source tokens: {buckets}")
    print("teacher-forced p(EOS): " + ", ".join(f"{k} {v}" for k, v in report["eos"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
