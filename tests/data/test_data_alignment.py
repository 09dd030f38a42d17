"""Sentence alignment by length (numformer/data/alignment.py, Gale & Church 1993)."""

import numpy as np

from numformer.data import alignment


def test_align_lengths_recovers_a_shift():
    rng = np.random.default_rng(0)
    en = rng.integers(30, 300, size=40).tolist()
    ratio, scale = 0.96, 1.33
    es = [max(1, int(round(x * ratio + rng.normal(0, 3)))) for x in en]
    # The Spanish side lacks verse 10 and merges verses 30 and 31.
    es_shifted = es[:10] + es[11:30] + [es[30] + es[31]] + es[32:]
    en_keys = list(range(40))
    es_keys = en_keys[:10] + en_keys[11:30] + [30] + en_keys[32:]
    beads = alignment.align_lengths(en, es_shifted, ratio, scale, src_keys=en_keys, tgt_keys=es_keys)
    assert (10, 11, 10, 10) in beads                     # EN verse 10 unmatched
    assert (30, 32, 29, 30) in beads                     # EN 30+31 <-> ES merged verse
    ones = [b for b in beads if b[1] - b[0] == 1 and b[3] - b[2] == 1]
    assert len(ones) == 40 - 3
    # Beads cover both sequences in order.
    assert beads[0][0] == beads[0][2] == 0 and beads[-1][1] == 40 and beads[-1][3] == len(es_shifted)
    for a, b in zip(beads, beads[1:]):
        assert a[1] == b[0] and a[3] == b[2]


def test_align_lengths_keeps_reference_pairs_when_lengths_are_ambiguous():
    # Equal lengths everywhere: nothing to gain from moving; the reference
    # pairing (diagonal) must win thanks to the anchor bonus.
    beads = alignment.align_lengths([50] * 10, [48] * 10, 0.96, 1.33, src_keys=list(range(10)), tgt_keys=list(range(10)))
    assert beads == [(i, i + 1, i, i + 1) for i in range(10)]
    assert alignment.align_lengths([], [], 0.96, 1.33) == []
    assert alignment.align_lengths([10, 20], [], 0.96, 1.33) == [(0, 1, 0, 0), (1, 2, 0, 0)]
