"""numformer's searches against the PyTorch decoder of ``tests/reference/torch_decode.py`` on the same weights.

In float64 the two systems (numformer's layers and search; torch ops with ``F.scaled_dot_product_attention``,
a ``torch.cat`` key/value cache and a torch re-write of the search rules) must find the same best hypothesis
for at least 99% of the sentences, with the same score. This is the check ``bench/decode.py`` reports on a
trained model, run here on small random models so that it is quick: beam 4 (alpha 0.6) and greedy, post-LN
tied and pre-LN untied, batches of mixed lengths with sentences finishing at different steps, and the
output budget (a * source length + b) short enough that EOS is forced for some; and a model with learned
positions (Table 3 row E), whose tables the torch decoder reads from the weights.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from numformer.model import Transformer
from numformer.presets import ModelConfig
from numformer.decoding.translation import DecodeOptions, translate_ids
from reference import torch_decode as td
from worst_error import record_worst

BOS, EOS = 1, 2


def _model(pre_norm: bool, tie: bool, seed: int, positional: str = "sinusoidal"):
    cfg = ModelConfig(vocab_size=48, d_model=32, d_ff=64, heads=4, layers=2, dropout=0.0, max_len=64,
                      pre_norm=pre_norm, tie_embeddings=tie, positional=positional)
    model = Transformer(cfg, seed=seed, dtype=np.float64)
    model.eval()
    return model


def _sentences(n: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    return [[int(x) for x in rng.integers(3, 48, int(rng.integers(1, 14)))] for _ in range(n)]


@pytest.mark.parametrize("beam", [4, 1], ids=["beam4", "greedy"])
@pytest.mark.parametrize("pre_norm,tie,positional", [(False, True, "sinusoidal"), (True, False, "sinusoidal"),
                                                     (False, True, "learned")],
                         ids=["post-LN-tied", "pre-LN-untied", "post-LN-tied-learned-positions"])
def test_same_hypotheses_as_torch_in_float64(beam, pre_norm, tie, positional):
    torch.set_num_threads(1)
    model = _model(pre_norm, tie, seed=7, positional=positional)
    ids = _sentences(60, seed=1)
    # b = 6: short budgets, so some hypotheses end by the forced EOS; max_tokens 80: several batches
    ours = translate_ids(model, ids, BOS, EOS, DecodeOptions(beam=beam, alpha=0.6, max_len_b=6, max_tokens=80))
    dec = td.TorchDecoder.from_numformer(model, torch.float64)
    theirs = td.translate_ids(dec, ids, BOS, EOS, beam, alpha=0.6, b=6, max_tokens=80)
    same = [o[0][0] == t.tokens for o, t in zip(ours, theirs)]
    assert sum(same) >= 0.99 * len(ids), f"{len(ids) - sum(same)} of {len(ids)} hypotheses differ"
    gaps = [abs(o[0][1] - t.score) for o, t, s in zip(ours, theirs, same) if s]
    record_worst("decode-vs-torch-score-float64", max(gaps), f"beam {beam}, {'pre' if pre_norm else 'post'}-LN")
    assert max(gaps) < 1e-9
    # the forced EOS was exercised: some outputs used the whole budget (source + EOS + 6 tokens, EOS included)
    assert any(len(t.tokens) == len(s) + 6 for t, s in zip(theirs, ids))


def test_torch_decoder_step_matches_full_decoder_in_float64():
    """The cached torch step equals numformer's uncached forward at every position (teacher forcing)."""
    model = _model(False, True, seed=3)
    src = np.array([[5, 6, 7, EOS, 0], [9, 10, 11, 12, EOS]], dtype=np.int64)
    tgt = np.array([[BOS, 4, 8, 15], [BOS, 16, 23, 42]], dtype=np.int64)
    full = model.forward(src, tgt)
    dec = td.TorchDecoder.from_numformer(model, torch.float64)
    with torch.inference_mode():
        memory, mask = dec.encode(torch.from_numpy(src))
        state = dec.start(memory, mask)
        for t in range(tgt.shape[1]):
            logits = dec.step(torch.from_numpy(tgt[:, t]), t, state).numpy()
            np.testing.assert_allclose(logits, full[:, t], rtol=1e-10, atol=1e-10)
