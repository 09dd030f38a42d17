"""Does ``transformers`` translate as numformer does, on the same weights? Greedy search on both sides,
line by line, and (with ``--reference``) the sacreBLEU of each side's output.

Two uses, one script:

* a numformer model (the main job's, say): it is exported with ``python -m numformer.checkpoint export
  --format hf`` into a temporary folder, loaded by ``MarianMTModel.from_pretrained`` and
  ``MarianTokenizer.from_pretrained``, and both sides translate the first ``--sentences`` lines of
  ``--input`` (default: the bible-en-es test source);
* a model imported from the Hub with ``python -m numformer.checkpoint import`` (needs the network): give
  the model file as ``--model`` and the Hub id or folder it came from as ``--hf``.

Both sides run the same greedy search: start token, pad and BOS never generated (the export's
``generation_config.json``; the opus-mt models ban pad too), at most ``--max-new`` output tokens with EOS
forced at the last (numformer's ``--max-len-a 0 --max-len-b N``, transformers' ``max_new_tokens=N`` with
``forced_eos_token_id``), batches of ``--batch`` lines in input order. Reported: how many lines have the
same output token ids, how many the same text, the first lines that differ, and seconds per side (a
by-product, not a benchmark: ``bench/decode.py`` times decoding). In float32 a line may differ where two
tokens' probabilities tie to rounding; ``--dtype float64`` on both sides leaves no such ties.

    python bench/transformers_agreement.py --model runs/bible-en-es-small --sentences 50
    python bench/transformers_agreement.py --model opus-en-de.npz --hf Helsinki-NLP/opus-mt-en-de \\
        --input newstest2014.en --reference newstest2014.de --sentences 0 --max-new 256
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from thread_env import pin_threads

ROOT = Path(__file__).resolve().parent.parent

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from numformer.cli.arguments import OneLineParser, nonneg_int, positive_int  # noqa: E402  (one-line usage errors)
from numformer.cli.front import command_line  # noqa: E402  (a bug says so; see numformer/cli/front.py)
from numformer.errors import UsageError  # noqa: E402

PROG = "bench/transformers_agreement.py"  # the name its one-line errors start with


def parse_args(argv=None):
    ap = OneLineParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a numformer run folder or model file (own or imported)")
    ap.add_argument("--hf", default=None, metavar="FOLDER_or_HUB_ID",
                    help="the transformers side (default: --model exported with --format hf)")
    ap.add_argument("--input", default=None, metavar="FILE", help="source lines (default: bible-en-es test.src)")
    ap.add_argument("--reference", default=None, metavar="FILE",
                    help="reference lines: sacreBLEU of each side (default with the default input: its test.tgt)")
    ap.add_argument("--sentences", type=nonneg_int, default=50, help="the first N non-empty lines (default 50; 0 = all)")
    ap.add_argument("--max-new", type=positive_int, default=128, help="output tokens at most, EOS included (default 128)")
    ap.add_argument("--batch", type=positive_int, default=32, help="lines per batch on both sides (default 32)")
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float32", help="both sides (default float32)")
    ap.add_argument("--threads", type=nonneg_int, default=2, help="BLAS, numformer and torch threads (default 2)")
    ap.add_argument("--show", type=nonneg_int, default=3, help="differing lines to print (default 3)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    return ap.parse_args(argv)


def numformer_greedy(model, vocab, lines, max_new: int, batch: int):
    """(output ids per line, text per line, seconds): numformer's greedy search, ``batch`` lines at a time."""
    from numformer.decoding.translation import DecodeOptions, clean_output, translate_ids  # noqa: PLC0415

    opts = DecodeOptions(beam=1, max_len_a=0.0, max_len_b=max_new, max_tokens=10 ** 9)
    ids = []
    t0 = time.perf_counter()
    for i in range(0, len(lines), batch):
        ids += [hyps[0][0] for hyps in translate_ids(model, vocab.encode_source(lines[i:i + batch]), vocab.bos_id,
                                                     vocab.eos_id, opts)]
    seconds = time.perf_counter() - t0
    return ids, [clean_output(t) for t in vocab.decode(ids)], seconds   # the text as translate_lines writes it


def transformers_greedy(hf, tok, lines, max_new: int, batch: int, eos_id: int):
    """(output ids per line, text per line, seconds): ``generate``'s greedy search, start token and EOS cut."""
    import torch  # noqa: PLC0415

    ids, texts = [], []
    t0 = time.perf_counter()
    for i in range(0, len(lines), batch):
        enc = tok(lines[i:i + batch], return_tensors="pt", padding=True)
        with torch.no_grad():
            out = hf.generate(**enc, num_beams=1, do_sample=False, max_new_tokens=max_new,
                              forced_eos_token_id=eos_id).numpy()
        for row in out[:, 1:].tolist():
            ids.append(row[: row.index(eos_id)] if eos_id in row else row)
        texts += tok.batch_decode(out, skip_special_tokens=True)
    return ids, texts, time.perf_counter() - t0


@command_line(PROG)
def main(argv=None) -> int:
    args = parse_args(argv)
    pin_threads(args.threads)
    sys.path.insert(0, str(ROOT))
    from numformer.data.text_files import normalize_line  # noqa: PLC0415

    # the input first: nothing to compare is said before torch, transformers and the model are loaded
    if args.input:
        src_path = Path(args.input)
    else:
        from numformer.data import build_bible_corpus  # noqa: PLC0415

        src_path = Path(build_bible_corpus()) / "test.src"
        args.reference = args.reference or str(src_path.with_suffix(".tgt"))
    kept = [(i, normalize_line(ln)) for i, ln in enumerate(src_path.read_text(encoding="utf-8").splitlines())
            if ln.strip()]
    if not kept:
        raise UsageError(f"{src_path} has no non-empty line, so nothing to compare: give --input a file of source "
                         "sentences, one per line")
    if args.sentences > 0:
        kept = kept[: args.sentences]
    lines = [ln for _, ln in kept]
    import numpy as np  # noqa: PLC0415
    import torch  # noqa: PLC0415
    from transformers import MarianMTModel, MarianTokenizer  # noqa: PLC0415

    from numformer.checkpoint_command import main as checkpoint_main  # noqa: PLC0415
    from numformer.checkpoint.run_model_file import newest_model_file  # noqa: PLC0415
    from numformer.checkpoint.trained_model import load_model  # noqa: PLC0415
    from numformer.decoding.translation import score_translations  # noqa: PLC0415

    if args.threads:
        torch.set_num_threads(args.threads)
    model, vocab, path = load_model(args.model)
    if args.dtype == "float64":
        model.to(model.xp, np.float64)
    folder = tempfile.TemporaryDirectory(prefix="bench_hf_")
    hf_source = args.hf
    if hf_source is None:
        hf_source = str(Path(folder.name) / "hf")
        if checkpoint_main(["export", str(newest_model_file(args.model)), "--format", "hf", "--out", hf_source]):
            raise SystemExit(2)
    dtype = getattr(torch, args.dtype)
    hf = MarianMTModel.from_pretrained(hf_source, dtype=dtype, attn_implementation="eager").eval()
    tok = MarianTokenizer.from_pretrained(hf_source)

    max_new = min(args.max_new, model.cfg.max_len)  # numformer's limit never passes its positional table
    ours_ids, ours, ours_s = numformer_greedy(model, vocab, lines, max_new, args.batch)
    theirs_ids, theirs, theirs_s = transformers_greedy(hf, tok, lines, max_new, args.batch, vocab.eos_id)
    same_ids = [a == b for a, b in zip(ours_ids, theirs_ids)]
    same_text = [a == b for a, b in zip(ours, theirs)]
    result = {"model": str(path), "hf": args.hf or "the model exported with --format hf", "input": str(src_path),
              "sentences": len(lines), "dtype": args.dtype, "max_new": max_new,
              "same_ids": sum(same_ids), "same_text": sum(same_text),
              "numformer_seconds": ours_s, "transformers_seconds": theirs_s,
              "differing": [{"line": kept[i][0] + 1, "source": lines[i], "numformer": ours[i],
                             "transformers": theirs[i]} for i, ok in enumerate(same_ids) if not ok][: args.show]}
    if args.reference:
        all_refs = Path(args.reference).read_text(encoding="utf-8").splitlines()
        refs = [all_refs[i] for i, _ in kept]
        result["bleu_numformer"] = score_translations(ours, refs)["bleu"]
        result["bleu_transformers"] = score_translations(theirs, refs)["bleu"]
    if args.json:
        print(json.dumps(result, ensure_ascii=False))
        return
    n = len(lines)
    print(f"{result['model']} against transformers ({result['hf']}), {src_path}: {n} lines, greedy, "
          f"{args.dtype}, at most {max_new} output tokens")
    print(f"  same output ids on {result['same_ids']} of {n} lines, same text on {result['same_text']} of {n}")
    print(f"  numformer {ours_s:.1f} s, transformers {theirs_s:.1f} s (not a benchmark: bench/decode.py times "
          "decoding)")
    if args.reference:
        print(f"  sacreBLEU: numformer {result['bleu_numformer']:.2f}, transformers {result['bleu_transformers']:.2f}")
    for d in result["differing"]:
        print(f"  line {d['line']}: {d['source']}\n    numformer:    {d['numformer']}\n"
              f"    transformers: {d['transformers']}")


if __name__ == "__main__":
    sys.exit(main())
