"""Turning one verse of OSIS markup (what the SWORD modules store) into plain text.

Strong's-number ``<w>`` tags keep their words; footnotes and cross references, section headings,
speaker labels (Song of Songs) and the glossary appended after Revelation are removed; Psalm
superscriptions (``<title canonical="true">``) are kept, because the Spanish text has them as part
of verse 1. Whitespace is normalised.
"""

from __future__ import annotations

import html
import re

# Everything after the end-of-book marker is not verse text (after Rev 22:21
# the English module carries its whole glossary).
_BOOK_END = re.compile(r'<div\b[^>]*\btype="book"[^>]*/>.*', re.S)
_NOTE = re.compile(r"<note\b.*?</note>", re.S)
_CANONICAL_TITLE = re.compile(r'<title\b[^>]*\bcanonical="true"[^>]*>(.*?)</title>', re.S)
# Headings, speaker labels, catch words and alternate readings (the latter
# two only occur inside notes, listed in case a note is malformed).
_DROP_WITH_CONTENT = re.compile(r"<(title|speaker|catchWord|rdg)\b[^>]*>.*?</\1>", re.S)
# Line, paragraph and division tags separate words; inline tags (w, q, seg,
# name, hi ...) do not (transChange is handled with the gap mark below).
_BLOCK_TAG = re.compile(r"</?(?:l|lg|lb|div|chapter|milestone|item|list|p|verse|br|head|table|row|cell)\b[^>]*>")
_ANY_TAG = re.compile(r"<[^>]*>")
# A removed note, and the edges of a <transChange> (words the translators
# added, often written with no space around them: "Rehum<transChange>y
# </transChange><w>Baana</w>"), leave this mark. It becomes a space between
# two words and disappears next to a space, punctuation or a bracket:
# "God<note>..</note><w>created" -> "God created", "word<note>..</note>," ->
# "word,", "(<transChange>..." -> "(...".
_GAP = "\x00"
_GAP_RUN = re.compile(_GAP + "+")
_TRANS_CHANGE = re.compile(r"</?transChange\b[^>]*>")
_OPENERS = "(“‘[¿¡«"


def _resolve_gap(match: re.Match) -> str:
    text, start, end = match.string, match.start(), match.end()
    before = text[start - 1] if start > 0 else " "
    after = text[end] if end < len(text) else " "
    if before.isspace() or before in _OPENERS or after.isspace():
        return ""
    if after.isalnum() or after in _OPENERS:
        return " "
    return ""


def clean_osis(raw: str) -> str:
    """Turn one verse of OSIS markup into plain, whitespace-normalised text."""
    text = _BOOK_END.sub("", raw)
    text = _NOTE.sub(_GAP, text)
    text = _TRANS_CHANGE.sub(_GAP, text)
    text = _CANONICAL_TITLE.sub(r" \1 ", text)
    text = _DROP_WITH_CONTENT.sub(" ", text)
    text = _BLOCK_TAG.sub(" ", text)
    text = _ANY_TAG.sub("", text)
    text = _GAP_RUN.sub(_resolve_gap, text)
    text = html.unescape(text)
    return " ".join(text.split())
