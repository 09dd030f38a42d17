"""A shared subword vocabulary (sentencepiece) over both languages.

One model is trained over the source and target sides of the training data
together, so the encoder and decoder share one embedding table (the paper
ties source embedding, target embedding and pre-softmax weights).

Fixed ids (a contract with the model, the loss and the decoder):
``pad = 0``, ``unk = 1``, ``bos = 2``, ``eos = 3``.

Training choices:

- ``normalization_rule_name="identity"``: the corpus readers already
  normalise whitespace; no NFKC rewriting, so ``decode(encode(line)) ==
  line`` for every normalised line made of characters seen in training
  (unseen characters become ``unk`` and decode as `` ⁇ ``).
- ``character_coverage=1.0``: every character of the training text gets a
  piece (fine for Latin scripts).
- Deterministic: one thread, the whole input (no sampling or shuffling),
  and sentencepiece's random generator seeded.
- Quiet: ``minloglevel=2``.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from ..files import atomic_files, atomic_write_bytes
from .errors import DataError

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3

_TOO_HIGH = re.compile(r"Vocabulary size (?:is )?too high \((\d+)\)\. Please set it to a value <= (\d+)")


def sentencepiece_module():
    """The ``sentencepiece`` package, imported where a model is trained or read; DataError when it is missing."""
    try:
        import sentencepiece
    except ImportError:
        raise DataError("sentencepiece is not installed: run `pip install sentencepiece`") from None
    return sentencepiece


def default_vocab_size(n_train_pairs: int) -> int:
    """A shared vocabulary size suited to a training set of this many pairs.

    8000 for the ~28k-pair bible corpus (the size the reference run used);
    smaller data gets ``0.3 * n_pairs`` (a piece should be seen often enough
    to learn its embedding), larger data grows with the square root up to
    32000 (the paper used ~37k for 4.5M pairs). Always a multiple of 8 (GEMM
    friendly) and at least 64. :meth:`SubwordVocab.train` lowers the size
    further when the data cannot support it.
    """
    n = max(int(n_train_pairs), 0)
    if n < 26_000:
        size = 0.3 * n
    elif n <= 100_000:
        size = 8000
    else:
        size = min(32_000, 8000 * math.sqrt(n / 100_000))
    return max(64, int(round(size / 8.0)) * 8)


def cut_at_eos(ids, eos_id: int):
    """Each id sequence of ``ids`` (a list of sequences or a 2-D array, not one 1-D sequence) as a list of
    ints up to its first ``eos_id``: what a vocabulary's ``decode`` turns into text."""
    if isinstance(ids, np.ndarray) and ids.ndim == 1:
        raise TypeError("decode takes a list of sequences (or a 2-D array), not one sequence")
    for seq in ids:
        seq = [int(t) for t in seq]
        yield seq[: seq.index(eos_id)] if eos_id in seq else seq


class SubwordVocab:
    """A trained sentencepiece model with the fixed special ids.

    Attributes:
        path: the ``.model`` file it was loaded from (None if from bytes).
        size: number of pieces, special ones included (the embedding rows).
        pad_id, unk_id, bos_id, eos_id: 0, 1, 2, 3.
        requested_size: the size asked for at training time when it had to
            be lowered (see :meth:`train`); otherwise equal to ``size``.
    """

    kind = "spm"  # one shared sentencepiece model (numformer.data.marian_vocab.MarianVocab's kind is "marian")

    def __init__(self, processor, path=None):
        self._sp = processor
        self.path = Path(path) if path is not None else None
        self.size = int(processor.get_piece_size())
        self.requested_size = self.size
        self.pad_id, self.unk_id, self.bos_id, self.eos_id = (
            processor.pad_id(), processor.unk_id(), processor.bos_id(), processor.eos_id())
        if (self.pad_id, self.unk_id, self.bos_id, self.eos_id) != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
            raise DataError(
                f"sentencepiece model {path} has special ids pad={self.pad_id} unk={self.unk_id} bos={self.bos_id} "
                f"eos={self.eos_id}, numformer needs 0/1/2/3: retrain it with SubwordVocab.train"
            )

    # ------------------------------------------------------------------ build
    @classmethod
    def train(cls, lines: Iterable[str], model_prefix_path, vocab_size: int | None = None,
              model_type: str = "bpe", character_coverage: float = 1.0, seed: int = 0,
              byte_fallback: bool = False) -> "SubwordVocab":
        """Train a model on ``lines`` and write ``<prefix>.model`` and ``<prefix>.vocab``.

        Args:
            lines: training sentences, e.g. ``train_src + train_tgt`` (both
                sides, for a shared vocabulary); any iterable of str.
            model_prefix_path: output path without extension; its folder is
                created if needed.
            vocab_size: pieces including the 4 special ones; default
                ``default_vocab_size(len(lines) // 2)``.
            model_type: ``"bpe"`` (default) or ``"unigram"``, ``"char"``, ``"word"``.
            character_coverage: fraction of characters covered (1.0 = all).
            seed: seeds sentencepiece's random generator (only unigram
                training draws random numbers; BPE is deterministic anyway).
            byte_fallback: add the 256 byte pieces, so characters never seen
                in training are encoded as UTF-8 bytes instead of ``unk``
                (costs 256 vocabulary entries; off by default).
        Returns:
            The loaded vocabulary.
        Raises:
            DataError: no non-empty line, or sentencepiece rejects the input.

        If the data cannot support ``vocab_size`` (sentencepiece stops with
        "Vocabulary size too high (N). Please set it to a value <= M"), the
        model is retrained once with M, the largest size the data allows;
        the result's ``requested_size`` records the original request.
        """
        spm = sentencepiece_module()
        lines = [line for line in lines if line and line.strip()]
        if not lines:
            raise DataError("cannot train a subword vocabulary: the training text has no non-empty line")
        if vocab_size is None:
            vocab_size = default_vocab_size(len(lines) // 2)
        if vocab_size < 5:
            raise DataError(f"vocab_size {vocab_size} is too small: it must exceed the 4 special pieces")
        prefix = Path(model_prefix_path)
        prefix.parent.mkdir(parents=True, exist_ok=True)
        if hasattr(spm, "set_random_generator_seed"):
            spm.set_random_generator_seed(int(seed))

        def run(size: int, stage: Path) -> None:
            spm.SentencePieceTrainer.train(
                sentence_iterator=iter(lines),
                model_prefix=str(stage / prefix.name),
                vocab_size=int(size),
                model_type=model_type,
                character_coverage=character_coverage,
                byte_fallback=bool(byte_fallback),
                normalization_rule_name="identity",
                pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
                pad_piece="<pad>", unk_piece="<unk>", bos_piece="<s>", eos_piece="</s>",
                num_threads=1,
                input_sentence_size=0,          # use every sentence: no sampling
                shuffle_input_sentence=False,
                max_sentence_length=1 << 16,    # bytes; long verses must not be dropped silently
                minloglevel=2,
            )

        requested = int(vocab_size)

        def train_into(stage: Path) -> None:
            try:
                run(requested, stage)
            except RuntimeError as e:
                match = _TOO_HIGH.search(str(e))
                if not match:
                    raise DataError(f"sentencepiece failed to train on the given text: {str(e).splitlines()[0]}") from None
                cap = int(match.group(2))
                if cap < 5:
                    raise DataError(f"the training text supports only {cap} pieces: give more text") from None
                run(cap, stage)

        # sentencepiece writes its files in place: trained in a stage beside them and renamed when whole, the
        # model first (a kill mid-training left a cut spm.model under its own name, issue 59)
        model_path = prefix.with_name(prefix.name + ".model")
        atomic_files([model_path, prefix.with_name(prefix.name + ".vocab")], train_into)
        vocab = cls.load(model_path)
        vocab.requested_size = requested
        return vocab

    @classmethod
    def load(cls, path) -> "SubwordVocab":
        """Load a ``.model`` file written by :meth:`train`."""
        spm = sentencepiece_module()
        path = Path(path)
        if not path.is_file():
            raise DataError(f"sentencepiece model not found: {path}: train one with SubwordVocab.train or fix the path")
        processor = spm.SentencePieceProcessor()
        try:
            processor.Load(str(path))
        except (OSError, RuntimeError):
            raise DataError(f"{path} is not a sentencepiece model: retrain it with SubwordVocab.train") from None
        return cls(processor, path)

    def to_bytes(self) -> bytes:
        """The serialized model, to embed in a checkpoint."""
        return self._sp.serialized_model_proto()

    @classmethod
    def from_bytes(cls, data: bytes) -> "SubwordVocab":
        """Inverse of :meth:`to_bytes`."""
        spm = sentencepiece_module()
        processor = spm.SentencePieceProcessor()
        processor.LoadFromSerializedProto(bytes(data))
        return cls(processor)

    def save(self, path) -> Path:
        """Write the model to ``path`` (a ``.model`` file, e.g. next to a checkpoint), atomically;
        the folder is created if needed. Returns the path."""
        return atomic_write_bytes(path, self.to_bytes())

    # ------------------------------------------------------------------- use
    def __len__(self) -> int:
        return self.size

    def encode(self, lines: Sequence[str], num_threads: int | None = None) -> list[list[int]]:
        """Lines -> lists of piece ids; no bos/eos added (batching adds them).

        ``num_threads``: sentencepiece's own threads over the lines (None: its default).
        """
        if isinstance(lines, str):
            raise TypeError("encode takes a list of lines, not one string")
        if num_threads is None:
            return [list(ids) for ids in self._sp.encode(list(lines), out_type=int)]
        return self._sp.encode(list(lines), out_type=int, num_threads=int(num_threads))

    def encode_source(self, lines: Sequence[str], num_threads: int | None = None) -> list[list[int]]:
        """Source lines -> ids: :meth:`encode` (one shared model splits both sides; a
        :class:`~numformer.data.marian_vocab.MarianVocab` has one model per side)."""
        return self.encode(lines, num_threads)

    def encode_target(self, lines: Sequence[str], num_threads: int | None = None) -> list[list[int]]:
        """Target lines -> ids: :meth:`encode` (see :meth:`encode_source`)."""
        return self.encode(lines, num_threads)

    def decode(self, ids) -> list[str]:
        """Id sequences -> text, one string per sequence.

        Each sequence (a list or a 1-D array; a 2-D array is read row by row)
        is cut at its first ``eos``; ``pad`` and ``bos`` are skipped, so the
        rows of a padded decoder output can be passed directly.
        """
        out = []
        for seq in cut_at_eos(ids, self.eos_id):
            seq = [t for t in seq if t != self.pad_id and t != self.bos_id]
            out.append(self._sp.decode(seq))
        return out

    def id_to_piece(self, i: int) -> str:
        """The piece string of id ``i`` (e.g. ``'▁the'``, ``'<pad>'``)."""
        return self._sp.id_to_piece(int(i))

    def piece_to_id(self, piece: str) -> int:
        """The id of a piece (``unk_id`` when it is not in the vocabulary)."""
        return int(self._sp.piece_to_id(piece))

    def __repr__(self) -> str:
        return f"SubwordVocab(size={self.size}, path={str(self.path) if self.path else None!r})"
