"""Reading a compiled gettext message catalog (a ``.mo`` file) into its entries, with the stdlib alone.

The format (GNU gettext manual, "The Format of GNU MO Files"): a header of 32-bit words in the byte order
the magic number ``0x950412de`` is read in: magic, revision, ``N`` (number of strings), ``O`` and ``T``
(offsets of the tables of original and translated strings), ``S`` and ``H`` (the hash table's size and
offset, not needed to read every entry). Each table holds ``N`` pairs ``(length, offset)`` of a string in
the file. An original string is ``msgid``, or ``msgctxt "\\x04" msgid`` for an entry with a context, or
``msgid "\\x00" msgid_plural`` for a plural entry, whose translation then holds its forms separated by
``"\\x00"``. The entry with the empty ``msgid`` is the header (``Content-Type: ...; charset=UTF-8``); its
charset decodes every other string.

``gettext.GNUTranslations`` reads the same files, but it keeps a plural entry as one key per form and
hides nothing else; reading the tables here keeps each entry whole (context, plural or not) and lets a
damaged file be named in one line (:class:`MoFileError`).
"""
from __future__ import annotations

import codecs
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from ..errors import DataError

MAGIC = 0x950412DE
#: The major revisions (``revision >> 16``) whose layout is the one read here.
MAJOR_REVISIONS = (0, 1)
_CHARSET = re.compile(r"charset=\s*([-\w.:]+)", re.IGNORECASE)


class MoFileError(DataError):
    """A ``.mo`` file that cannot be read (truncated, not a catalog, an unknown charset or revision)."""


@dataclass(frozen=True)
class Entry:
    """One entry of a catalog, decoded.

    Attributes:
        msgid: the original (English) string, without its context.
        msgstr: the translation (for a plural entry, its first form).
        context: the ``msgctxt`` (``"Stock label"``), None without one.
        plural: whether the entry has a ``msgid_plural`` (and its translation several forms).
    """

    msgid: str
    msgstr: str
    context: str | None = None
    plural: bool = False


def read_mo(path) -> list[Entry]:
    """Every entry of the ``.mo`` file ``path``, in the file's order, the header entry (empty msgid) included.

    Raises:
        MoFileError: the file is not a catalog of a known revision, is truncated, or holds text its
            charset cannot decode (one line naming the file).
        OSError: the file cannot be read (the caller names what to do).
    """
    path = Path(path)
    data = path.read_bytes()
    if len(data) < 20:
        raise MoFileError(f"{path} is too short to be a gettext catalog ({len(data)} bytes)")
    for order in ("<", ">"):
        if struct.unpack_from(order + "I", data, 0)[0] == MAGIC:
            break
    else:
        raise MoFileError(f"{path} is not a gettext catalog (magic number {data[:4].hex()})")
    revision, n, originals, translations = struct.unpack_from(order + "4I", data, 4)
    if revision >> 16 not in MAJOR_REVISIONS:
        raise MoFileError(f"{path} is a gettext catalog of revision {revision >> 16}, which numformer cannot read")
    raw = []
    try:
        for i in range(n):
            olen, ooff = struct.unpack_from(order + "2I", data, originals + 8 * i)
            tlen, toff = struct.unpack_from(order + "2I", data, translations + 8 * i)
            if ooff + olen > len(data) or toff + tlen > len(data):
                raise struct.error("string past the end")
            raw.append((data[ooff:ooff + olen], data[toff:toff + tlen]))
    except struct.error:
        raise MoFileError(f"{path} is truncated or damaged (its string tables point past its end)") from None
    charset = "utf-8"
    for msgid, msgstr in raw:
        if msgid == b"":
            charset = _charset_of(msgstr, path)
            break
    entries = []
    for msgid, msgstr in raw:
        try:
            key, value = msgid.decode(charset), msgstr.decode(charset)
        except UnicodeDecodeError as e:
            bad = e.object[e.start:e.end].hex()
            raise MoFileError(f"{path} holds text that is not {charset} (byte 0x{bad})") from None
        context = None
        if "\x04" in key:
            context, key = key.split("\x04", 1)
        plural = "\x00" in key
        entries.append(Entry(key.split("\x00")[0], value.split("\x00")[0], context, plural))
    return entries


def _charset_of(header: bytes, path: Path) -> str:
    """The charset the header names (UTF-8 when it names none, or the template's placeholder ``CHARSET``)."""
    found = _CHARSET.search(header.decode("ascii", errors="replace"))
    if not found or found.group(1).upper() == "CHARSET":
        return "utf-8"
    try:
        return codecs.lookup(found.group(1)).name
    except LookupError:
        raise MoFileError(f"{path} names a charset Python does not know ({found.group(1)})") from None
