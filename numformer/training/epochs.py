"""Where training stands in the data: the epoch, the next batch, and each epoch's plan (Section 5.1).

Every epoch's batches are planned from the sentence lengths alone (:func:`numformer.data.plan_batches`:
length-sorted buckets, shuffled by the run's seed and the epoch), and gathered from the memory-mapped
pairs when they are trained on. Every process walks the same plans, so the data position is the same
on all of them; checkpoints keep it as ``(epoch, batch_pos)``.
"""
from __future__ import annotations

from ..data import DataError, plan_batches
from ..data.batching import training_pair_sizes


class EpochWalk:
    """The training pairs, epoch after epoch, as batches of up to ``max_tokens`` tokens.

    ``epoch`` and ``batch_pos`` are the position of the next batch; ``log`` hears each plan's size
    (the first epoch's, and the first after a resume).
    """

    def __init__(self, data, max_tokens: int, seed: int, max_len: int, positional_table: int, log=print):
        self.pairs, self.vocab = data.ids["train"], data.vocab
        self.max_tokens, self.seed, self.max_len, self.positional_table = max_tokens, seed, max_len, positional_table
        self.log = log
        self.epoch, self.batch_pos = 0, 0
        self._plan = None

    def seek(self, epoch: int, batch_pos: int) -> None:
        """Continue from ``(epoch, batch_pos)`` (a checkpoint's, or rank 0's)."""
        self.epoch, self.batch_pos, self._plan = epoch, batch_pos, None

    def next_batches(self, n: int):
        """The next ``n`` batches and each one's (epoch, position), moving on to the next epoch as needed."""
        out, keys = [], []
        v = self.vocab
        while len(out) < n:
            if self._plan is None:
                self._plan = self._planned(self.epoch)
            if self.batch_pos >= len(self._plan):
                self.epoch, self.batch_pos = self.epoch + 1, 0
                self._plan = self._planned(self.epoch)
            out.append(self.pairs.batch(self._plan[self.batch_pos], v.pad_id, v.bos_id, v.eos_id))
            keys.append((self.epoch, self.batch_pos))
            self.batch_pos += 1
        return out, keys

    def _planned(self, epoch: int):
        """The epoch's :class:`~numformer.data.batching.BatchPlan`: pair indices per batch."""
        plan = plan_batches(*self.pairs.lengths, self.max_tokens, shuffle_seed=self.seed, epoch=epoch,
                            max_len=self.max_len, skip_empty=True)
        if not len(plan):
            raise DataError(f"all {plan.n_filtered} training pairs are longer than --max-len {self.max_len} "
                            f"subwords: raise --max-len (at most {self.positional_table})")
        if epoch == 0 or self._plan is None:
            over = int((training_pair_sizes(*self.pairs.lengths, self.max_len) > self.max_tokens).sum())
            self.log(f"epoch {epoch}: {plan.n_pairs} pairs in {len(plan)} batches"
                     + (f", {plan.n_filtered} longer than --max-len {self.max_len} left out"
                        if plan.n_filtered else "")
                     + (f", {plan.n_empty} with an empty side left out" if plan.n_empty else "")
                     + (f", {over} larger than --max-tokens {self.max_tokens} (source + target with BOS and EOS), "
                        "each a batch of its own over the budget" if over else ""))
        return plan
