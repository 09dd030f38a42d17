"""Attention maps of a trained model for one sentence (Figures 3-5 of the paper, for every head).

``python -m numformer.attention_maps --model RUN --sentence "..." --out attention.png``

The sentence is translated (beam search), then the model is run once more with
the translation as decoder input, recording every attention weight matrix:
encoder self-attention (S x S), decoder self-attention (T x T, causal) and
encoder-decoder attention (T x S), for every layer and head. Rows are queries,
columns keys, each labelled with its subword piece; the decoder's rows are its
input tokens (BOS, then the translation), each predicting the next one.
One PNG per kind: ``OUT`` with ``-encoder``, ``-decoder`` and ``-cross`` before the suffix.
"""
from __future__ import annotations

import sys
from pathlib import Path

from . import run_file_names
from .cli.arguments import beam_size
from .cli.front import command_line, parser
from .cli.preflight import check_output
from .decoding.translation import DecodeOptions, translate_ids
from .errors import UsageError
from .picture_data import record_attention
from .plot import save_picture


def draw(maps: list, row_labels: list, col_labels: list, title: str, path: Path) -> Path:
    """One grid of heatmaps: rows = layers, columns = heads."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    layers, heads = len(maps), maps[0].shape[0]
    nr, nc = len(row_labels), len(col_labels)
    cell = 0.16 if max(nr, nc) > 30 else 0.22
    w = max(2.2, nc * cell + 1.2)
    h = max(2.6, nr * cell + 1.9)  # room for the rotated key labels under each row
    fig, axes = plt.subplots(layers, heads, figsize=(w * heads, h * layers), squeeze=False)
    size = 7 if max(nr, nc) <= 30 else 5
    for li in range(layers):
        for hi in range(heads):
            ax = axes[li, hi]
            ax.imshow(maps[li][hi], cmap="Blues", vmin=0.0, vmax=1.0, interpolation="nearest")
            ax.set_xticks(range(nc))
            ax.set_yticks(range(nr))
            ax.set_xticklabels(col_labels, rotation=90, fontsize=size)
            ax.set_yticklabels(row_labels if hi == 0 else [], fontsize=size)
            ax.set_title(f"layer {li + 1}, head {hi + 1}", fontsize=9)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    save_picture(fig, path, dpi=100)
    plt.close(fig)
    return path


def attention_pictures(model, vocab, sentence: str, out, opts: DecodeOptions | None = None) -> list[Path]:
    """Translate ``sentence``, record its attention and write the three PNGs; returns their paths."""
    out = Path(out)
    src_ids = vocab.encode_source([sentence])[0]
    if not src_ids:
        raise UsageError("the sentence is empty: give some text to translate")
    model.eval()
    hyp = translate_ids(model, [src_ids], vocab.bos_id, vocab.eos_id, opts or DecodeOptions())[0][0][0]
    maps = record_attention(model, src_ids, hyp, vocab.bos_id, vocab.eos_id)
    src_labels = [vocab.id_to_piece(i) for i in src_ids] + ["</s>"]
    tgt_labels = ["<s>"] + [vocab.id_to_piece(i) for i in hyp]
    translation = vocab.decode([hyp])[0]
    out.parent.mkdir(parents=True, exist_ok=True)
    kinds = [("encoder", src_labels, src_labels, "encoder self-attention"),
             ("decoder", tgt_labels, tgt_labels, "decoder self-attention (masked)"),
             ("cross", tgt_labels, src_labels, "encoder-decoder attention")]
    paths = []
    for kind, rows, cols, name in kinds:
        title = f"{name}\nsource: {sentence}\ntranslation: {translation}"
        paths.append(draw(maps[kind], rows, cols, title, picture_path(out, kind)))
    return paths


#: The pictures attention_pictures writes, one per kind of attention.
PICTURE_KINDS = ("encoder", "decoder", "cross")


def picture_path(out, kind: str) -> Path:
    """Where the picture of ``kind`` goes: ``OUT`` with ``-KIND`` before its suffix (.png when it has none)."""
    out = Path(out)
    return out.with_name(f"{out.stem}-{kind}{out.suffix or '.png'}")


PROG = "python -m numformer.attention_maps"


@command_line(PROG)
def main(argv=None) -> int:
    from .checkpoint.trained_model import load_model  # noqa: PLC0415

    ap = parser(PROG, description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="run folder or checkpoint")
    ap.add_argument("--vocab", help=f"sentencepiece model (default: the run's {run_file_names.VOCAB})")
    ap.add_argument("--sentence", required=True, help="source sentence")
    ap.add_argument("--out", default="attention.png", help="PNG path; -encoder/-decoder/-cross are added")
    ap.add_argument("--beam", type=beam_size, default=DecodeOptions.beam,
                    help=f"beam size of the translation whose attention is drawn (default {DecodeOptions.beam})")
    args = ap.parse_args(argv)
    out = Path(args.out)  # the three pictures' places are checked before the model is loaded or run
    for kind in PICTURE_KINDS:
        check_output(picture_path(out, kind), "--out", [args.model, args.vocab])
    model, vocab, _ = load_model(args.model, args.vocab)
    for p in attention_pictures(model, vocab, args.sentence, args.out, DecodeOptions(beam=args.beam)):
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
