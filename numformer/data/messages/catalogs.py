"""Finding the message catalogs of one language installed on the machine: ``LOCALE/es*/LC_MESSAGES/*.mo`` for
Spanish (the corpus ``messages-en-es``), ``LOCALE/de*/...`` for German, and so on.

A catalog is named by its file (``coreutils`` for ``coreutils.mo``) and by its locale folder (``es``,
``es_ES``, ``es_MX``, ...). The folders searched are ``/usr/share/locale`` (where Debian's packages put
their own translations) and ``/usr/share/locale-langpack`` (where Ubuntu's language packs put them), or
the one folder a caller gives. Catalogs that are lists of names rather than sentences
(:data:`NAME_LISTS`) are set aside, counted but not read into the corpus.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path

from ..errors import DataError

#: The locale folders searched when none is given (those that exist).
DEFAULT_LOCALE_DIRS = (Path("/usr/share/locale"), Path("/usr/share/locale-langpack"))
#: Catalogs of names, not sentences (fnmatch patterns on the catalog's name): iso-codes' country, language,
#: script and currency names, and xkeyboard-config's keyboard layout names.
NAME_LISTS = ("iso_*", "xkeyboard-config")
#: The language of the registered corpus (``messages-en-es``); others are built on request (``--language``).
SPANISH = "es"
#: The names the one-line errors and reports give a few languages; another is named by its code.
LANGUAGE_NAMES = {"es": "Spanish", "de": "German", "fr": "French", "it": "Italian", "pt": "Portuguese",
                  "ru": "Russian", "ja": "Japanese", "nl": "Dutch", "pl": "Polish", "sv": "Swedish"}


def language_name(language: str) -> str:
    """``"Spanish"`` for ``"es"``; ``"'xx'"`` for a code without a name here."""
    return LANGUAGE_NAMES.get(language, repr(language))


def install_hint(language: str = SPANISH) -> str:
    """What to install when no catalog of ``language`` is found (Debian ships translations inside each
    program's package, Ubuntu in its language packs)."""
    return ("on Debian the programs' own packages ship them (`sudo apt-get install --reinstall coreutils "
            "git tar`, unless /etc/dpkg/dpkg.cfg.d/ excludes /usr/share/locale), on Ubuntu "
            f"`sudo apt-get install language-pack-{language}-base`; or train on your own corpus with --data DIR")


@dataclass(frozen=True)
class Catalog:
    """One installed catalog: ``name`` (``coreutils``), ``locale`` (``es``, ``es_ES``) and its ``path``."""

    name: str
    locale: str
    path: Path

    @property
    def is_name_list(self) -> bool:
        """Whether the catalog is a list of names (:data:`NAME_LISTS`), set aside."""
        return any(fnmatch.fnmatchcase(self.name, pattern) for pattern in NAME_LISTS)

    def __str__(self) -> str:
        return f"{self.locale}/{self.name}"


def locale_dirs(locale_dir=None, language: str = SPANISH) -> list[Path]:
    """The folders to search: ``[locale_dir]`` when given (DataError when it is not a folder), else those of
    :data:`DEFAULT_LOCALE_DIRS` that exist."""
    if locale_dir is None:
        return [d for d in DEFAULT_LOCALE_DIRS if d.is_dir()]
    folder = Path(locale_dir)
    if not folder.is_dir():
        raise DataError(f"locale folder {folder} does not exist or is not a folder: give the folder that holds "
                        f"{language}/LC_MESSAGES/ (default {DEFAULT_LOCALE_DIRS[0]})")
    return [folder]


def is_language(folder_name: str, language: str = SPANISH) -> bool:
    """Whether a locale folder's name is of ``language``: for ``es``, ``es``, ``es_ES``, ``es_MX``, ``es@...``
    (not ``est``, Estonian's three-letter code)."""
    return folder_name == language or folder_name.startswith((f"{language}_", f"{language}@"))


def find_catalogs(folders, language: str = SPANISH) -> list[Catalog]:
    """Every catalog of ``language`` under ``folders``, each file once (links to one file count once), in the
    order the corpus reads them: by name, then by folder (in the order given), then by locale.

    Raises:
        DataError: a folder cannot be listed (one line naming it).
    """
    found, seen = [], set()
    for rank, root in enumerate(folders):
        try:
            locales = sorted(p.name for p in Path(root).iterdir() if is_language(p.name, language))
            for locale in locales:
                messages = Path(root) / locale / "LC_MESSAGES"
                if not messages.is_dir():
                    continue
                for path in sorted(messages.glob("*.mo")):
                    real = path.resolve()
                    if real not in seen and real.is_file():
                        seen.add(real)
                        found.append((path.stem, rank, locale, path))
        except PermissionError as e:
            raise DataError(f"cannot list {e.filename or root}: permission denied: make it readable, or train "
                            "on your own corpus with --data DIR") from None
    return [Catalog(name, locale, path) for name, _, locale, path in sorted(found, key=lambda f: f[:3])]
