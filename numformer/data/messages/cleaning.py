"""Cleaning one catalog message into one line, and the rules that keep or drop a (msgid, msgstr) pair.

- One line per message: newlines, tabs and runs of any whitespace become one space, both ends stripped
  (:func:`numformer.data.text_files.normalize_line`, the rule every corpus reader applies, so the files
  read back as written); other control characters count as spaces (bash's bell ``\\a`` before
  ``timed out waiting``).
- Keyboard mnemonics: GTK marks the access key of a label with ``_`` (``_Open``, ``Page or_dering:``,
  Spanish ``Or_den de páginas:``). An underscore is also part of many identifiers in program messages
  (``sh_link``, ``max_connections``, psql's ``with_query`` -> ``consulta_with``) and no rule on one string
  tells the two apart, so the marker is removed only in the catalogs that use mnemonics
  (:func:`uses_mnemonics`: at least :data:`MNEMONIC_SHARE` of their messages start with ``_`` and a
  capital letter), and there only from a message holding exactly one ``_``, followed by a letter, and not
  between a letter and a capital (:func:`strip_mnemonic`).
- printf and brace placeholders (``%s``, ``%1$s``, ``%d``, ``{0}``) are kept: both sides carry them, and a
  model learns to copy them.
- A pair is dropped (:func:`drop_reason`) when its English has no letter outside its placeholders
  (``%s: %s``, ``%B(%A+0x%lx)``), when its two sides are the same after cleaning (an untranslated
  message, a command name, ``OS/ABI: %s``, a paper size ``A4x3``), or when either side is longer than
  :data:`MAX_WORDS` words (help screens of dozens of options, one message each).
"""
from __future__ import annotations

import re
import unicodedata

from ..text_files import normalize_line

#: A catalog uses keyboard mnemonics when at least this share of its messages start with "_" + a capital.
MNEMONIC_SHARE = 0.05
#: A pair with more words than this on either side is dropped.
MAX_WORDS = 100

_LEADING_MNEMONIC = re.compile(r"_[^\W\d_]")
_LETTER = re.compile(r"[^\W\d_]")
#: printf conversions (``%s``, ``%1$s``, ``%-10.3lu``, ``%<PRIu64>``, binutils' ``%B``), brace fields (``{0}``).
PLACEHOLDER = re.compile(r"%(?:\d+\$)?[-+ #0'I]*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|ll|[hlLqjzZt])?[A-Za-z%]"
                         r"|%<\w+>|\{\w*\}")


def uses_mnemonics(msgids) -> bool:
    """Whether a catalog's messages (its English ``msgids``) mark access keys with ``_`` (GTK's habit)."""
    msgids = [m for m in msgids if m]
    leading = sum(1 for m in msgids if _LEADING_MNEMONIC.match(m) and m[1].isupper())
    return bool(msgids) and leading >= MNEMONIC_SHARE * len(msgids)


def strip_mnemonic(text: str) -> str:
    """``text`` without its access-key marker: the one ``_`` of a text holding exactly one, when a letter
    follows it (``_Open`` -> ``Open``, ``Or_den`` -> ``Orden``), unless it joins a letter to a capital
    (GTK's key names ``KP_Begin``, ``Num_Lock`` are names, not labels); any other text as it is."""
    if text.count("_") != 1:
        return text
    i = text.index("_")
    after = text[i + 1:i + 2]
    if not _LETTER.match(after) or (after.isupper() and i > 0 and _LETTER.match(text[i - 1])):
        return text
    return text[:i] + text[i + 1:]


def clean_message(text: str, mnemonics: bool = False) -> str:
    """One catalog string as one line of the corpus (whitespace collapsed; the mnemonic marker removed when
    the catalog uses them)."""
    line = normalize_line("".join(" " if unicodedata.category(ch) == "Cc" else ch for ch in text))
    return strip_mnemonic(line) if mnemonics else line


def word_count(text: str) -> int:
    """Words as whitespace separates them."""
    return len(text.split())


def drop_reason(english: str, spanish: str) -> str | None:
    """Why a cleaned pair is dropped (``"no_letters"``, ``"identical"``, ``"too_long"``), None when kept."""
    if not _LETTER.search(PLACEHOLDER.sub(" ", english)):
        return "no_letters"
    if english == spanish:
        return "identical"
    if word_count(english) > MAX_WORDS or word_count(spanish) > MAX_WORDS:
        return "too_long"
    return None
