"""A --wmt-dir tree shaped like WMT 2014 English-German, for timing the paper's recipe without the data.

    python3 bench/wmt_shaped_corpus.py --out /tmp/wmt-shaped            # 100,000 pairs, ~1 min
    NUMFORMER_CACHE=/tmp/wmt-cache python3 train.py --corpus wmt14-en-de --wmt-dir /tmp/wmt-shaped \\
        --max-steps 3 --eval-every 0 --no-test --out runs/wmt-step-time   # base's step time here

What a training step costs depends on the tokens in it (about 25,000 source + 25,000 target), their
lengths and the vocabulary (37,000 pieces), not on what the words mean. So this writes random sentences
with WMT's shape: lengths drawn around newstest's mean of about 23 words (a gamma distribution,
mean 23, most between 5 and 50), words drawn by Zipf's law from a made-up lexicon of 60,000 words a
language, rich enough that sentencepiece reaches the paper's 37,000 pieces. The translations mean
nothing: this corpus times steps, it does not train a translator. newstest2013 and newstest2014 get
3,000 pairs each, like the real ones.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from numformer.cli.arguments import OneLineParser, seed_int, positive_int  # noqa: E402  (one-line usage errors)
from numformer.cli.front import command_line  # noqa: E402  (a bug says so; see numformer/cli/front.py)

PROG = "bench/wmt_shaped_corpus.py"  # the name its one-line errors start with

LETTERS = np.array(list("abcdefghijklmnopqrstuvwxyz"))


def lexicon(rng, n: int) -> np.ndarray:
    """n made-up words of 2 to 12 letters."""
    lengths = rng.integers(2, 13, n)
    return np.array(["".join(rng.choice(LETTERS, k)) for k in lengths])


def sentences(rng, words: np.ndarray, lengths: np.ndarray) -> list[str]:
    """One sentence per length, its words drawn by Zipf's law (rank r with probability ~ 1/r)."""
    ranks = np.minimum(rng.zipf(1.1, lengths.sum()), len(words)) - 1
    drawn = words[ranks]
    cuts = np.cumsum(lengths)[:-1]
    return [" ".join(s) for s in np.split(drawn, cuts)]


def write(out: Path, pairs: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    en, de = lexicon(rng, 60000), lexicon(rng, 60000)
    out.mkdir(parents=True, exist_ok=True)
    for stem, n in (("train", pairs), ("newstest2013", 3000), ("newstest2014", 3000)):
        lengths = np.clip(rng.gamma(4.0, 23 / 4.0, n).round().astype(int), 1, 200)
        target_lengths = np.clip((lengths * rng.uniform(0.8, 1.25, n)).round().astype(int), 1, 200)
        (out / f"{stem}.en").write_text("\n".join(sentences(rng, en, lengths)) + "\n", encoding="utf-8")
        (out / f"{stem}.de").write_text("\n".join(sentences(rng, de, target_lengths)) + "\n", encoding="utf-8")


@command_line(PROG)
def main(argv=None) -> int:
    ap = OneLineParser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--pairs", type=positive_int, default=100000)
    ap.add_argument("--seed", type=seed_int, default=0)
    args = ap.parse_args(argv)
    write(args.out, args.pairs, args.seed)
    print(f"wrote {args.pairs:,} training pairs and newstest2013/2014 (3,000 each) to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
