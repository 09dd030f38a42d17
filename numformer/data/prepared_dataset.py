"""A corpus prepared once into the run folder: the shared vocabulary and a memory-mapped binary dataset,
made on the first run and reused after (fairseq-preprocess's habit).

:func:`prepare` does what ``train.py`` does on its first run into ``RUN`` (and
``python -m numformer.prepare``):

1. Check the six text files (present, line counts of each ``.src`` and ``.tgt`` equal, UTF-8: a bad
   line is reported with its file and line number) and draw a sample of the training pairs
   (:mod:`numformer.data.vocab_sample`).
2. Train the shared sentencepiece model (Section 5.1: one source-target vocabulary) on that sample,
   both sides, into ``RUN/spm.model``. A corpus that fits the sample is used whole, in file order,
   which trains the vocabulary the earlier, in-memory preparation trained.
3. Encode every split in blocks of lines (:func:`numformer.data.encoding.encode_file`) into
   ``RUN/prepared/``: per split and side the token ids of all sentences in one ``.npy`` array plus
   their offsets (:mod:`numformer.data.binary`), and ``manifest.json`` last, which marks a complete
   preparation.

Later runs, ``--resume`` and every MPI rank open the arrays with ``np.load(mmap_mode="r")``: nothing
of the training text is read or held again. The manifest holds a fingerprint: path, size and
modification time of each text file (:mod:`numformer.data.source_fingerprint`; or the task and seed of a
synthetic one), the vocabulary size asked for, the sample size, the seed and the sha256 of ``spm.model``.
When it no longer matches, the corpus is prepared again (a changed text file is named in the log); the
vocabulary is retrained too when the training text or the vocabulary settings changed, unless the run
already has checkpoints (they were trained with it: the vocabulary is kept and only the encoding is
redone). The file names in the run folder are :mod:`numformer.run_file_names`'.

With the vocabulary of a model to fine-tune (``given_vocab``), text that vocabulary does not cover turns
into ``<unk>``: the share is measured on the encoded splits and said in one warning line
(:func:`numformer.data.unk_share.warn_unk_share`).
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..files import atomic_write_bytes
from ..run_file_names import MARIAN_VOCAB, PREPARED, VOCAB, run_checkpoints, run_vocab
from .binary import SIDES, TokenPairs, ids_dtype
from .encoding import CachedEncoder, encode_file
from .errors import DataError
from .marian_vocab import load_vocab_file
from .source_fingerprint import changes, file_record, fingerprint, is_fingerprint, summary
from .sources import paper_vocab_size, resolve_source, task_texts
from .text_files import FIXES, SPLITS, count_pairs, iter_line_blocks, read_lines
from .unk_share import warn_unk_share
from .vocab import SubwordVocab, default_vocab_size
from .vocab_sample import DEFAULT_VOCAB_SAMPLE, sample_training_text

#: The prepared dataset's manifest, written last: its presence marks a complete preparation.
MANIFEST = "manifest.json"
#: The manifest's format; a manifest of another format is prepared again.
FORMAT = 1


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


def _sources(folder: Path | None, task, seed, splits=SPLITS) -> dict:
    """What the corpus is made from: the fingerprint of the text files of ``splits``, or a synthetic task's
    name and seed."""
    if folder is None:
        return {"task": task, "seed": seed}
    return fingerprint(folder / f"{split}.{side}" for split in splits for side in SIDES)


def _as_fingerprint(files, folder: Path | None):
    """A manifest's record of the text files as a fingerprint: manifests before fingerprints recorded
    ``{"train.src": [size, mtime_ns], ...}``, the same facts, which are read as such rather than taken for
    a change (that would encode every run's corpus again, and retrain vocabularies, for nothing)."""
    if folder is None or not isinstance(files, dict) or is_fingerprint(files):
        return files
    try:
        return {"files": [{"path": file_record(folder / name)["path"], "size": int(size), "mtime_ns": int(mtime)}
                          for name, (size, mtime) in files.items()]}
    except (TypeError, ValueError):
        return files


def _same_sources(recorded, now) -> bool:
    """Whether a manifest's record of the corpus's sources is ``now`` (:func:`changes` for text files)."""
    if is_fingerprint(now):
        return is_fingerprint(recorded) and not changes(recorded, now)
    return recorded == now


def _same_vocab_inputs(recorded, now: dict) -> bool:
    """Whether the vocabulary was trained on the same training text with the same sample and seed."""
    return (isinstance(recorded, dict) and recorded.get("vocab_sample") == now["vocab_sample"]
            and recorded.get("seed") == now["seed"] and _same_sources(recorded.get("files"), now["files"]))


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


def prepare(out_dir, corpus=None, data_dir=None, task=None, vocab_size=None, seed: int = 0,
            vocab_sample: int = DEFAULT_VOCAB_SAMPLE, threads: int | None = None, log=None,
            wmt_dir=None, given_vocab=None) -> PreparedData:
    """Prepare (or reuse) ``out_dir/spm.model`` and ``out_dir/prepared/``, and open them.

    Args:
        out_dir: the run folder.
        corpus, data_dir, task: exactly one, as train.py's --corpus, --data, --task.
        vocab_size: shared vocabulary size (None: the paper's for a WMT corpus, else
            :func:`default_vocab_size` of the training pairs).
        seed: draws the vocabulary's sample (and a task's sentences); seeds sentencepiece.
        vocab_sample: sentences (both sides) the vocabulary is trained on, at most.
        threads: sentencepiece threads while encoding (default: every core).
        log: called with progress lines (None: quiet).
        wmt_dir: the user's WMT 2014 files for a ``wmt14-*`` corpus (:mod:`numformer.data.wmt14`).
        given_vocab: the vocabulary of a model to fine-tune (``train.py --init-from``): written into the run
            folder (``spm.model``, or ``marian.vocab`` for a Marian one) and used as it is, never retrained.
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
    folder, source = resolve_source(corpus, data_dir, task, wmt_dir, log=say)
    prep = out / PREPARED
    vocab_path = run_vocab(out) if given_vocab is None else _place_given_vocab(out, given_vocab)
    texts = task_texts(task, seed) if folder is None else None
    inputs = {"format": FORMAT, "source": source, "files": _sources(folder, task, seed)}
    vocab_inputs = {"files": _sources(folder, task, seed, splits=("train",)),
                    "vocab_sample": int(vocab_sample), "seed": int(seed)}
    manifest = read_manifest(prep)
    if manifest is not None:  # an older manifest's record, read as a fingerprint
        manifest["files"] = _as_fingerprint(manifest.get("files"), folder)
        if isinstance(manifest.get("vocab", {}).get("inputs"), dict):
            manifest["vocab"]["inputs"]["files"] = _as_fingerprint(manifest["vocab"]["inputs"].get("files"), folder)
    current_sha = _sha256(vocab_path) if vocab_path.is_file() else None
    asked_other_size = (vocab_size is not None and manifest is not None
                        and manifest.get("vocab", {}).get("requested") != int(vocab_size))
    if (manifest is not None and current_sha is not None and not asked_other_size
            and manifest.get("format") == FORMAT and manifest.get("source") == source
            and _same_sources(manifest.get("files"), inputs["files"])
            and manifest.get("vocab", {}).get("sha256") == current_sha):
        data = open_prepared(prep, manifest, source, vocab_path, folder, texts)
        data.reused, data.seconds = True, time.perf_counter() - t0
        return data
    if manifest is not None and manifest.get("source") == source and is_fingerprint(manifest.get("files")) \
            and is_fingerprint(inputs["files"]) and (found := changes(manifest["files"], inputs["files"])):
        say(f"{summary(found)} since {prep} was prepared: preparing it again")

    # -- (re)prepare ---------------------------------------------------------------------------------------
    if folder is not None:
        counts = count_pairs(folder)
    else:
        counts = {split: len(texts[split][0]) for split in SPLITS}
    n_train = counts["train"]
    keep_vocab = given_vocab is not None or current_sha is not None and (
        manifest is None  # a vocabulary without a manifest: the user's, or a run folder from before
        or (not asked_other_size and _same_vocab_inputs(manifest.get("vocab", {}).get("inputs"), vocab_inputs)))
    if current_sha is not None and not keep_vocab and run_checkpoints(out):
        if asked_other_size:
            raise DataError(f"{out} holds checkpoints trained with a vocabulary of "
                            f"{SubwordVocab.load(vocab_path).size} pieces: leave --vocab-size out to continue "
                            "the run, or choose another --out")
        say(f"the training text changed since {vocab_path} was trained; keeping it (the run's checkpoints use "
            "it) and encoding the corpus again")
        keep_vocab = True
    sample, nonempty = sample_training_text(folder, texts, n_train, vocab_sample, seed)
    if not nonempty:
        raise DataError(f"the training data ({source}) has no pair with both sides non-empty: "
                        "fill train.src and train.tgt with sentence pairs")
    requested = int(vocab_size) if vocab_size is not None else (
        manifest.get("vocab", {}).get("requested") if keep_vocab and manifest
        else paper_vocab_size(corpus) or default_vocab_size(n_train))
    if keep_vocab:
        vocab = load_vocab_file(vocab_path)
        if (manifest is None and vocab_size is None) or given_vocab is not None:
            requested = vocab.size
    else:
        t1 = time.perf_counter()
        vocab = SubwordVocab.train(sample, vocab_path.with_suffix(""), requested, seed=seed)
        say(f"vocabulary: {vocab.size} pieces from {len(sample):,} sentences ({time.perf_counter() - t1:.1f} s)")
    del sample
    if prep.exists():
        (prep / MANIFEST).unlink(missing_ok=True)  # an interrupted preparation is never taken for a complete one
    prep.mkdir(parents=True, exist_ok=True)
    t1 = time.perf_counter()
    if getattr(vocab, "kind", "spm") == "marian":  # one sentencepiece model per side: one word cache per side
        encoders = {side: CachedEncoder(vocab, threads, dtype=ids_dtype(vocab.size), side=side) for side in SIDES}
    else:  # one shared model: both sides share one word cache
        encoders = dict.fromkeys(SIDES, CachedEncoder(vocab, threads, dtype=ids_dtype(vocab.size)))
    n_tokens, fixes = {}, {}
    for split in SPLITS:
        for side in SIDES:
            if folder is not None:
                blocks = (lines for _, lines in iter_line_blocks(folder / f"{split}.{side}", fixes=fixes))
            else:
                blocks = iter([texts[split][SIDES.index(side)]])
            n_tokens[f"{split}.{side}"] = encode_file(encoders[side], blocks, prep / f"{split}.{side}", counts[split])
    exact = all(e.exact_words for e in encoders.values())
    empty = empty_side_pairs(prep)
    say(f"encoded {sum(counts.values()):,} pairs, {sum(n_tokens.values()):,} tokens "
        f"({time.perf_counter() - t1:.1f} s{'' if exact else ', line by line'}){hygiene_note(fixes, empty)}")
    manifest = dict(inputs, vocab={"requested": requested, "size": vocab.size, "sha256": _sha256(vocab_path),
                                   "inputs": vocab_inputs if not keep_vocab else
                                   (manifest or {}).get("vocab", {}).get("inputs")},
                    pairs=counts, tokens=n_tokens, ids_dtype=str(ids_dtype(vocab.size)),
                    repaired={key: fixes.get(key, 0) for key in FIXES}, empty_side_pairs=empty,
                    seconds=round(time.perf_counter() - t0, 2))
    atomic_write_bytes(prep / MANIFEST, json.dumps(manifest, indent=1).encode("utf-8"))
    result = open_prepared(prep, manifest, source, vocab_path, folder, texts)
    if given_vocab is not None:  # the model's vocabulary, not one trained on this text: does it cover it?
        warn_unk_share({folder / f"{split}.{side}" if folder is not None else f"{source} {split}.{side}":
                        getattr(result.ids[split], f"{side}_ids") for split in SPLITS for side in SIDES},
                       vocab.unk_id, say)
    result.seconds = time.perf_counter() - t0
    return result


def empty_side_pairs(prep: Path) -> dict:
    """Per split, the encoded pairs with no token on a side: training leaves them out and counts them
    (:func:`numformer.data.batching.plan_batches`, ``skip_empty``); valid and test keep them, line for line."""
    found = {}
    for split in SPLITS:
        src_len, tgt_len = TokenPairs.open(prep, split).lengths
        found[split] = int(((src_len == 0) | (tgt_len == 0)).sum())
    return found


def hygiene_note(fixes: dict, empty: dict) -> str:
    """What the preparation repaired or will leave out, for its log line ("" when nothing): data is said,
    not swallowed (issue 59), as training's log counts the pairs longer than --max-len."""
    said = [f"{fixes[key]:,} {words}" for key, words in (
        ("bom_lines", "lines starting with U+FEFF (dropped)"), ("crlf_lines", "CRLF line endings (read as LF)"),
        ("cr_only_lines", "old Mac CR line endings (split on CR)")) if fixes.get(key)]
    if empty.get("train"):
        said.append(f"{empty['train']:,} training pairs with an empty side (left out of training)")
    return "; " + ", ".join(said) if said else ""


def _place_given_vocab(out: Path, vocab) -> Path:
    """The vocabulary of a model to fine-tune, written into the run folder (unless it is there already);
    a run whose checkpoints used another vocabulary is refused. Returns the file's path."""
    path = out / (MARIAN_VOCAB if getattr(vocab, "kind", "spm") == "marian" else VOCAB)
    blob = vocab.to_bytes()
    if path.is_file() and path.read_bytes() == blob:
        return path
    if run_checkpoints(out):
        raise DataError(f"{out} holds checkpoints trained with another vocabulary than the model's: choose "
                        "another --out")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, blob)
    return path


def open_prepared(prep, manifest, source, vocab_path, folder, texts) -> PreparedData:
    """Open a prepared dataset: its vocabulary, its splits memory-mapped (checked against the
    manifest's pair counts), and the text of valid and test (from ``folder``, or ``texts`` for a task)."""
    vocab = load_vocab_file(vocab_path)
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
