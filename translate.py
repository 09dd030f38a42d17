#!/usr/bin/env python3
"""Translate text with a trained numformer model: one output line per input line, in order.

Examples:
    python translate.py --model runs/bible-en-es-small --input test.en --output test.hyp
    echo "In the beginning God created the heavens and the earth." | python translate.py --model runs/bible-en-es-small
    python translate.py --model runs/x/checkpoints/step_0002000.npz --input test.en --reference test.es
    python translate.py --model runs/x --greedy --input test.en
    python translate.py --model runs/x --nbest 4 --input test.en     # 4 tab-separated candidates per line
    python translate.py --model runs/x                               # at a terminal: each line as it is typed
    python translate.py --model model.safetensors --input test.en    # one exported file (see numformer.checkpoint)
    python translate.py --model runs/wmt14-en-de-base --input newstest2014.en --reference newstest2014.de \
        --bleu paper --target-lang de                                # also the paper's tokenised, compound-split BLEU
    python translate.py --hypotheses hyp.de --reference newstest2014.de --bleu paper --target-lang de  # score a file
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from numformer.kernels.host import tune_host

tune_host(blas=False)  # glibc's allocator; OpenBLAS keeps its spin, which decoding's small GEMMs want

from numformer import run_file_names
from numformer.backend import resolve_device, xp_for
from numformer.cli.arguments import NUMBERS, OneLineParser, beam_size, nonneg_int, positive_int
from numformer.cli.front import command_line
from numformer.checkpoint.run_model_file import newest_model_file, run_folder_of
from numformer.cli.preflight import check_output
from numformer.checkpoint.trained_model import load_model
from numformer.data import read_lines
from numformer.errors import UsageError
from numformer.file_kinds import require_input_file, shown
from numformer.files import OutOfSpace, atomic_write_bytes
from numformer.data.text_files import split_lines
from numformer.data.unk_share import TRANSLATING_ADVICE, warn_unk_share
from numformer.decoding.paper_bleu import WHICH_FIGURE, paper_bleu
from numformer.decoding.translation import DecodeOptions, score_translations, translate_lines
from numformer.decoding.valid_choice import read_choice

DEFAULTS = DecodeOptions()  # Section 6.1's search settings: the flags' defaults

CONTRACT = """
What is guaranteed: one output line per input line, in order, whatever the input holds (empty or
whitespace-only lines give empty lines; control characters, emoji and any script are fine). Lines
are split on \\n only (a \\r before it is dropped); characters such as \\f, \\v, U+0085 or U+2028 are
whitespace inside a line, not line breaks. An output line never contains a line break or a tab.
Long lines: a line of up to max_len - 1 subword tokens (1023 for every preset: the positional
table) is translated whole, with at most min(a * tokens + b, max_len) output tokens; a longer line is
split into pieces of at most max_len - 1 tokens at word boundaries, the pieces are translated
separately and their outputs concatenated. Errors are one line on stderr with exit status 2
(130 after Ctrl-C; 1 for a bug in numformer, with the file its traceback was written to); the
output file is written atomically, only when everything is translated.
Interactive: when standard input is a terminal and neither --input, --output nor --reference is
given, each line is translated and printed as soon as Enter is pressed (the model is loaded
first); a line that is not UTF-8 gets an error on stderr and an empty output line; Ctrl-D ends.
From a pipe or a file, all input is read first and translated in length-sorted batches.
"""


def chosen_alpha(flag, model_path) -> tuple:
    """(alpha, where it came from): ``--alpha``; else the choice train.py made on the validation split for the
    run the model file belongs to; else the paper's."""
    if flag is not None:
        return flag, "--alpha"
    choice = read_choice(run_folder_of(model_path))
    if choice is not None:
        return choice.alpha, f"chosen on validation, {run_file_names.DECODING}"
    return DEFAULTS.alpha, "the paper's"


def parse_args(argv=None):
    ap = OneLineParser(prog="translate.py", description=__doc__.splitlines()[0],
                       epilog=__doc__.split("Examples:")[1] + CONTRACT,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", metavar="PATH",
                    help=f"a run folder (its {run_file_names.AVERAGED} unless newer checkpoints exist, else the newest "
                         "checkpoint), a checkpoint .npz or an exported model (.npz or .safetensors): one file is a "
                         "whole model")
    ap.add_argument("--vocab", metavar="SPM", help="sentencepiece model (default: the one the model file carries; "
                                                   f"for older checkpoints {run_file_names.VOCAB} of the run)")
    ap.add_argument("--input", metavar="FILE", help="source sentences, one per line (default, or -: standard input)")
    ap.add_argument("--output", metavar="FILE", help="write translations here (default, or -: standard output)")
    ap.add_argument("--reference", metavar="FILE", help="print sacreBLEU BLEU and chrF against this reference")
    ap.add_argument("--hypotheses", metavar="FILE",
                    help="score this file of translations against --reference instead of translating (no --model)")
    ap.add_argument("--bleu", choices=["sacrebleu", "paper"], default="sacrebleu",
                    help="with --reference: sacrebleu (detokenised, the default) or paper: sacreBLEU and the paper's "
                         "tokenised BLEU with compound splitting (Moses tokens, ##AT##; needs --target-lang and "
                         "pip install sacremoses), each labelled")
    ap.add_argument("--target-lang", metavar="LANG", help="the reference's language for --bleu paper (de, fr, ...)")
    ap.add_argument("--beam", type=beam_size, help=f"beam size (default {DEFAULTS.beam}, Section 6.1)")
    ap.add_argument("--greedy", action="store_true", help="greedy search (same as --beam 1)")
    ap.add_argument("--alpha", type=NUMBERS["length penalty"], default=None,
                    help=f"length penalty ((5+len)/6)^alpha (default: the one train.py chose on the validation "
                         f"split, in the run's {run_file_names.DECODING}; else the paper's {DEFAULTS.alpha})")
    ap.add_argument("--max-len-a", type=NUMBERS["length factor"], default=DEFAULTS.max_len_a,
                    help=f"output length limit: a * input length + b (default a = {DEFAULTS.max_len_a:g})")
    ap.add_argument("--max-len-b", type=NUMBERS["output length"], default=DEFAULTS.max_len_b,
                    help=f"output length limit: a * input length + b (default b = {DEFAULTS.max_len_b})")
    ap.add_argument("--nbest", type=beam_size, default=DEFAULTS.nbest, help="print the N best hypotheses, tab-separated")
    ap.add_argument("--max-tokens", type=positive_int, default=DEFAULTS.max_tokens,
                    help=f"source tokens per decoding batch (default {DEFAULTS.max_tokens})")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: $NUMFORMER_DEVICE or cpu)")
    args = ap.parse_args(argv)
    # "-" names standard input and standard output, as it does for Unix tools
    args.input = None if args.input == "-" else args.input
    args.output = None if args.output == "-" else args.output
    if args.hypotheses is not None:
        if args.reference is None or args.model is not None or args.input is not None:
            ap.error("--hypotheses scores a file of translations: give it with --reference, without --model or --input")
    elif args.model is None:
        ap.error("give --model PATH to translate (or --hypotheses FILE --reference FILE to score translations)")
    if args.bleu == "paper" and (args.reference is None or args.target_lang is None):
        ap.error("--bleu paper scores against --reference with the Moses rules of its language: give --reference "
                 "FILE and --target-lang LANG (de, fr, ...)")
    if args.greedy and args.beam not in (None, 1):
        ap.error(f"--greedy and --beam {args.beam} contradict each other: give one of them")
    args.beam = 1 if args.greedy else (args.beam or DEFAULTS.beam)
    if args.nbest > args.beam:
        ap.error(f"--nbest {args.nbest} cannot exceed the beam size {args.beam}: raise --beam or lower --nbest")
    if args.max_len_a == 0 and args.max_len_b == 0:
        ap.error("--max-len-a 0 and --max-len-b 0 leave no room for any output token")
    return args


class _Output:
    """Standard output, or a file written only when all is translated (:func:`numformer.files.atomic_write_bytes`,
    which writes a regular file atomically, a symbolic link through to its target, and a device, a named pipe or
    a socket into as it is). Whether the output can be written was tried before any work
    (:func:`numformer.cli.preflight.check_output`)."""

    def __init__(self, path):
        self.path = Path(path) if path else None

    def write(self, data: bytes) -> None:
        try:
            self._write(data)
        except (OutOfSpace, BrokenPipeError):  # the space named already; a reader gone: the front's quiet 141
            raise
        except OSError as exc:  # a full disk, a closed descriptor: the place, not the program (one line)
            where = "standard output" if self.path is None else shown(self.path)
            raise UsageError(f"cannot write {where}: {exc.strerror or exc}: check where the output goes") from None

    def _write(self, data: bytes) -> None:
        if self.path is None:
            sys.stdout.flush()
            sys.stdout.buffer.write(data)  # UTF-8 whatever the locale says
            sys.stdout.buffer.flush()
        else:
            atomic_write_bytes(self.path, data)


def _interactive(args) -> bool:
    """Translate line by line: a person types at a terminal and nothing needs the whole input first."""
    return not (args.input or args.output or args.reference) and sys.stdin.isatty()


def typed_lines(stream):
    """The lines of a byte ``stream`` (standard input), each yielded as soon as it ends, without its end: the lines
    :func:`numformer.data.split_lines` cuts from a whole file. A line ends at ``\n`` or ``\r\n``, and, until a
    ``\n`` has been seen, at a lone ``\r`` too: a stream with old Mac line endings (or a terminal that sends
    carriage returns) is answered line by line, not read as one line to its end. Once a ``\n`` has been seen, a
    ``\r`` inside a line is whitespace, as in a file. (A stream that has a lone ``\r`` before its first ``\n``
    is cut there, which a whole file is not: a stream cannot be read ahead without keeping a typed line waiting.)"""
    line, after_cr, newline_seen = bytearray(), False, False
    while byte := stream.read(1):
        if byte == b"\n" and after_cr:  # the \n of a \r\n: its line was answered at the \r
            after_cr, newline_seen = False, True
            continue
        after_cr = byte == b"\r" and not newline_seen
        if byte == b"\n" or after_cr:
            newline_seen = newline_seen or byte == b"\n"
            yield bytes(line)
            line.clear()
        else:
            line += byte
    if line:
        yield bytes(line)


def _translate_as_typed(model, vocab, opts: DecodeOptions, nbest: int) -> None:
    """fairseq-interactive's habit: read a line, print its translation at once, until end of input."""
    print("translate.py: type a sentence and press Enter; Ctrl-D ends", file=sys.stderr, flush=True)
    for raw in typed_lines(sys.stdin.buffer):
        try:
            line = split_lines(raw, "standard input", whole=False)[:1] or [""]
        except ValueError as exc:  # a line that is not UTF-8: say so, answer with an empty line, go on
            print(f"translate.py: error: {exc}", file=sys.stderr, flush=True)
            line = [""]
        hyp = translate_lines(model, vocab, line, opts)[0]
        sys.stdout.buffer.write((("\t".join(hyp) if nbest > 1 else hyp) + "\n").encode("utf-8"))
        sys.stdout.buffer.flush()


@command_line("translate.py")
def main(argv=None) -> int:
    args = parse_args(argv)
    if args.hypotheses is not None:  # scoring translations made before: no model, no input
        require_input_file(args.hypotheses, "--hypotheses")
        require_input_file(args.reference, "--reference")
        hyps, references = read_lines(args.hypotheses), read_lines(args.reference)
        if len(references) != len(hyps):
            raise UsageError(f"{args.reference} has {len(references)} lines but {args.hypotheses} has "
                             f"{len(hyps)}: they must match line for line")
        _print_scores(hyps, references, args)
        return 0
    xp_for(resolve_device(args.device))  # cuda without cupy or a GPU fails now, in one line
    if args.output is not None:  # before any work: a place that can take the file, and no input or run file lost
        check_output(args.output, "--output", [args.model, args.input, args.reference, args.vocab], new_folders=False)
    for flag, path in (("--input", args.input), ("--reference", args.reference)):
        if path is not None:  # a folder is said to be one, not "not found"
            require_input_file(path, flag)
    newest_model_file(args.model)  # a file of another kind is named before standard input is read
    output = _Output(args.output)
    interactive = _interactive(args)
    if interactive:
        lines = None  # read after the model is loaded, one at a time
    elif args.input:
        lines = read_lines(args.input)
    else:
        lines = split_lines(sys.stdin.buffer.read(), "standard input")
    references = read_lines(args.reference) if args.reference else None
    if references is not None and len(references) != len(lines):
        raise UsageError(f"{args.reference} has {len(references)} lines but the input has {len(lines)}: "
                         "they must match line for line")
    model, vocab, path = load_model(args.model, args.vocab, args.device)
    if lines is not None:  # input the vocabulary does not cover becomes <unk>: said once, before decoding
        warn_unk_share({args.input or "standard input": vocab.encode_source(lines)}, vocab.unk_id,
                       lambda line: print(f"translate.py: {line}", file=sys.stderr), TRANSLATING_ADVICE)
    alpha, alpha_from = chosen_alpha(args.alpha, path)
    opts = DecodeOptions(beam=args.beam, alpha=alpha, max_len_a=args.max_len_a,
                         max_len_b=args.max_len_b, nbest=args.nbest, max_tokens=args.max_tokens)
    if interactive:
        _translate_as_typed(model, vocab, opts, args.nbest)
        return 0
    start = time.perf_counter()
    hyps = translate_lines(model, vocab, lines, opts)
    secs = time.perf_counter() - start
    assert len(hyps) == len(lines)
    text_out = "".join(("\t".join(h) if args.nbest > 1 else h) + "\n" for h in hyps)
    output.write(text_out.encode("utf-8"))
    print(f"translated {len(lines)} lines in {secs:.1f} s with {path} "
          f"({'greedy' if args.beam == 1 else f'beam {args.beam}, alpha {alpha:g} ({alpha_from})'})", file=sys.stderr)
    if references is not None:
        _print_scores([h[0] if args.nbest > 1 else h for h in hyps], references, args)
    return 0


def _print_scores(hyps: list[str], references: list[str], args) -> None:
    """sacreBLEU's BLEU and chrF (with signatures) on stderr; with --bleu paper also the paper-comparable BLEU."""
    s = score_translations(hyps, references)
    print(f"BLEU {s['bleu']:.2f}  chrF {s['chrf']:.2f}  (sacreBLEU, detokenised)\n{s['bleu_detail']}\n"
          f"{s['bleu_signature']}\n{s['chrf_signature']}", file=sys.stderr)
    if args.bleu == "paper":
        p = paper_bleu(hyps, references, args.target_lang)
        print(f"BLEU {p['bleu']:.2f}  (paper-comparable: {p['method']})\n{WHICH_FIGURE}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
