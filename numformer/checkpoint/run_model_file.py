"""Which file is the model a path names: a model file as it is; for a run folder, its average
(``RUN/averaged.npz``) when that averages the run's newest checkpoint, else the newest checkpoint; and where
the vocabulary beside a model file is.

What ``translate.py``, ``python -m grad_checks --checkpoint``, ``python -m numformer.attention_maps`` and
``python -m numformer.checkpoint export`` load when given a run folder.
"""
from __future__ import annotations

from pathlib import Path

from .. import run_file_names
from ..file_kinds import not_a_model, shown
from . import CheckpointError, read_meta


def step_of(path) -> int | None:
    """The optimizer step in a training checkpoint's name (``step_0001234.npz`` -> 1234), else None."""
    stem = Path(path).name.split(".")[0]
    return int(stem[5:]) if stem.startswith("step_") and stem[5:].isdigit() else None


def newest_model_file(path) -> Path:
    """The model a path names: a file as it is; for a run folder its ``averaged.npz`` if that averages
    the run's newest checkpoint, else the newest checkpoint.

    An average is stale when the run trained on after it was written (``--resume`` after an earlier
    attempt ended): its last source step (``meta["step"]``) is older than the newest checkpoint's,
    and it must not shadow that checkpoint.
    """
    path = Path(path)
    if not path.is_dir():
        problem = not_a_model(path)  # a vocabulary, a metrics log, a transformers file...: said as what it is
        if problem is not None:
            raise CheckpointError(problem)
        return path
    averaged, found = path / run_file_names.AVERAGED, run_file_names.run_checkpoints(path)
    if not found:
        if averaged.is_file():
            return averaged
        foreign = foreign_model_folder(path)
        if foreign is not None:
            raise CheckpointError(foreign)
        raise CheckpointError(f"{shown(path)} holds no checkpoint (expected {run_file_names.AVERAGED} or "
                              f"{run_file_names.CHECKPOINTS}/step_*.npz): train a model into it first or give a "
                              "checkpoint file")
    if averaged.is_file():
        newest = step_of(found[-1])
        try:
            step = read_meta(averaged).get("step")
        except CheckpointError:
            return averaged  # a damaged average: loading it says so, in one line
        if isinstance(step, int) and newest is not None:
            fresh = step >= newest
        else:  # no step recorded: the file times decide
            fresh = averaged.stat().st_mtime >= found[-1].stat().st_mtime
        if fresh:
            return averaged
    return found[-1]


def run_folder_of(model_path) -> Path:
    """The run folder a model path belongs to: the folder itself, the run of ``RUN/*.npz`` or of
    ``RUN/checkpoints/step_*.npz``."""
    path = Path(model_path)
    if path.is_dir():
        return path
    return path.parent.parent if path.parent.name == run_file_names.CHECKPOINTS else path.parent


def vocab_beside(model_file) -> Path:
    """The ``spm.model`` of the run folder a model file sits in (``RUN/checkpoints/step_*.npz`` or ``RUN/*.npz``):
    where the vocabulary of a checkpoint that does not carry its own is."""
    return run_folder_of(model_file) / run_file_names.VOCAB


def foreign_model_folder(path: Path) -> str | None:
    """What to say when ``path`` is a model folder of another library rather than a run folder: a Hugging
    Face Marian folder is imported first (one command, named in full); a CTranslate2 folder is an export,
    not loadable back. None for any other folder."""
    if (path / "model.bin").is_file() and (path / "shared_vocabulary.json").is_file() or \
            (path / "model.bin").is_file() and not (path / "config.json").is_file():
        return (f"{shown(path)} is a CTranslate2 model folder (an export, which numformer does not read back): "
                "give the "
                "numformer model file or run folder it was exported from")
    if (path / "config.json").is_file() and any((path / name).is_file() for name in HF_WEIGHTS):
        return (f"{shown(path)} is a Hugging Face model folder, not yet a numformer model: import it once with "
                f"python -m numformer.checkpoint import {shown(path)} --out {shown(path.name)}.npz, then give "
                f"{shown(path.name)}.npz")
    return None


#: The weight files MarianMTModel.save_pretrained writes (newer versions safetensors, older a PyTorch pickle).
HF_WEIGHTS = ("model.safetensors", "pytorch_model.bin")
