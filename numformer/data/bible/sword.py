"""Finding and reading the two installed SWORD Bible modules (with ``pysword``).

- English: SWORD module ``engWEB2015eb`` (World English Bible, package ``sword-text-web``),
  NRSVA versification.
- Spanish: SWORD module ``spaRV1909eb`` (Reina-Valera 1909, package ``sword-text-sparv``),
  KJV versification.

Both are public domain Debian packages. The modules are looked for in ``--sword-path`` when given,
else in ``$SWORD_PATH`` (:func:`numformer.environment.sword_path`), ``/usr/share/sword`` and
``~/.sword``; a missing ``pysword`` or module is a :class:`DataError` that gives the install command.
Verses come back as OSIS markup, keyed by the module's own (chapter, verse) references
(:mod:`.osis` turns them into plain text).
"""

from __future__ import annotations

import functools
from pathlib import Path

from ... import environment
from ..errors import DataError

SRC_MODULE = "engWEB2015eb"
TGT_MODULE = "spaRV1909eb"
INSTALL_PACKAGES = "sudo apt-get install sword-text-web sword-text-sparv"
INSTALL_PYSWORD = "pip install pysword"


def candidate_sword_paths(sword_path=None) -> list[Path]:
    """The SWORD data folders searched, in order: ``sword_path`` alone when given."""
    if sword_path is not None:
        return [Path(sword_path)]
    first = environment.sword_path()
    return ([first] if first is not None else []) + [Path("/usr/share/sword"), Path.home() / ".sword"]


def _conf_of(mods_d: Path, module: str) -> Path | None:
    """The ``.conf`` file in ``mods_d`` that declares ``module`` (``[engWEB2015eb]``), None when none does."""
    for conf in sorted(mods_d.glob("*.conf")):
        try:
            text = conf.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if f"[{module}]" in text:
            return conf
    return None


def find_sword_dir(sword_path=None) -> Path | None:
    """The first SWORD data folder (:func:`candidate_sword_paths`) declaring both modules, without pysword:
    where :func:`open_modules` would read them; None when none does."""
    for path in candidate_sword_paths(sword_path):
        if (path / "mods.d").is_dir() and all(_conf_of(path / "mods.d", m) for m in (SRC_MODULE, TGT_MODULE)):
            return path
    return None


def module_files(sword_dir: Path) -> list[Path]:
    """The files the two modules are read from in ``sword_dir``: each ``.conf`` and every file of its
    ``DataPath`` (what an upgrade of the packages rewrites); the corpus's fingerprint is taken of these."""
    files = []
    for module in (SRC_MODULE, TGT_MODULE):
        conf = _conf_of(sword_dir / "mods.d", module)
        if conf is None:
            continue
        files.append(conf)
        for line in conf.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.strip().lower().startswith("datapath="):
                data = sword_dir / line.split("=", 1)[1].strip()
                files += sorted(p for p in data.rglob("*") if p.is_file()) if data.is_dir() else []
                break
    return files


def open_modules(sword_path=None):
    """Return ``(src_bible, tgt_bible, sword_dir, confs)`` from the first SWORD
    data folder that holds both modules; DataError with the fix otherwise.

    The two bibles read a book with one decompression (:func:`_cache_decompression`).
    """
    try:
        from pysword.modules import SwordModules
    except ImportError:
        raise DataError(f"pysword is not installed (needed to read the bible corpus): run `{INSTALL_PYSWORD}`") from None
    searched = candidate_sword_paths(sword_path)
    found_any = {}
    for path in searched:
        if not (path / "mods.d").is_dir():
            continue
        modules = SwordModules(str(path))
        confs = modules.parse_modules()
        for key in (SRC_MODULE, TGT_MODULE):
            if key in confs:
                found_any.setdefault(key, path)
        if SRC_MODULE in confs and TGT_MODULE in confs:
            try:
                src = modules.get_bible_from_module(SRC_MODULE)
                tgt = modules.get_bible_from_module(TGT_MODULE)
            except (OSError, ValueError, KeyError) as e:
                raise DataError(
                    f"the SWORD modules in {path} could not be opened ({e}): reinstall them with "
                    f"`sudo apt-get install --reinstall sword-text-web sword-text-sparv`"
                ) from None
            _cache_decompression(src)
            _cache_decompression(tgt)
            return src, tgt, path, {k: confs[k] for k in (SRC_MODULE, TGT_MODULE)}
    missing = [k for k in (SRC_MODULE, TGT_MODULE) if k not in found_any]
    where = " or ".join(str(p) for p in searched)
    what = (f"SWORD module(s) {', '.join(missing)} not found in {where}" if missing
            else f"SWORD modules {SRC_MODULE} and {TGT_MODULE} are not in one folder ({where})")
    raise DataError(
        f"{what}: install them with `{INSTALL_PACKAGES}` (or set SWORD_PATH to a SWORD data folder holding both)"
    )


def _cache_decompression(bible) -> None:
    # pysword decompresses the whole (book-sized) block again for every
    # verse it returns: reading Genesis takes ~4 s that way, the whole Bible
    # minutes. Memoising the block decompression per module makes reading a
    # book cost one decompression. The method is private to pysword; if it
    # is ever renamed we fall back to the slow but correct path.
    method = getattr(bible, "_decompressed_text", None)
    if callable(method):
        bible._decompressed_text = functools.lru_cache(maxsize=4)(method)


def canon_books() -> list[str]:
    """The 66 book names of the KJV canon, in canonical order, as pysword spells them."""
    from pysword.canons import canons

    return [book[0] for testament in ("ot", "nt") for book in canons["kjv"][testament]]


def read_book(bible, book: str) -> dict[tuple[int, int], str]:
    """Read one book of a pysword bible as ``{(chapter, verse): OSIS markup}``.

    The references come from the module's own versification, in the order
    pysword stores the verses.
    """
    _, structure = bible.get_structure().find_book(book)
    refs = [(c + 1, v + 1) for c, n in enumerate(structure.chapter_lengths) for v in range(n)]
    texts = list(bible.get_iter(books=[book], clean=False))
    if len(texts) != len(refs):  # pragma: no cover - pysword contract
        raise RuntimeError(f"{book}: pysword returned {len(texts)} verses for {len(refs)} references")
    return dict(zip(refs, texts))
