"""Validation (Section 6): loss and perplexity of a split, and BLEU of its first sentences.

Used during training (every ``--eval-every`` steps, greedy BLEU of ``--eval-sentences`` for speed) and
after it (the last checkpoint against the average of the last ones, Section 6.1).
"""
from __future__ import annotations

import math
import sys

from ..data import plan_batches
from ..decoding.translation import DecodeOptions, score_translations, translate_lines
from ..layers.registry import layer_class

# Validation batches: at least this many tokens (the training batch size, if larger): a validation pass
# keeps no activations for backward, so it can take larger batches than training does.
MIN_VALIDATION_TOKENS = 2000


def evaluate(model, data, split: str, max_tokens: int, bleu_sentences: int | None = None,
             opts: DecodeOptions | None = None) -> dict:
    """``{split}_loss`` (label-smoothed, per target token), ``{split}_nll`` and ``{split}_ppl`` over the
    whole split of ``data`` (a PreparedData), and ``{split}_bleu`` of its first ``bleu_sentences``
    (greedy unless ``opts`` says otherwise; 0 or None: no BLEU). ``{}`` when the split is empty.

    The model runs in eval mode (no dropout) and is put back in the mode it was in.
    """
    pairs = data.ids.get(split)
    if pairs is None or not len(pairs):
        return {}
    xp, v = model.xp, data.vocab
    crit = layer_class("LabelSmoothedCrossEntropy")(model.cfg.label_smoothing, model.cfg.pad_id)
    was_training = model.training
    model.eval()
    loss_sum = nll_sum = n = 0.0
    try:
        plan = plan_batches(*pairs.lengths, max(max_tokens, MIN_VALIDATION_TOKENS), max_len=model.cfg.max_len - 2)
        for i in range(len(plan)):
            b = pairs.batch(plan[i], v.pad_id, v.bos_id, v.eos_id)
            logits = model(xp.asarray(b.src), xp.asarray(b.tgt_in))
            loss_sum += float(crit.forward(logits, xp.asarray(b.tgt_out), normalizer=1, keep_for_backward=False))
            nll_sum += float(crit.nll_sum)
            n += b.n_tgt_tokens
    finally:
        model.train(was_training)
    if n == 0:  # every pair longer than the positional table
        return {}
    nll = nll_sum / n
    # a model trained to a huge (finite) loss: its perplexity is too large for a float, not a bug report
    ppl = math.exp(nll) if nll < math.log(sys.float_info.max) else math.inf
    out = {f"{split}_loss": loss_sum / n, f"{split}_nll": nll, f"{split}_ppl": ppl}
    if bleu_sentences:
        src_text, tgt_text = data.text[split]
        hyps = translate_lines(model, v, src_text[:bleu_sentences], opts or DecodeOptions(beam=1))
        out[f"{split}_bleu"] = score_translations(hyps, tgt_text[:bleu_sentences])["bleu"]
    return out
