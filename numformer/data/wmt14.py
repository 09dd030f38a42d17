"""The paper's corpora: WMT 2014 English-German and English-French (Section 5.1).

``train.py --corpus wmt14-en-de`` (or ``wmt14-en-fr``) trains on the WMT 2014 training data (about
4.5M English-German and 36M English-French sentence pairs), validates on newstest2013 and tests on
newstest2014, as the paper did. The text comes from one of two places:

* ``--wmt-dir DIR``: files the user already has, either plain text in the layout most mirrors use,
  ``train.{en,de}``, ``newstest2013.{en,de}``, ``newstest2014.{en,de}`` (one sentence per line, line i
  of one language translating line i of the other), or a folder written by ``datasets``'
  ``save_to_disk`` holding the ``wmt14`` dataset (its ``dataset_dict.json`` tells them apart);
* otherwise the ``datasets`` library's ``wmt/wmt14`` dataset (an optional extra: ``pip install
  datasets``), fetched when the machine is online or found in its own cache when it is not.

Either way the pairs are written once into numformer's corpus layout, ``train.{src,tgt}``,
``valid.*`` (newstest2013) and ``test.*`` (newstest2014), in ``$NUMFORMER_CACHE/wmt14-en-de/``; the
run's preparation (:mod:`numformer.data.prepared_dataset`) then trains the shared vocabulary and
memory-maps the ids as for any corpus. The folder is built beside its final place and renamed into
it only when complete (``wmt.json`` written last), so a build interrupted at any point leaves
nothing that is taken for a corpus: the next run starts clean.

A build knows its sources (:mod:`numformer.data.source_fingerprint`): ``wmt.json`` records the path, size
and modification time of every file it was read from (the six text files, or every file of a
``save_to_disk`` folder) and, for the ``datasets`` library's copy, the dataset's name, config and version.
When a file changed since (edited, replaced, grown), the corpus is built again from the same place, with
or without ``--wmt-dir``, and the log line names the file; a source that is gone leaves the build as it
is (it is what remains of that text). A build from before these records is built again when
``--wmt-dir`` is given (nothing says which text it holds) and kept otherwise.

Training pairs are filtered the way fairseq's ``prepare-wmt14en2de.sh`` does with Moses'
``clean-corpus-n.perl -ratio 1.5 ... 1 250``, and each filter is counted in the preparation log:

* ``empty``: a side is empty (or whitespace only);
* ``long``: a side has more than 250 words;
* ``ratio``: one side has more than 1.5 times the words of the other.

fairseq counts BPE tokens after its tokenisation; numformer counts whitespace-separated words before
the vocabulary exists (the vocabulary is trained on the filtered text). Training's own ``--max-len``
(256 subwords per side) then drops what is still too long, counted in the training log.
newstest2013 and newstest2014 are kept whole: they are what BLEU is computed on.
"""
from __future__ import annotations

import itertools
import json
import os
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path

from .. import environment
from ..files import atomic_write_text
from .errors import DataError
from .source_fingerprint import changes, dataset_record, fingerprint, is_fingerprint, summary
from .text_files import CORPUS_FILES, normalize_line


@dataclass(frozen=True)
class WmtPair:
    """One of the paper's two language pairs: source and target language, the ``datasets`` config
    name, the size of the paper's vocabulary (Section 5.1) and the training pairs the paper counts."""

    source: str
    target: str
    hub_config: str
    vocab_size: int
    paper_pairs: str


#: The paper's corpora by the name ``--corpus`` takes. Section 5.1: "a shared source-target vocabulary of
#: about 37000 tokens" (En-De, byte-pair encoding) and "a 32000 word-piece vocabulary" (En-Fr).
WMT14 = {
    "wmt14-en-de": WmtPair("en", "de", "de-en", 37000, "4.5M"),
    "wmt14-en-fr": WmtPair("en", "fr", "fr-en", 32000, "36M"),
}
#: The dataset the ``datasets`` library serves WMT 2014 under.
HUB_DATASET = "wmt/wmt14"
#: Where each split of the corpus comes from: (numformer's split, the text files' stem, the dataset's split).
SPLIT_SOURCES = (("train", "train", "train"), ("valid", "newstest2013", "validation"),
                 ("test", "newstest2014", "test"))
#: Moses' clean-corpus-n.perl settings in fairseq's prepare-wmt14en2de.sh.
MAX_WORDS, MAX_RATIO = 250, 1.5
#: Bumped whenever the filters or the layout change: older builds are rebuilt.
FORMAT_VERSION = 1
#: Written last into a finished build: what it holds and where it came from.
META = "wmt.json"


def default_cache_dir(name: str) -> Path:
    """``$NUMFORMER_CACHE/<name>`` (else ``$XDG_CACHE_HOME/numformer/<name>``, else ``~/.cache/numformer/<name>``)."""
    return environment.cache_root() / name


def read_build(folder: Path) -> dict | None:
    """The ``wmt.json`` of a finished build of this format in ``folder``, else None."""
    try:
        meta = json.loads((folder / META).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("format_version") != FORMAT_VERSION:
        return None
    if not all((folder / f).is_file() for f in CORPUS_FILES):
        return None
    return meta


def filter_reason(src: str, tgt: str) -> str | None:
    """Why a training pair is dropped ('empty', 'long', 'ratio'), or None to keep it (see the module docstring)."""
    n_src, n_tgt = len(src.split()), len(tgt.split())
    if n_src == 0 or n_tgt == 0:
        return "empty"
    if n_src > MAX_WORDS or n_tgt > MAX_WORDS:
        return "long"
    if n_src > MAX_RATIO * n_tgt or n_tgt > MAX_RATIO * n_src:
        return "ratio"
    return None


def build_wmt_corpus(name: str, wmt_dir=None, cache_dir=None, log=None) -> Path:
    """Build (or find) the corpus folder of ``name`` (a key of :data:`WMT14`).

    Args:
        name: ``wmt14-en-de`` or ``wmt14-en-fr``.
        wmt_dir: the user's WMT files (plain text or a ``save_to_disk`` folder); None: the ``datasets``
            library's copy, or the folder built before from either.
        cache_dir: where the corpus folder goes (default :func:`default_cache_dir`).
        log: called with progress lines and the filter counts.
    Returns:
        The folder holding ``train.src train.tgt valid.* test.*`` (English source) and ``wmt.json``.
    Raises:
        DataError: a missing or misaligned file, no ``datasets`` and no ``--wmt-dir``, no network.
    """
    say = log or (lambda *a: None)
    pair = WMT14.get(name)
    if pair is None:
        raise DataError(f"unknown WMT corpus {name!r}: choose one of {', '.join(WMT14)}")
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir(name)
    origin = _origin(wmt_dir)
    built = read_build(folder)
    if built is not None and wmt_dir is not None and built.get("origin") != origin:
        say(f"{name}: {folder} was built from {built['origin']}, now {origin} is given: building it again")
    elif built is not None:
        source_dir = _recorded_dir(built) if wmt_dir is None else Path(wmt_dir)
        stale, gone = _stale(built, source_dir, pair, wmt_dir is not None)
        if stale is None:
            kept = f"; {gone}: the corpus built from it is kept" if gone else ""
            say(f"{name}: built before in {folder} from {built['origin']} ({_counts_text(built)}){kept}")
            return folder
        say(f"{name}: {stale} since {folder} was built: building it again")
        wmt_dir = source_dir  # the same place it was built from (a datasets build has no folder: never stale)
        origin = _origin(wmt_dir)
    reader = _text_reader(Path(wmt_dir), pair) if wmt_dir is not None and not _is_saved_dataset(Path(wmt_dir)) \
        else _dataset_reader(wmt_dir, pair)
    staging = folder.with_name(f".{folder.name}.building-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        # The sources are stated before they are read: a file written meanwhile is newer than the record, so
        # the next run builds again rather than keep a corpus of half old, half new text.
        sources = _sources_now(Path(wmt_dir), pair) if wmt_dir is not None else fingerprint(datasets=[reader.dataset])
        meta = _write_splits(staging, reader, pair, say)
        meta.update(name=name, origin=origin, format_version=FORMAT_VERSION, source_lang=pair.source,
                    target_lang=pair.target, sources=sources)
        atomic_write_text(staging / META, json.dumps(meta, indent=1))
        if folder.exists():
            shutil.rmtree(folder)
        folder.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging, folder)  # the finished build appears at once, or not at all
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    say(f"{name}: built in {folder} ({_counts_text(meta)})")
    return folder


def _counts_text(meta: dict) -> str:
    dropped = meta["dropped"]
    return (f"{meta['read']['train']:,} training pairs read, {dropped['empty']:,} dropped as empty, "
            f"{dropped['long']:,} as longer than {MAX_WORDS} words, {dropped['ratio']:,} for a length ratio "
            f"over {MAX_RATIO}; {meta['pairs']['train']:,} kept; newstest2013 {meta['pairs']['valid']:,}, "
            f"newstest2014 {meta['pairs']['test']:,} pairs")


def _origin(wmt_dir) -> str:
    return "datasets:" + HUB_DATASET if wmt_dir is None else f"dir:{Path(wmt_dir).resolve()}"


def _recorded_dir(built: dict) -> Path | None:
    """The folder a build was read from (its origin ``dir:PATH``), None for the datasets library's copy."""
    origin = str(built.get("origin", ""))
    return Path(origin[len("dir:"):]) if origin.startswith("dir:") else None


def _sources_now(source_dir: Path, pair: WmtPair) -> dict:
    """The fingerprint of the files a build from ``source_dir`` reads: the six text files, or every file of a
    ``save_to_disk`` folder (a new shard is a change too)."""
    if _is_saved_dataset(source_dir):
        return fingerprint(sorted(p for p in source_dir.rglob("*") if p.is_file()))
    return fingerprint(source_dir / f"{stem}.{lang}" for _, stem, _ in SPLIT_SOURCES
                       for lang in (pair.source, pair.target))


def _stale(built: dict, source_dir: Path | None, pair: WmtPair, given: bool) -> tuple[str | None, str | None]:
    """(what changed in the build's sources, for the log line, or None to reuse it; which source is gone, when
    one is and nothing else changed). The ``datasets`` library's copy is never stale here: its version is known
    only by loading it, and ``wmt/wmt14`` is one fixed release."""
    recorded = built.get("sources")
    if not is_fingerprint(recorded):  # built before builds recorded their sources
        return ("nothing records which files it was built from (an older build)" if given else None), None
    if source_dir is None:
        return None, None
    found = changes(recorded, _sources_now(source_dir, pair))
    if all(c.gone for c in found):  # nothing to build from but the build: keep it
        return None, summary(found) if found else None
    return summary([c for c in found if not c.gone]), None


def _is_saved_dataset(path: Path) -> bool:
    return (path / "dataset_dict.json").is_file()


def _write_splits(staging: Path, reader, pair: WmtPair, say) -> dict:
    """Write every split's pairs into ``staging``; returns the counts for ``wmt.json``."""
    read, kept = {}, {}
    dropped = {"empty": 0, "long": 0, "ratio": 0}
    for split, stem, hub_split in SPLIT_SOURCES:
        n_read = n_kept = 0
        with open(staging / f"{split}.src", "w", encoding="utf-8", newline="\n") as fs, \
                open(staging / f"{split}.tgt", "w", encoding="utf-8", newline="\n") as ft:
            for src, tgt in reader(stem, hub_split):
                n_read += 1
                src, tgt = normalize_line(src), normalize_line(tgt)
                if split == "train":
                    reason = filter_reason(src, tgt)
                    if reason is not None:
                        dropped[reason] += 1
                        continue
                fs.write(src + "\n")
                ft.write(tgt + "\n")
                n_kept += 1
        if n_kept == 0:
            raise DataError(f"the WMT {stem} data holds no usable pair ({n_read} read): check the files")
        read[split], kept[split] = n_read, n_kept
        say(f"{stem}: {n_read:,} pairs read, {n_kept:,} kept")
    return {"read": read, "pairs": kept, "dropped": dropped,
            "filters": {"max_words": MAX_WORDS, "max_ratio": MAX_RATIO}}


def _text_reader(folder: Path, pair: WmtPair):
    """Pairs from the plain-text layout ``STEM.{en,de}``; every file is checked before anything is written."""
    if not folder.is_dir():
        raise DataError(f"--wmt-dir {folder} is not a folder: give the folder holding train.{pair.source}, "
                        f"train.{pair.target}, newstest2013.* and newstest2014.*")
    needed = [folder / f"{stem}.{lang}" for _, stem, _ in SPLIT_SOURCES for lang in (pair.source, pair.target)]
    missing = [p.name for p in needed if not p.is_file()]
    if missing:
        raise DataError(f"--wmt-dir {folder} lacks {', '.join(missing)}: it needs train.{pair.source}/"
                        f".{pair.target}, newstest2013.* and newstest2014.* (one sentence per line)")

    def pairs(stem: str, _hub_split: str):
        src_path, tgt_path = folder / f"{stem}.{pair.source}", folder / f"{stem}.{pair.target}"
        with open(src_path, encoding="utf-8", newline="\n") as fs, open(tgt_path, encoding="utf-8", newline="\n") as ft:
            n = 0
            try:
                for n, (src, tgt) in enumerate(_zip_exact(fs, ft), 1):
                    yield src, tgt
            except _Misaligned as exc:
                longer, shorter = (src_path, tgt_path) if exc.first_longer else (tgt_path, src_path)
                raise DataError(f"{longer} has more lines than {shorter} (which ends after line {n}): the two files "
                                "must be aligned line by line") from None
            except UnicodeDecodeError:
                raise DataError(f"{src_path} or {tgt_path} is not UTF-8 near line {n + 1}: convert it to UTF-8") \
                    from None
    return pairs


class _Misaligned(Exception):
    def __init__(self, first_longer: bool):
        super().__init__()
        self.first_longer = first_longer


def _zip_exact(a, b):
    """zip of two line iterators that must end together (``_Misaligned`` otherwise)."""
    for x, y in itertools.zip_longest(a, b):
        if x is None or y is None:
            raise _Misaligned(first_longer=y is None)
        yield x, y


def _dataset_reader(saved, pair: WmtPair):
    """Pairs from ``datasets``: a ``save_to_disk`` folder (``saved``) or the library's ``wmt/wmt14``."""
    online = saved is not None or _online()
    if not online:  # read by datasets when it is imported: its cache only, at once, without a minute of retries
        os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"
    try:
        import datasets  # noqa: PLC0415  (an optional extra, only for this corpus)
    except ImportError:
        raise DataError("the WMT 2014 corpora come through the datasets library (pip install datasets) "
                        "or from your own files: give --wmt-dir DIR") from None
    if saved is not None:
        try:
            data = datasets.load_from_disk(str(saved))
        except Exception as exc:  # noqa: BLE001  (datasets raises many kinds for an unreadable folder)
            raise DataError(f"--wmt-dir {saved} holds a dataset_dict.json but datasets cannot load it "
                            f"({type(exc).__name__}): give the plain-text files instead") from None
    else:
        data = _fetch(datasets, pair, online)
    splits = set(data.keys()) if hasattr(data, "keys") else set()
    missing = [hub for _, _, hub in SPLIT_SOURCES if hub not in splits]
    if missing:
        raise DataError(f"the WMT dataset has no {', '.join(missing)} split: it must have train, validation "
                        "(newstest2013) and test (newstest2014), as datasets' wmt14 has")
    for _, _, hub in SPLIT_SOURCES:
        features = getattr(data[hub], "column_names", [])
        if "translation" not in features:
            raise DataError(f"the WMT dataset's {hub} split has no 'translation' column (it has "
                            f"{', '.join(features) or 'none'}): it must follow datasets' wmt14 schema")

    def pairs(_stem: str, hub_split: str):
        for batch in data[hub_split].iter(batch_size=10000):
            for row in batch["translation"]:
                if pair.source not in row or pair.target not in row:
                    raise DataError(f"a WMT {hub_split} row has languages {', '.join(sorted(row))}, not "
                                    f"{pair.source} and {pair.target}: is it the {pair.hub_config} dataset?")
                yield row[pair.source], row[pair.target]
    info = getattr(data[SPLIT_SOURCES[0][2]], "info", None)
    pairs.dataset = dataset_record(HUB_DATASET, pair.hub_config, getattr(info, "version", None))  # for wmt.json
    return pairs


def _fetch(datasets, pair: WmtPair, online: bool):
    """``datasets.load_dataset('wmt/wmt14', config)``; offline (``online`` False) only the library's cache is
    tried, and a miss is one line saying what to do."""
    try:
        return datasets.load_dataset(HUB_DATASET, pair.hub_config)
    except Exception as exc:  # noqa: BLE001  (network, cache and Hub errors have no common class)
        why = "this machine has no network and datasets' cache does not hold it" if not online else \
            f"datasets could not fetch it ({type(exc).__name__})"
        raise DataError(f"cannot get WMT 2014 {pair.hub_config} ({HUB_DATASET}): {why}: give --wmt-dir DIR with "
                        f"train.{pair.source}/.{pair.target}, newstest2013.* and newstest2014.*") from None


def _online(host: str = "huggingface.co", seconds: float = 5.0) -> bool:
    """Whether the Hub answers a connection within ``seconds``: the quick test for a machine without network."""
    try:
        socket.create_connection((host, 443), timeout=seconds).close()
        return True
    except OSError:
        return False
