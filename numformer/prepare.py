"""Prepare a corpus once: the shared vocabulary and a memory-mapped binary dataset; reuse it after.

``python -m numformer.prepare --data DIR --out RUN`` (or ``--corpus NAME``, ``--task copy``) does what
``train.py`` does on its first run into ``RUN``, fairseq-preprocess's habit:

1. Check the six text files (present, line counts of each ``.src`` and ``.tgt`` equal, UTF-8: a bad
   line is reported with its file and line number) and draw a sample of the training pairs.
2. Train the shared sentencepiece model (Section 5.1: one source-target vocabulary) on that sample,
   both sides, into ``RUN/spm.model``: ``--vocab-sample`` sentences at most (2,000,000 by default;
   sentencepiece's authors recommend a few million), the pairs drawn at random from the seed. A
   corpus that fits the sample is used whole, in file order, which trains the vocabulary the
   earlier, in-memory preparation trained.
3. Encode every split in blocks of lines (numformer/data/encoding.py) into ``RUN/prepared/``: per
   split and side the token ids of all sentences in one ``.npy`` array plus their offsets
   (numformer/data/binary.py), and ``manifest.json`` last, which marks a complete preparation.

Later runs, ``--resume`` and every MPI rank open the arrays with ``np.load(mmap_mode="r")``: nothing
of the training text is read or held again. The manifest holds a fingerprint: size and modification
time of each text file (or the task and seed of a synthetic one), the vocabulary size asked for, the
sample size, the seed and the sha256 of ``spm.model``. When it no longer matches, the corpus is
prepared again; the vocabulary is retrained too when the training text or the vocabulary settings
changed, unless the run already has checkpoints (they were trained with it: the vocabulary is kept
and only the encoding is redone).
"""
from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .data import DataError, SubwordVocab, default_vocab_size, make_synthetic, normalize_line, read_lines
from .data.binary import SIDES, NpyAppender, TokenPairs, ids_dtype
from .data.encoding import CachedEncoder
from .data.text_files import SPLITS, check_corpus_dir, count_lines, iter_line_blocks

CORPORA = ("bible-en-es",)
VOCAB_FILE = "spm.model"
PREPARED_DIR = "prepared"
MANIFEST = "manifest.json"
FORMAT = 1
#: Sentences (both sides together) the vocabulary is trained on, at most.
DEFAULT_VOCAB_SAMPLE = 2_000_000
TASK_PAIRS = (20000, 500, 500)  # train, valid, test pairs of a synthetic task


@dataclass
class PreparedData:
    """A prepared corpus: the vocabulary, the encoded splits, the text of valid and test.

    Attributes:
        vocab: the shared :class:`SubwordVocab`.
        text: split -> (src_lines, tgt_lines) for ``valid`` and ``test`` (BLEU needs the text;
            the training text is never held).
        ids: split -> :class:`TokenPairs` (memory-mapped after :func:`prepare`); lists of id
            lists given here are turned into in-memory TokenPairs.
        source: what was asked for ('corpus:NAME', 'data:DIR', 'task:NAME'), for the logs and checkpoints.
        folder: the prepared dataset's folder (None for data made in memory).
        reused: True when :func:`prepare` found the dataset prepared and opened it as it was.
    """

    vocab: SubwordVocab
    text: dict
    ids: dict
    source: str
    folder: Path | None = None
    reused: bool = False
    seconds: float = field(default=0.0, compare=False)

    def __post_init__(self):
        for split, value in list(self.ids.items()):
            if not isinstance(value, TokenPairs):
                self.ids[split] = TokenPairs.from_lists(*value)


def _resolve(corpus, data_dir, task) -> tuple[Path | None, str]:
    """Exactly one of corpus / data_dir / task -> (text folder, or None for a task; source string)."""
    given = [x for x in (corpus, data_dir, task) if x]
    if len(given) != 1:
        raise DataError("give exactly one of --corpus NAME, --data DIR or --task copy|reverse")
    if corpus:
        if corpus not in CORPORA:
            raise DataError(f"unknown corpus {corpus!r}: choose one of {', '.join(CORPORA)}, or pass --data DIR")
        from .data.bible import build_bible_corpus  # noqa: PLC0415  (pysword only when asked for)

        return build_bible_corpus(), f"corpus:{corpus}"
    if data_dir:
        return check_corpus_dir(data_dir), f"data:{Path(data_dir).resolve()}"
    if task not in ("copy", "reverse"):
        raise DataError(f"unknown task {task!r}: choose copy or reverse")
    return None, f"task:{task}"


def _file_stats(folder: Path) -> dict:
    out = {}
    for split in SPLITS:
        for side in SIDES:
            st = (folder / f"{split}.{side}").stat()
            out[f"{split}.{side}"] = [st.st_size, st.st_mtime_ns]
    return out


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_manifest(prep: Path) -> dict | None:
    """The manifest of a prepared dataset folder, or None when there is none (or it is unreadable)."""
    try:
        manifest = json.loads((prep / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def manifest_digest(prep) -> str | None:
    """sha256 of a prepared dataset's manifest (None when it has none): names one preparation exactly."""
    try:
        return hashlib.sha256((Path(prep) / MANIFEST).read_bytes()).hexdigest()
    except OSError:
        return None


def open_shared_train(prep, digest: str | None) -> TokenPairs | None:
    """The training pairs of the prepared dataset ``prep`` if this process sees the very preparation
    whose manifest digest is ``digest`` (another MPI rank's); None when it does not (e.g. another host)."""
    if prep is None or digest is None or manifest_digest(prep) != digest:
        return None
    try:
        return TokenPairs.open(prep, "train")
    except DataError:
        return None


def _has_checkpoints(out: Path) -> bool:
    from .checkpoint import run_checkpoints  # noqa: PLC0415

    return bool(run_checkpoints(out))


def prepare(out_dir, corpus=None, data_dir=None, task=None, vocab_size=None, seed: int = 0,
            vocab_sample: int = DEFAULT_VOCAB_SAMPLE, threads: int | None = None, log=None) -> PreparedData:
    """Prepare (or reuse) ``out_dir/spm.model`` and ``out_dir/prepared/``, and open them.

    Args:
        out_dir: the run folder.
        corpus, data_dir, task: exactly one, as train.py's --corpus, --data, --task.
        vocab_size: shared vocabulary size (None: :func:`default_vocab_size` of the training pairs).
        seed: draws the vocabulary's sample (and a task's sentences); seeds sentencepiece.
        vocab_sample: sentences (both sides) the vocabulary is trained on, at most.
        threads: sentencepiece threads while encoding (default: every core).
        log: called with progress lines (None: quiet).
    Returns:
        A :class:`PreparedData` whose ``ids`` are memory-mapped :class:`TokenPairs`.
    Raises:
        DataError: a missing or bad corpus (one line; a bad byte with its file and line number).
    """
    t0 = time.perf_counter()
    say = log or (lambda *a: None)
    if vocab_sample < 2:
        raise DataError(f"--vocab-sample must be at least 2 sentences, got {vocab_sample}")
    out = Path(out_dir)
    folder, source = _resolve(corpus, data_dir, task)
    prep = out / PREPARED_DIR
    vocab_path = out / VOCAB_FILE
    texts = make_synthetic(task, *TASK_PAIRS, seed=seed) if folder is None else None
    inputs = {"format": FORMAT, "source": source,
              "files": _file_stats(folder) if folder is not None else {"task": task, "seed": seed}}
    vocab_inputs = {"files": {k: v for k, v in inputs["files"].items() if not k.startswith(("valid.", "test."))},
                    "vocab_sample": int(vocab_sample), "seed": int(seed)}
    manifest = read_manifest(prep)
    current_sha = _sha256(vocab_path) if vocab_path.is_file() else None
    asked_other_size = (vocab_size is not None and manifest is not None
                        and manifest.get("vocab", {}).get("requested") != int(vocab_size))
    if (manifest is not None and current_sha is not None and not asked_other_size
            and all(manifest.get(k) == v for k, v in inputs.items())
            and manifest.get("vocab", {}).get("sha256") == current_sha):
        data = _open(prep, manifest, source, vocab_path, folder, texts)
        data.reused, data.seconds = True, time.perf_counter() - t0
        return data

    # -- (re)prepare ---------------------------------------------------------------------------------------
    if folder is not None:
        counts = _check_counts(folder)
    else:
        counts = {split: len(texts[split][0]) for split in SPLITS}
    n_train = counts["train"]
    keep_vocab = current_sha is not None and (
        manifest is None  # a vocabulary without a manifest: the user's, or a run folder from before
        or (not asked_other_size and manifest.get("vocab", {}).get("inputs") == vocab_inputs))
    if current_sha is not None and not keep_vocab and _has_checkpoints(out):
        if asked_other_size:
            raise DataError(f"{out} holds checkpoints trained with a vocabulary of "
                            f"{SubwordVocab.load(vocab_path).size} pieces: leave --vocab-size out to continue "
                            "the run, or choose another --out")
        say(f"the training text changed since {vocab_path} was trained; keeping it (the run's checkpoints use "
            "it) and encoding the corpus again")
        keep_vocab = True
    sample, nonempty = _sample_train(folder, texts, n_train, vocab_sample, seed)
    if not nonempty:
        raise DataError(f"the training data ({source}) has no pair with both sides non-empty: "
                        "fill train.src and train.tgt with sentence pairs")
    requested = int(vocab_size) if vocab_size is not None else (
        manifest.get("vocab", {}).get("requested") if keep_vocab and manifest else default_vocab_size(n_train))
    if keep_vocab:
        vocab = SubwordVocab.load(vocab_path)
        if manifest is None and vocab_size is None:
            requested = vocab.size
    else:
        t1 = time.perf_counter()
        vocab = SubwordVocab.train(sample, out / "spm", requested, seed=seed)
        say(f"vocabulary: {vocab.size} pieces from {len(sample):,} sentences ({time.perf_counter() - t1:.1f} s)")
    del sample
    if prep.exists():
        (prep / MANIFEST).unlink(missing_ok=True)  # an interrupted preparation is never taken for a complete one
    prep.mkdir(parents=True, exist_ok=True)
    t1 = time.perf_counter()
    encoder = CachedEncoder(vocab, threads, dtype=ids_dtype(vocab.size))
    n_tokens = {}
    for split in SPLITS:
        for side in SIDES:
            if folder is not None:
                blocks = (lines for _, lines in iter_line_blocks(folder / f"{split}.{side}"))
            else:
                blocks = iter([texts[split][SIDES.index(side)]])
            n_tokens[f"{split}.{side}"] = _encode_file(encoder, blocks, prep / f"{split}.{side}", counts[split])
    say(f"encoded {sum(counts.values()):,} pairs, {sum(n_tokens.values()):,} tokens "
        f"({time.perf_counter() - t1:.1f} s{'' if encoder.exact_words else ', line by line'})")
    manifest = dict(inputs, vocab={"requested": requested, "size": vocab.size, "sha256": _sha256(vocab_path),
                                   "inputs": vocab_inputs if not keep_vocab else
                                   (manifest or {}).get("vocab", {}).get("inputs")},
                    pairs=counts, tokens=n_tokens, ids_dtype=str(ids_dtype(vocab.size)),
                    seconds=round(time.perf_counter() - t0, 2))
    data = json.dumps(manifest, indent=1).encode("utf-8")
    from .checkpoint import atomic_write  # noqa: PLC0415

    atomic_write(prep / MANIFEST, lambda f: f.write(data))
    result = _open(prep, manifest, source, vocab_path, folder, texts)
    result.seconds = time.perf_counter() - t0
    return result


def _open(prep, manifest, source, vocab_path, folder, texts) -> PreparedData:
    vocab = SubwordVocab.load(vocab_path)
    ids = {split: TokenPairs.open(prep, split) for split in SPLITS}
    for split in SPLITS:
        if len(ids[split]) != manifest["pairs"][split]:
            raise DataError(f"{prep} is damaged ({split}: {len(ids[split])} pairs, the manifest says "
                            f"{manifest['pairs'][split]}): delete it and prepare again")
    if folder is not None:  # valid and test are small: their text is read for BLEU
        text = {split: (read_lines(folder / f"{split}.src"), read_lines(folder / f"{split}.tgt"))
                for split in ("valid", "test")}
    else:
        text = {split: texts[split] for split in ("valid", "test")}
    return PreparedData(vocab, text, ids, source, folder=prep)


def _check_counts(folder: Path) -> dict:
    """Line counts per split; DataError when a .src and its .tgt differ or the training split is empty."""
    counts = {}
    for split in SPLITS:
        src_path, tgt_path = folder / f"{split}.src", folder / f"{split}.tgt"
        n_src, n_tgt = count_lines(src_path), count_lines(tgt_path)
        if n_src != n_tgt:
            raise DataError(
                f"{src_path} has {n_src} lines but {tgt_path} has {n_tgt}: line i of {split}.src must be the "
                f"translation of line i of {split}.tgt, fix the files so the counts match")
        if split == "train" and not n_src:
            raise DataError(f"{src_path} and {tgt_path} are empty: the training split needs at least one "
                            "sentence pair")
        counts[split] = n_src
    return counts


def _sample_train(folder, texts, n: int, vocab_sample: int, seed: int) -> tuple[list[str], bool]:
    """The vocabulary's training sentences and whether any training pair has both sides non-empty.

    Every line is read (and checked to be UTF-8); when both sides fit ``vocab_sample``, every line in
    file order (source then target), else the two sides of ``vocab_sample // 2`` pairs drawn from
    ``seed`` without replacement.
    """
    if folder is None:
        src, tgt = texts["train"]
        return src + tgt, any(s and t for s, t in zip(src, tgt))
    whole = 2 * n <= vocab_sample
    picked = None if whole else np.sort(np.random.default_rng([seed, 1]).choice(n, vocab_sample // 2, replace=False))
    sides, nonempty = [], []
    for side in SIDES:
        lines_out, flags = [], np.zeros(n, dtype=bool)
        for done, lines in iter_line_blocks(folder / f"train.{side}", normalize=False):
            flags[done:done + len(lines)] = np.fromiter(map(bool, map(str.strip, lines)), dtype=bool,
                                                        count=len(lines))
            if whole:
                lines_out.extend(map(normalize_line, lines))
            else:
                lo, hi = np.searchsorted(picked, [done, done + len(lines)])
                lines_out.extend(normalize_line(lines[i - done]) for i in picked[lo:hi])
        sides.append(lines_out)
        nonempty.append(flags)
    return sides[0] + sides[1], bool((nonempty[0] & nonempty[1]).any())


def _encode_file(encoder: CachedEncoder, blocks, stem: Path, n_lines: int) -> int:
    """Encode blocks of lines into ``<stem>.ids.npy`` and ``<stem>.offsets.npy``; returns the token count."""
    ids = NpyAppender(stem.with_name(stem.name + ".ids.npy"), encoder.dtype)
    offsets = NpyAppender(stem.with_name(stem.name + ".offsets.npy"), np.int64)
    try:
        offsets.append([0])
        total = 0
        for lines in blocks:
            flat, lengths = encoder.encode(lines)
            ids.append(flat)
            offsets.append(total + np.cumsum(lengths))
            total += int(lengths.sum())
        if offsets.n != n_lines + 1:  # the file changed while it was read
            raise DataError(f"{stem.name} changed while it was being prepared ({offsets.n - 1} lines read, "
                            f"{n_lines} counted): prepare again once it is written")
    except BaseException:
        ids.abort()
        offsets.abort()
        raise
    ids.close()
    offsets.close()
    return total


# -- the command --------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    """``python -m numformer.prepare``: prepare a corpus into a run folder; train.py --out that folder reuses it."""
    from .cli.errors import OneLineParser, one_line_errors, positive_int  # noqa: PLC0415

    ap = OneLineParser(prog="python -m numformer.prepare", description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", help=f"a corpus the project builds itself: {', '.join(CORPORA)}")
    ap.add_argument("--data", metavar="DIR", help="a folder with train/valid/test .src/.tgt files")
    ap.add_argument("--task", choices=["copy", "reverse"], help="a synthetic task")
    ap.add_argument("--out", required=True, help="the run folder train.py will use (--out)")
    ap.add_argument("--vocab-size", type=positive_int, help="shared subword vocabulary size (default: from corpus size)")
    ap.add_argument("--vocab-sample", type=positive_int, default=DEFAULT_VOCAB_SAMPLE,
                    help=f"sentences the vocabulary is trained on, at most (default {DEFAULT_VOCAB_SAMPLE:,})")
    ap.add_argument("--seed", type=int, default=1, help="the run's --seed (default 1, train.py's)")
    ap.add_argument("--threads", type=positive_int, help="sentencepiece threads (default: every core)")
    args = ap.parse_args(argv)
    with one_line_errors("prepare"):
        from .training.run_lock import lock_run_folder  # noqa: PLC0415

        lock = lock_run_folder(args.out)  # the run folder is this process's while it prepares (train.py's lock)
        data = prepare(args.out, args.corpus, args.data, args.task, args.vocab_size, args.seed,
                       args.vocab_sample, args.threads, log=print)
        n = len(data.ids["train"])
        print(f"{'already prepared' if data.reused else 'prepared'}: {data.source}: {n:,} training pairs, "
              f"vocabulary {data.vocab.size} in {data.folder} ({data.seconds:.1f} s)")
        lock.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
