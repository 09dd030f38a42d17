"""A Hugging Face model folder: the names of its files, its weights read as numpy arrays, and a Hub id fetched
into one. ``safetensors`` reads the weights, ``torch`` only a legacy ``pytorch_model.bin``,
``huggingface_hub`` only a fetch: each is imported where it is needed."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from . import InteropError
from ..data.hf_files import OBJECT, STRING, check_value, field, read_json_object
from ..errors import first_line

#: The weights' files of a Hugging Face model folder, in the order they are looked for.
SAFETENSORS, SAFETENSORS_INDEX, TORCH_BIN = "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"
#: What an export writes besides the tokenizer files.
GENERATION_CONFIG, TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP = ("generation_config.json", "tokenizer_config.json",
                                                          "special_tokens_map.json")
#: What a Hub fetch downloads: config, tokenizer and safetensors weights; the PyTorch pickle only when a
#: repository has no safetensors (many opus-mt repositories hold both, 300 MB each).
HUB_PATTERNS = ["config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json",
                "source.spm", "target.spm", "vocab.json", "tokenizer_config.json", "special_tokens_map.json"]


def read_hf_weights(folder) -> dict:
    """The weights of a Hugging Face model folder by name, as numpy arrays: ``model.safetensors`` (or its
    shards through ``model.safetensors.index.json``), else ``pytorch_model.bin`` (through torch). Half
    precision is widened to float32; float32 and float64 are kept."""
    folder = Path(folder)
    files = []
    if (folder / SAFETENSORS).is_file():
        files = [folder / SAFETENSORS]
    elif (folder / SAFETENSORS_INDEX).is_file():
        index_path = folder / SAFETENSORS_INDEX
        weight_map = field(read_json_object(index_path), "weight_map", OBJECT, index_path)
        files = [folder / check_value(f, f"weight_map[{name!r}]", STRING, index_path)
                 for name, f in weight_map.items()]
        files = sorted(set(files))
    state = {}
    if files:
        from safetensors.numpy import load_file  # noqa: PLC0415

        for f in files:
            try:
                state.update(load_file(str(f)))
            except Exception as exc:  # noqa: BLE001  (missing shard, header, dtype numpy lacks)
                raise InteropError(f"cannot read the weights {f} ({first_line(exc)})") from None
    elif (folder / TORCH_BIN).is_file():
        try:
            import torch  # noqa: PLC0415
        except ImportError:
            raise InteropError(f"{folder / TORCH_BIN} is a PyTorch pickle and torch is not installed: install "
                               "torch, or save the model with safetensors") from None
        try:
            loaded = torch.load(str(folder / TORCH_BIN), map_location="cpu", weights_only=True)
        except Exception:  # noqa: BLE001  (torch's message advises weights_only=False: never, for a file that fails)
            raise InteropError(f"{folder / TORCH_BIN} is not a PyTorch weights file numformer can read (damaged, cut "
                               "short, or holding more than tensors): save the model again with "
                               "MarianMTModel.save_pretrained (safetensors)") from None
        if not isinstance(loaded, dict) or not all(hasattr(v, "numpy") for v in loaded.values()):
            raise InteropError(f"{folder / TORCH_BIN} holds no mapping of weight names to tensors: save the model "
                               "again with MarianMTModel.save_pretrained")
        state = {k: (v.float() if v.dtype in (torch.float16, torch.bfloat16) else v).numpy() for k, v in loaded.items()}
    else:
        raise InteropError(f"{folder} holds no weights ({SAFETENSORS} or {TORCH_BIN}): save the model with "
                           "MarianMTModel.save_pretrained")
    return {k: (v.astype(np.float32) if v.dtype == np.float16 else v) for k, v in state.items()}


def fetch(source) -> Path:
    """A Marian model's folder: ``source`` itself when it is a folder, else a Hub id downloaded through
    ``huggingface_hub.snapshot_download`` (the files :data:`HUB_PATTERNS` name, ``pytorch_model.bin`` only
    when there are no safetensors weights); no network, no such id, or no huggingface_hub: an InteropError
    in one line."""
    path = Path(source)
    if path.is_dir():
        return path
    if path.exists():
        raise InteropError(f"{source} is a file: give the folder a Marian model was saved to "
                           "(MarianMTModel.save_pretrained + MarianTokenizer.save_pretrained)")
    text = str(source)
    if text.startswith((".", "/", "~")) or text.count("/") != 1 or os.sep != "/" and os.sep in text:
        raise InteropError(f"{source} does not exist: give a Marian model's folder or a Hub id such as "
                           "Helsinki-NLP/opus-mt-en-de")
    try:
        from huggingface_hub import snapshot_download  # noqa: PLC0415
    except ImportError:
        raise InteropError(f"{source} is not a folder, and fetching it from the Hugging Face Hub needs "
                           "huggingface_hub: pip install 'numformer[interop]'") from None
    try:
        folder = Path(snapshot_download(repo_id=text, allow_patterns=HUB_PATTERNS))
        if not (folder / SAFETENSORS).is_file() and not (folder / SAFETENSORS_INDEX).is_file():
            folder = Path(snapshot_download(repo_id=text, allow_patterns=HUB_PATTERNS + [TORCH_BIN]))
        return folder
    except Exception as exc:  # noqa: BLE001  (offline, DNS, 404, auth: all mean "could not fetch")
        raise InteropError(f"{text} is not a folder, and fetching it from the Hugging Face Hub failed (no network, "
                           f"or no such model: {type(exc).__name__}): download it where there is a network and give "
                           "its folder") from None


__all__ = ["SAFETENSORS", "SAFETENSORS_INDEX", "TORCH_BIN", "GENERATION_CONFIG", "TOKENIZER_CONFIG",
           "SPECIAL_TOKENS_MAP", "HUB_PATTERNS", "read_hf_weights", "fetch"]
