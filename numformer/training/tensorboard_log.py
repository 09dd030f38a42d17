"""TensorBoard event files of a training run (``train.py --tensorboard``), beside ``metrics.jsonl``.

``tensorboard --logdir RUN`` then shows, while the run goes:

* Scalars: every number of every metrics line under the step it was logged at (``metrics.jsonl`` stays
  the source of truth; these are the same values): ``train/loss``, ``train/learning_rate``,
  ``train/grad_norm`` (global, before clipping), ``train/tokens_per_s``, ``valid/loss``, ``valid/nll``,
  ``valid/ppl``, ``valid/bleu``, and ``run/...`` for the rest (epoch, elapsed seconds, fp16 loss scale,
  skipped steps).
* Histograms and distributions, every ``--log-grads N`` steps: the weights and the gradient of every
  parameter tensor, grouped by layer (tag ``encoder.layers.0/grad/ffn.w_2.weight``): the dashboard's
  distributions show a gradient vanishing or exploding layer by layer.
* Images, at each validation: the attention weights of every layer of a fixed sentence pair (the
  shortest of the first 50 validation pairs with at least 6 subwords a side, teacher-forced with its
  reference translation, so the pictures of successive validations are comparable): one image per layer
  and kind (encoder self-attention, decoder self-attention, encoder-decoder attention), heads side by
  side, white = 0, dark blue = 1, rows = queries, columns = keys.

The writer is tensorboardX's (an optional extra: ``pip install 'numformer[tensorboard]'``; the
``tensorboard`` package of the same extra reads and serves the files). Cost: the scalars reuse the host
floats of the metrics line (no device read of their own); histograms copy every weight and gradient to
the host, only on ``--log-grads`` steps; the attention images run one teacher-forced forward pass per
validation.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..backend import to_host
from ..errors import UsageError
from ..picture_data import layer_of, record_attention

INSTALL = "pip install 'numformer[tensorboard]'"
#: metrics.jsonl key -> TensorBoard tag (other numbers go to run/KEY, validation ones to valid/...)
SCALAR_TAGS = {"train_loss": "train/loss", "lr": "train/learning_rate", "grad_norm": "train/grad_norm",
               "tokens_per_s": "train/tokens_per_s"}
HEAD_PIXELS = 160   # each head's map is drawn about this wide: 4-16 pixels per weight
MAX_IMAGE_WIDTH = 1600


def require_writer():
    """tensorboardX's SummaryWriter, or a one-line UsageError saying how to install it."""
    try:
        from tensorboardX import SummaryWriter  # noqa: PLC0415
    except ImportError:
        raise UsageError(f"--tensorboard needs tensorboardX (and tensorboard to view the files): {INSTALL} "
                         "(or train without event files: --no-tensorboard)") from None
    return SummaryWriter


def scalar_tag(key: str) -> str:
    """The TensorBoard tag of a metrics.jsonl key."""
    if key in SCALAR_TAGS:
        return SCALAR_TAGS[key]
    if key.startswith("valid_"):
        return "valid/" + key[len("valid_"):]
    return "run/" + key


def tensor_tag(name: str, kind: str) -> str:
    """'encoder.layers.0.ffn.w_2.weight', 'grad' -> 'encoder.layers.0/grad/ffn.w_2.weight' (grouped by layer)."""
    layer = layer_of(name)
    rest = name[len(layer) + 1:] if name.startswith(layer + ".") else name
    return f"{layer}/{kind}/{rest}"


def attention_image(maps: np.ndarray) -> np.ndarray:
    """(heads, rows, cols) weights in [0, 1] -> one RGB image (3, H, W) float in [0, 1]: the heads side by side
    with a white gap between them, each weight a square of 4-16 pixels from white (0) to dark blue (1)."""
    heads, rows, cols = maps.shape
    cell = max(4, min(16, HEAD_PIXELS // max(rows, cols, 1)))
    cell = max(1, min(cell, MAX_IMAGE_WIDTH // max(heads * (cols + 1), 1)))
    w = np.clip(np.asarray(maps, dtype=np.float32), 0.0, 1.0)
    big = np.repeat(np.repeat(w, cell, axis=1), cell, axis=2)              # (heads, rows*cell, cols*cell)
    gap = np.zeros((heads, rows * cell, cell), dtype=np.float32)           # weight 0 = white
    strip = np.concatenate([np.concatenate([big[h], gap[h]], axis=1) for h in range(heads)], axis=1)[:, :-cell]
    dark = np.array([0.03, 0.19, 0.42], dtype=np.float32)                  # matplotlib Blues' darkest
    return (1.0 - strip[None] * (1.0 - dark[:, None, None])).astype(np.float32)


def pick_sentence(data, min_len: int = 6, first: int = 50):
    """The fixed pair of the attention images: the shortest of the first ``first`` validation pairs with at
    least ``min_len`` subwords a side -> (source ids, target ids), or None without validation data."""
    pairs = data.ids.get("valid")
    if pairs is None or not len(pairs):
        return None
    n = min(first, len(pairs))
    src_len, tgt_len = (np.asarray(a[:n]) for a in pairs.lengths)
    ok = np.flatnonzero((src_len >= min_len) & (tgt_len >= min_len))
    i = int(ok[np.argmin(src_len[ok] + tgt_len[ok])]) if len(ok) else 0
    src, src_n = pairs.rows("src", np.array([i]))
    tgt, tgt_n = pairs.rows("tgt", np.array([i]))
    return src[: int(src_n[0])].tolist(), tgt[: int(tgt_n[0])].tolist()


class TensorBoardLog:
    """Writes the event files of one run into ``out`` (rank 0's run folder)."""

    def __init__(self, out, model, data):
        self._writer_class = require_writer()  # a missing package fails here, before training starts
        self.out = Path(out)
        self.model, self.vocab = model, data.vocab
        self.sentence = pick_sentence(data)
        self._writer = None

    def open(self, step: int = 0) -> None:
        """Start writing at optimizer step ``step`` (when training starts, after a resume). A resumed run
        asks TensorBoard to hide the events after ``step`` that an earlier attempt wrote (purge_step): its
        checkpoint does not hold that work, as the trainer drops those lines of metrics.jsonl too."""
        if self._writer is None:
            # the file's name holds the second it was opened in: a resume within that second would reuse the
            # name and truncate the first attempt's events, so the starting step and the process go in too
            self._writer = self._writer_class(logdir=str(self.out), flush_secs=30,
                                              purge_step=step + 1 if step > 0 else None,
                                              filename_suffix=f".{os.getpid()}.from-step-{step}")

    @property
    def writer(self):
        """The open writer (opened at step 0 if :meth:`open` was not called)."""
        if self._writer is None:
            self.open(0)
        return self._writer

    def metrics(self, record: dict) -> None:
        """One metrics.jsonl line: its numbers as scalars at its step; after a validation, the attention images."""
        step = int(record.get("step", 0))
        for key, value in record.items():
            if key == "step" or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            self.writer.add_scalar(scalar_tag(key), float(value), step)
        if "valid_loss" in record:
            self.attention(step)
        self.writer.flush()

    def histograms(self, step: int) -> None:
        """Weights and gradients of every parameter tensor, grouped by layer (call after backward, before
        the optimizer step; with gradient accumulation, the step's summed gradient)."""
        for name, p in self.model.named_parameters():
            self.writer.add_histogram(tensor_tag(name, "param"), np.asarray(to_host(p.data), dtype=np.float32), step)
            self.writer.add_histogram(tensor_tag(name, "grad"), np.asarray(to_host(p.grad), dtype=np.float32), step)

    def noise(self, step: int, record: dict) -> None:
        """The gradient noise scale (``noise_scale/<layer type>``, ``noise_scale/total``) and the signal-to-noise
        ratio of a ``--log-grads`` step (grad_stats.jsonl's "noise")."""
        rows = dict(record.get("groups", {}), total=record.get("total", {}))
        for group, row in rows.items():
            for key, tag in (("b_simple", "noise_scale"), ("snr", "gradient_snr")):
                if row.get(key) is not None:
                    self.writer.add_scalar(f"{tag}/{group}", float(row[key]), step)
        self.writer.flush()

    def attention(self, step: int) -> None:
        """The fixed pair's attention maps at ``step``, one image per layer and kind."""
        if self.sentence is None:
            return
        src, tgt = self.sentence
        maps = record_attention(self.model, src, tgt, self.vocab.bos_id, self.vocab.eos_id)
        for kind, layers in maps.items():
            for i, heads in enumerate(layers):
                self.writer.add_image(f"attention/{kind}_layer{i + 1}", attention_image(heads), step,
                                      dataformats="CHW")

    def close(self) -> None:
        """Flush and close the event file (a later write opens a new one)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
