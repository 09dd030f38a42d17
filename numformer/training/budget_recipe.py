"""The CPU recipe of a time budget: what a run of M minutes on a CPU trains with (issue 43).

The ``small`` preset's recipe (``config.RECIPES["small"]``: 3,000-token batches, warmup 500, 0.7x Eq. 3,
a checkpoint every 1.5 minutes, the last 5 averaged) was tuned for the main job's 25 minutes. A run given
another ``--max-minutes`` takes :func:`budget_recipe`'s changes to it, chosen by measured sweeps
(``bench/recipe_sweep.py``: one train.py run per setting, each alone on the machine, scored by the beam-4
BLEU of 500 validation sentences with the length penalty chosen on them; the test split unread). On the
project's 2-core AMD EPYC without AVX-512 (docs/results.md, "A recipe for the budget"), ``small``, 10 minutes:

==============================  ========  ======  ====  ===========  =====================  =====================
point                           tokens a  warmup  lr    checkpoint   bible-en-es: valid     messages-en-es:
                                batch                   every (min)  BLEU (steps)           valid BLEU (steps)
==============================  ========  ======  ====  ===========  =====================  =====================
the 25-minute recipe            3,000     500     0.7   1.5          8.03 (607)             21.10 (634)
shorter warmup                  3,000     300     0.7   1.5          6.03 (628)
shorter still                   3,000     150     0.7   1.5          0.01 (653, stalls)
lower rate, short warmup        3,000     150     0.35  1.5          4.83 (662)
smaller batches                 2,000     500     0.7   1.5          9.50 (939)
smaller batches                 1,500     500     0.7   1.5          9.58 (1,216)           30.41 (1,196)
smaller still                   1,000     500     0.7   0.6          10.59 (1,841)
**the rule at 10 minutes**      1,500     500     0.7   0.6          **11.07** (1,242)      **32.38** (1,250)
==============================  ========  ======  ====  ===========  =====================  =====================

So in a short run Eq. 3's rate with warmup 500 stays right (a shorter warmup peaks too high, 3.6e-3 at 150
steps, or, with a lower factor, decays too low for the rest of the run), and what pays is more, smaller updates
(half the tokens a batch, twice the steps) down to 1,500 tokens (1,000 was worse), and checkpoints close enough
for their average to help: 1.5 minutes apart the last 5 span the last 6 minutes of 10 and their average was worse
on validation than the last checkpoint (train.py then keeps the last); 0.6 minutes apart their average was better
(valid loss 4.699 against 4.773 for the last) and added 1.5 BLEU on bible-en-es, 2.0 on messages-en-es. The rule:

* **tokens a batch** (``max_tokens``): 1,500 at 10 minutes or less, 3,000 at 25 or more (the main job's, tuned
  there: docs/training.md, "Recipes per preset"), and in between on the straight line between the two measured
  budgets, rounded to 100 (not measured between them);
* **checkpoints**: one every 6% of the budget (the main job's 1.5 minutes of 25; 0.6 at 10), the last 5
  averaged, so that they span the run's last quarter;
* **warmup and learning rate**: the preset's (warmup 500, 0.7x Eq. 3), measured best at 10 minutes above and at
  25.

Only ``small``, the CPU preset of real corpora, has a budget rule; ``tiny`` (synthetic smoke runs) and the
paper's presets keep their recipes. Every flag given on the command line overrides the rule, and a
resumed run keeps its own settings. The corpus size is not an input: the two corpora swept (bible-en-es,
28,064 pairs, and messages-en-es, 40,094 pairs of short sentences) are of a size, and a 10-minute run sees
less than half an epoch of either, so no run within these budgets repeats its data. Tried on a corpus it was not
tuned on (English to German program messages, 35,097 pairs, ``python -m numformer.data.messages --language de``,
on a Zen 4): 10 minutes gave test BLEU 34.45 with brevity penalty 0.979 (docs/results.md).
"""
from __future__ import annotations

#: The presets with a budget rule.
BUDGET_PRESETS = ("small",)

#: The tokens a batch measured best at each swept budget (minutes -> max_tokens), docs/results.md.
SWEPT_MAX_TOKENS = {10: 1500, 25: 3000}

#: A checkpoint every this share of the budget (the 25-minute recipe's 1.5 minutes of 25).
CHECKPOINT_SHARE = 0.06


def budget_recipe(preset: str, minutes: float) -> dict:
    """The changes to ``preset``'s recipe (``config.RECIPES``) for a run of ``minutes`` on a CPU: ``max_tokens``
    and ``save_every_minutes``; empty for a preset without a budget rule (:data:`BUDGET_PRESETS`)."""
    if preset not in BUDGET_PRESETS:
        return {}
    (short, few), (long, many) = sorted(SWEPT_MAX_TOKENS.items())
    share = min(max((minutes - short) / (long - short), 0.0), 1.0)  # outside the swept budgets: the nearest one's
    return {"max_tokens": int(round((few + share * (many - few)) / 100) * 100),
            # at least 0.01: rounded to 0 it would mean no timed checkpoints at all (a run under 5 seconds)
            "save_every_minutes": max(round(CHECKPOINT_SHARE * minutes, 2), 0.01)}
