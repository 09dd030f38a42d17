"""What an output path says a model is written as, and the refusal of a path that says something else.

``python -m numformer.checkpoint`` writes a model as one file (``.npz``, ``.safetensors``) or as a folder (a
Hugging Face Marian folder, a CTranslate2 folder). The path's form and ``--format`` must agree, so that a
file is what its name says and a folder is where a folder was asked for: ``import --out model.safetensors``
must not write an npz under that name, nor ``export --format safetensors --out dir/`` a file called ``dir``.
Every disagreement is refused in one line, before anything is read or written.
"""
from __future__ import annotations

import os
from pathlib import Path

from . import CheckpointError
from ..file_kinds import shown
from ..files import WRITTEN_INTO, output_kind

#: The one-file formats, by the suffix that names them.
FILE_SUFFIXES = {".npz": "npz", ".safetensors": "safetensors"}
#: The formats written as a folder.
FOLDER_FORMATS = ("hf", "ctranslate2")


def output_format(out, fmt: str | None = None, allowed=("npz", "safetensors", *FOLDER_FORMATS),
                  flag: str = "--out") -> str:
    """The format ``out`` is written as: ``fmt`` when given, else its suffix; a :class:`CheckpointError`
    (one line, exit 2) when the path and the format disagree, when the format is not one this command
    writes (``allowed``), or when a folder output already holds something."""
    path, text = Path(out), str(out)
    if not text.strip():
        raise CheckpointError(f"{flag} is empty: name the file or folder to write")
    by_suffix = FILE_SUFFIXES.get(path.suffix.lower())
    one_file = [f for f in allowed if f not in FOLDER_FORMATS]
    files = " or ".join(f".{f}" for f in one_file)
    into = output_kind(path)
    if into in WRITTEN_INTO:  # a device, a named pipe, a socket: written into; its name need not say the format
        fmt = fmt or by_suffix or (one_file[0] if len(one_file) == 1 else None)
        if fmt is None:
            raise CheckpointError(f"{flag} {shown(out)} is a {into}, whose name does not say a format: give --format "
                                  f"{'|'.join(one_file)}")
        if fmt in FOLDER_FORMATS or fmt not in allowed:
            raise CheckpointError(f"{flag} {shown(out)} is a {into}: it takes one file ({files}), not {fmt}")
        return fmt
    if fmt is None:
        if by_suffix is None:
            folders = [f for f in allowed if f in FOLDER_FORMATS]
            also = f" (or give --format {'|'.join(folders)} for a folder)" if folders else ""
            raise CheckpointError(f"{flag} {shown(out)} does not say a format: name a file ending {files}{also}")
        fmt = by_suffix
    if fmt not in allowed:
        raise CheckpointError(f"{flag} {shown(out)}: this command writes {', '.join(allowed)}, not {fmt}: name a file "
                              f"ending {files}")
    if fmt in FOLDER_FORMATS:
        if by_suffix is not None:
            raise CheckpointError(f"--format {fmt} writes a folder but {flag} {shown(out)} ends {path.suffix}: name a "
                                  "folder")
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            what = "is a file" if not path.is_dir() else "is a folder that is not empty"
            raise CheckpointError(f"{flag} {shown(out)} {what}: give a new or empty folder (nothing was written)")
        return fmt
    if text.endswith(("/", os.sep)) or path.is_dir():
        raise CheckpointError(f"{flag} {shown(out)} is a folder but {fmt} is one file: name the file, e.g. "
                              f"{path / ('model.' + fmt)}")
    if by_suffix != fmt:
        said = f"ends {path.suffix}" if path.suffix else "has no suffix"
        raise CheckpointError(f"{flag} {shown(out)} {said} but the format is {fmt}: name it "
                              f"{shown(path.with_suffix('.' + fmt))}")
    return fmt
