#!/usr/bin/env python3
"""Translate text with a trained numformer model: one output line per input line, in order.

Examples:
    python translate.py --model runs/bible-en-es-small --input test.en --output test.hyp
    echo "In the beginning God created the heavens and the earth." | python translate.py --model runs/bible-en-es-small
    python translate.py --model runs/x/checkpoints/step_0002000.npz --input test.en --reference test.es
    python translate.py --model runs/x --greedy --input test.en
    python translate.py --model runs/x --nbest 4 --input test.en     # 4 tab-separated candidates per line
"""
from __future__ import annotations

import argparse
import sys
import time

from numformer.cli_common import load_model, one_line_errors
from numformer.data import read_lines
from numformer.data.parallel import normalize_line
from numformer.translation import DecodeOptions, score_translations, translate_lines


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("Examples:")[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, metavar="PATH",
                    help="a run folder (uses averaged.npz, else the newest checkpoint) or a checkpoint .npz")
    ap.add_argument("--vocab", metavar="SPM", help="sentencepiece model (default: spm.model of the run)")
    ap.add_argument("--input", metavar="FILE", help="source sentences, one per line (default: standard input)")
    ap.add_argument("--output", metavar="FILE", help="write translations here (default: standard output)")
    ap.add_argument("--reference", metavar="FILE", help="print sacreBLEU BLEU and chrF against this reference")
    ap.add_argument("--beam", type=int, default=4, help="beam size (default 4, Section 6.1)")
    ap.add_argument("--greedy", action="store_true", help="greedy search (same as --beam 1)")
    ap.add_argument("--alpha", type=float, default=0.6, help="length penalty ((5+len)/6)^alpha (default 0.6)")
    ap.add_argument("--max-len-a", type=float, default=1.0, help="output length limit: a * input length + b")
    ap.add_argument("--max-len-b", type=int, default=50, help="output length limit: a * input length + b")
    ap.add_argument("--nbest", type=int, default=1, help="print the N best hypotheses, tab-separated")
    ap.add_argument("--max-tokens", type=int, default=4000, help="source tokens per decoding batch")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: $NUMFORMER_DEVICE or cpu)")
    args = ap.parse_args(argv)
    if args.greedy:
        args.beam = 1
    if args.beam < 1 or args.nbest < 1:
        ap.error("--beam and --nbest must be at least 1")
    if args.nbest > args.beam:
        ap.error(f"--nbest {args.nbest} cannot exceed the beam size {args.beam}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    with one_line_errors("translate.py"):
        if args.input:
            lines = read_lines(args.input)
        else:
            raw = sys.stdin.buffer.read()
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                line = raw[: exc.start].count(b"\n") + 1
                raise ValueError(f"standard input line {line} is not UTF-8: convert it with iconv -t UTF-8") from None
            lines = [normalize_line(x) for x in text.split("\n")]
            if lines and lines[-1] == "" and text.endswith("\n"):
                lines.pop()  # the newline that ends the last line opens no new line
        references = read_lines(args.reference) if args.reference else None
        if references is not None and len(references) != len(lines):
            raise ValueError(f"{args.reference} has {len(references)} lines but the input has {len(lines)}: "
                             "they must match line for line")
        model, vocab, path = load_model(args.model, args.vocab, args.device)
        opts = DecodeOptions(beam=args.beam, alpha=args.alpha, max_len_a=args.max_len_a, max_len_b=args.max_len_b,
                             nbest=args.nbest, max_tokens=args.max_tokens)
        start = time.perf_counter()
        hyps = translate_lines(model, vocab, lines, opts)
        secs = time.perf_counter() - start
        text_out = "".join(("\t".join(h) if args.nbest > 1 else h) + "\n" for h in hyps)
        if args.output:
            with open(args.output, "w", encoding="utf-8") as f:
                f.write(text_out)
        else:
            sys.stdout.write(text_out)
            sys.stdout.flush()
        print(f"translated {len(lines)} lines in {secs:.1f} s with {path} "
              f"({'greedy' if args.beam == 1 else f'beam {args.beam}, alpha {args.alpha}'})", file=sys.stderr)
        if references is not None:
            best = [h[0] if args.nbest > 1 else h for h in hyps]
            s = score_translations(best, references)
            print(f"BLEU {s['bleu']:.2f}  chrF {s['chrf']:.2f}\n{s['bleu_detail']}\n{s['bleu_signature']}\n"
                  f"{s['chrf_signature']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
