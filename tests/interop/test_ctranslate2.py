"""numformer -> CTranslate2 (numformer.interop.ctranslate2): the engine computes numformer's model.

* ``score_batch``'s per-token log-probabilities (EOS included) equal numformer's teacher-forced ones, on the
  small trained reverse model and on random-weight models covering the spec's switches: pre-LN (final
  LayerNorms), SiLU, a frozen logits bias, untied embeddings, learned positions, another LayerNorm epsilon,
  heads of d_k != d_model / heads, and a model imported from Marian (the decoder starting from the pad row);
* every search goes through the one set of options :func:`numformer_search_options` gives (what bench/decode.py
  uses too): greedy ``translate_batch`` equals numformer's greedy search token for token, with numformer's
  per-sentence length limit reproduced as CTranslate2's per-call ``max_decoding_length`` (one call per limit),
  also where numformer's output is empty (a model whose first token is EOS for half the sources; without
  ``min_decoding_length=0`` the engine writes a token there instead, a planted bug that fails); beam search
  with alpha 0 equals numformer's (with alpha > 0 the length penalties' forms differ: not compared);
* planted bugs (no explicit position table, the embedding scale left out, a zero start embedding as CTranslate2's
  stock Marian loader sets) fail the comparison;
* a model CTranslate2 cannot hold (d_k != d_v), an output folder in the way and an unknown quantization are
  refused in one line, nothing written.

Tolerance of the float32 comparisons, ``LOGP_TOL = 1e-4`` absolute on each log-probability: both sides compute
in float32 (unit roundoff 6e-8) with different summation orders (NumPy's BLAS against CTranslate2's GEMMs) through
up to 3 + 3 layers. Measured: 8.5e-6 at worst on the trained reverse model (log-probabilities down to -14), 1.1e-6
on the random ones; against numformer in float64, CTranslate2 is off by 6.0e-6 where numformer's own float32 is
off by 5.9e-6, i.e. the engine's difference is float32 rounding of numformer's own size (checked below with a
factor 4 of room). 1e-4 leaves an order of magnitude for other BLAS libraries and CPUs, while each planted bug
moves log-probabilities by 8 or more (checked at 0.1). The int8 export stores exactly CTranslate2's rounding of
each weight (read back in float32, equal to numformer on the rounded weights to LOGP_TOL); computed in int8 it is
close, not equal (see its tests).
"""
import ast
from pathlib import Path

import numpy as np
import pytest

ctranslate2 = pytest.importorskip("ctranslate2")

from numformer.activations import ACTIVATIONS  # noqa: E402
from numformer.checkpoint import save_checkpoint, vocab_fingerprint  # noqa: E402
from numformer.checkpoint.trained_model import load_model  # noqa: E402
from numformer.data import SubwordVocab, make_synthetic  # noqa: E402
from numformer.decoding.search import beam_search, greedy_search, log_softmax, max_lengths  # noqa: E402
from numformer.decoding.translation import source_batch  # noqa: E402
from numformer.interop import InteropError  # noqa: E402
from numformer.interop import ctranslate2 as nct2  # noqa: E402
from numformer.model import Transformer  # noqa: E402
from numformer.presets import ModelConfig  # noqa: E402
from support import TEXT  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
LOGP_TOL = 1e-4   # float32 against float32, see the module docstring
INT8_MEAN_TOL = 1.0  # int8 weights and activations: the mean |difference| of the log-probabilities (see its test)


# -- both sides' numbers ---------------------------------------------------------------------------------------
def numformer_logprobs(model, vocab, src: list, tgt: list) -> list:
    """Teacher-forced log p(y_t | y_<t, x) of every target token and the final EOS, per sentence: from
    ``model(src + EOS, BOS + tgt)``'s logits, log-softmax in float64 at the target tokens."""
    xs = source_batch(src, model.cfg.pad_id, vocab.eos_id)
    t = max(len(y) for y in tgt) + 1
    tgt_in = np.full((len(tgt), t), model.cfg.pad_id, dtype=np.int64)
    for i, y in enumerate(tgt):
        tgt_in[i, : len(y) + 1] = [vocab.bos_id] + list(y)
    logp = log_softmax(np.asarray(model(xs, tgt_in), dtype=np.float64))
    return [logp[i, np.arange(len(y) + 1), list(y) + [vocab.eos_id]] for i, y in enumerate(tgt)]


def engine_logprobs(translator, vocab, src: list, tgt: list) -> list:
    """CTranslate2's ``score_batch`` log-probabilities (it adds EOS to the source, the start token and EOS to the
    target), per sentence."""
    tokens = nct2.ct2_tokens(vocab)
    found = translator.score_batch([[tokens[i] for i in s] for s in src], [[tokens[i] for i in y] for y in tgt],
                                   max_input_length=0)
    return [np.asarray(r.log_probs, dtype=np.float64) for r in found]


def worst_difference(model, vocab, translator, src, tgt) -> float:
    ours, theirs = numformer_logprobs(model, vocab, src, tgt), engine_logprobs(translator, vocab, src, tgt)
    assert [len(a) for a in ours] == [len(b) for b in theirs]
    return max(float(np.abs(a - b).max()) for a, b in zip(ours, theirs))


def mean_difference(model, vocab, translator, src, tgt) -> float:
    """The mean |difference| of all the teacher-forced log-probabilities (int8's measure: its worst entries are
    the rounding of a few large activations)."""
    ours, theirs = numformer_logprobs(model, vocab, src, tgt), engine_logprobs(translator, vocab, src, tgt)
    return float(np.abs(np.concatenate(ours) - np.concatenate(theirs)).mean())


def engine_search(translator, vocab, src: list, limits, beam: int = 1, alpha: float = 0.0, without=()) -> list:
    """CTranslate2's outputs (ids, without EOS) under numformer's rules: the options of
    :func:`nct2.numformer_search_options` for each sentence's numformer limit (one call per distinct limit: the
    engine's limit is per call). ``without``: options left out (a planted bug: CTranslate2's default instead)."""
    tokens = nct2.ct2_tokens(vocab)
    index = {t: i for i, t in enumerate(tokens)}
    out = [None] * len(src)
    for limit in sorted(set(int(x) for x in limits)):
        rows = [i for i, x in enumerate(limits) if x == limit]
        options = nct2.numformer_search_options(vocab, beam, alpha, limit)
        for name in without:
            del options[name]
        found = translator.translate_batch([[tokens[k] for k in src[i]] for i in rows], **options)
        for i, r in zip(rows, found):
            out[i] = [index[t] for t in r.hypotheses[0]]
    return out


def numformer_greedy(model, vocab, src: list, a: float, b: int):
    """numformer's greedy outputs (ids, without EOS) and each sentence's output limit."""
    xs = source_batch(src, model.cfg.pad_id, vocab.eos_id)
    hyps = greedy_search(model, xs, vocab.bos_id, vocab.eos_id, a, b)
    return [h.tokens for h in hyps], max_lengths(xs, model.cfg.pad_id, a, b, model.cfg.max_len)


# -- models ----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def reverse(reverse_model, tmp_path_factory):
    """The small trained reverse model (tests/interop/conftest.py), loaded as translate.py loads it, exported
    through the command's function, and 86 sources as ids: its 50 test lines and 36 more of 2 to 9 symbols
    (longer than it trained on: some outputs are wrong, all are varied)."""
    path, _, lines = reverse_model
    model, vocab, _ = load_model(path)
    out = nct2.export_ctranslate2(path, tmp_path_factory.mktemp("ct2") / "reverse")
    translator = ctranslate2.Translator(str(out), intra_threads=1)
    more = make_synthetic("reverse", 1, 0, 36, seed=7, vocab=tuple("abcdefghijkl"), min_len=2, max_len=9)["test"][0]
    return model, vocab, translator, vocab.encode_source(list(lines) + more)


@pytest.fixture(scope="module")
def small_vocab(tmp_path_factory):
    return SubwordVocab.train(TEXT, tmp_path_factory.mktemp("spm") / "spm", 120)


def random_model(vocab, seed=1, **changes):
    """A random-weight model of 2 encoder and 3 decoder layers; a logits bias gets random values."""
    cfg = ModelConfig(vocab_size=vocab.size, d_model=16, d_ff=32, heads=2, layers=2, decoder_layers=3, max_len=64,
                      pad_id=vocab.pad_id, **changes).checked()
    model = Transformer(cfg, seed=seed).eval()
    if cfg.logits_bias:
        model.final_logits_bias[:] = np.random.default_rng(seed).standard_normal(cfg.vocab_size).astype(np.float32)
    return model


def random_pairs(vocab, n=12, seed=0):
    """``n`` (source, target) id lists of ordinary pieces (ids 4 and up), lengths 1 to 10."""
    rng = np.random.default_rng(seed)
    draw = lambda: [int(x) for x in rng.integers(4, vocab.size, rng.integers(1, 11))]  # noqa: E731
    return [draw() for _ in range(n)], [draw() for _ in range(n)]


def engine(model, vocab, folder, converter=None, quantization=None, compute_type="default"):
    conv = converter or nct2.converter_class().from_model(model, vocab)
    out = nct2.convert(conv, folder, quantization)
    return ctranslate2.Translator(str(out), intra_threads=1, compute_type=compute_type)


# -- (a) scores --------------------------------------------------------------------------------------------------
def test_scores_equal_numformer_on_the_trained_model(reverse):
    model, vocab, translator, src = reverse
    refs = [s[::-1] for s in src]                   # the task's answers (log p near 0)
    _, others = random_pairs(vocab, len(src), seed=3)  # and unlikely targets (log p far below)
    assert worst_difference(model, vocab, translator, src, refs) < LOGP_TOL
    assert worst_difference(model, vocab, translator, src, others) < LOGP_TOL


def test_the_engine_is_as_close_to_float64_as_numformers_float32(reverse):
    """Against the exact values (numformer in float64 on the same weights), CTranslate2's float32 differs by no
    more than a few times what numformer's own float32 does: the difference is rounding, not a mapping error."""
    model, vocab, translator, src = reverse
    exact = Transformer(model.cfg, seed=0, dtype=np.float64)
    exact.load_state_dict(model.state_dict())
    exact.eval()
    _, tgt = random_pairs(vocab, len(src), seed=3)
    truth = np.concatenate(numformer_logprobs(exact, vocab, src, tgt))
    ours = np.abs(np.concatenate(numformer_logprobs(model, vocab, src, tgt)) - truth).max()
    theirs = np.abs(np.concatenate(engine_logprobs(translator, vocab, src, tgt)) - truth).max()
    assert theirs <= 4 * ours + 1e-6, (theirs, ours)


@pytest.mark.parametrize("changes", [
    dict(pre_norm=True),                                                   # final LayerNorm of each stack
    dict(activation="silu", logits_bias=True, tie_embeddings=False),        # SWISH, projection bias, 3 matrices
    dict(positional="learned", ln_eps=1e-1, pre_norm=True),                 # a learned table, CT2's epsilon
    dict(d_k=12, d_v=12),                                                  # head_dim != d_model / heads
    *[dict(activation=name) for name in ACTIVATIONS if name not in ("relu", "silu")],  # GELU, ...: the table's
], ids=["pre-LN", "silu-bias-untied", "learned-eps", "head-dim", *[n for n in ACTIVATIONS if n not in ("relu", "silu")]])
def test_scores_equal_numformer_on_random_models(small_vocab, tmp_path, changes):
    model = random_model(small_vocab, **changes)
    src, tgt = random_pairs(small_vocab)
    translator = engine(model, small_vocab, tmp_path / "ct2")
    assert worst_difference(model, small_vocab, translator, src, tgt) < LOGP_TOL


@pytest.fixture
def marian_swish(request):
    """The session's Marian import with SiLU (tests/interop/conftest.py), when transformers is installed."""
    pytest.importorskip("transformers")
    return request.getfixturevalue("marian")("swish")


def test_a_model_imported_from_marian_starts_from_its_pad_row(marian_swish, tmp_path):
    """A Marian import: eos 0, pad = bos = V-1 (the decoder starts from the pad row as the model holds it), SiLU,
    a non-zero logits bias, 2 + 3 layers."""
    case = marian_swish
    model, vocab, _ = load_model(case.npz)
    assert vocab.bos_id == vocab.pad_id == vocab.size - 1 and model.cfg.logits_bias
    translator = ctranslate2.Translator(str(nct2.export_ctranslate2(case.npz, tmp_path / "ct2")), intra_threads=1)
    src, tgt = random_pairs(vocab, seed=5)
    src = [[t for t in s if t not in (vocab.eos_id, vocab.unk_id, vocab.pad_id)] or [4] for s in src]
    tgt = [[t for t in y if t not in (vocab.eos_id, vocab.unk_id, vocab.pad_id)] or [4] for y in tgt]
    assert worst_difference(model, vocab, translator, src, tgt) < LOGP_TOL


def ct2_int8_rounded(model):
    """numformer's ``model`` with every weight CTranslate2's int8 export quantizes replaced by what the engine
    reads back: per output unit (a Linear's column, an embedding's row), ``scale = 127 / max |w|`` in float32,
    ``q = rint(w * scale)``, ``w' = q / scale`` (ctranslate2.specs.model_spec's int8 branch). The position table
    is not quantized."""
    rounded = {}
    for name, w in model.state_dict().items():
        if w.ndim == 2 and not name.endswith("_pos.weight"):
            axis = 1 if name in ("src_embed.weight", "tgt_embed.weight", "generator.weight") else 0
            amax = np.abs(w).max(axis=axis, keepdims=True).astype(np.float32)
            amax[amax == 0] = 127.0
            scale = np.float32(127.0) / amax
            w = (np.rint(w * scale) / scale).astype(w.dtype)
        rounded[name] = w
    out = Transformer(model.cfg, seed=0, dtype=model.src_embed.weight.data.dtype)
    out.load_state_dict(rounded)
    return out.eval()


def plant_wrong_int8_scale(monkeypatch, factor):
    """A planted bug: every int8 weight's scale stored ``factor`` times too large (the weights read back
    ``factor`` times too small)."""
    from ctranslate2.specs import model_spec

    real = model_spec.LayerSpec._quantize

    def quantize(self, quantization, variable_filter=None):
        real(self, quantization, variable_filter)

        def off(spec, name, value):
            if name.endswith("_scale") and isinstance(value, model_spec.NumpyVariable) and value.array.ndim == 1:
                value.array *= np.float32(factor)
        self._visit(off)
    monkeypatch.setattr(model_spec.LayerSpec, "_quantize", quantize)


def test_int8_export_stores_ctranslate2s_rounding_of_every_weight(reverse, tmp_path):
    """``quantization="int8"`` stores 8-bit weights (model.bin under half of the float32 weights' bytes). Read
    back in float32 (``compute_type="float32"``: the engine dequantizes each weight, then computes as in the
    float32 tests), the model equals numformer on the same weights rounded as CTranslate2 rounds them to
    ``LOGP_TOL``: what the export stores is exact, on every CPU (measured 7.2e-6; the rounding itself moves the
    log-probabilities by 0.24 at worst on this model)."""
    model, vocab, _, src = reverse
    translator = engine(model, vocab, tmp_path / "ct2", quantization="int8", compute_type="float32")
    assert (tmp_path / "ct2" / "model.bin").stat().st_size < 0.5 * sum(v.nbytes for v in model.state_dict().values())
    _, others = random_pairs(vocab, len(src), seed=3)
    for tgt in ([s[::-1] for s in src], others):
        assert worst_difference(ct2_int8_rounded(model), vocab, translator, src, tgt) < LOGP_TOL


def test_int8_computation_stays_within_what_every_int8_gemm_changes(reverse, tmp_path):
    """CTranslate2 computing in int8 (activations quantized per row on the fly) is close, not equal, and how close
    depends on the int8 GEMM the engine picks for the CPU, not on numformer. Measured on this model (mean
    |difference| of the log-probabilities, greedy outputs equal of 86) under every backend and ISA reachable on
    x86 (docs/guarantees.md): MKL (Intel's default, ``CT2_USE_MKL=1``) 0.037, 82; oneDNN with AVX-512 VNNI 0.04;
    oneDNN without VNNI (AMD's default before Zen 4; ``CT2_FORCE_CPU_ISA`` GENERIC, AVX and AVX2 and
    ``ONEDNN_MAX_CPU_ISA`` SSE41 to AVX2 all alike) 0.443, 38: its u8 x s8 products are summed in pairs into
    int16, which saturates. ``INT8_MEAN_TOL`` = 1.0 clears the worst with a factor 2.2 of margin. A scale twice
    too large moves the mean to 2.75 (MKL) and 2.78 (oneDNN) and fails here; one 10% off (0.76 and 1.00) is
    within the engine's own spread, and the float32 read-back above is what catches it."""
    model, vocab, _, src = reverse
    translator = engine(model, vocab, tmp_path / "ct2", quantization="int8")
    assert translator.compute_type.startswith("int8")
    assert mean_difference(model, vocab, translator, src, [s[::-1] for s in src]) < INT8_MEAN_TOL


def test_a_scale_10_percent_off_fails_the_read_back(reverse, tmp_path, monkeypatch):
    model, vocab, _, src = reverse
    plant_wrong_int8_scale(monkeypatch, 1.1)
    stored = engine(model, vocab, tmp_path / "ct2", quantization="int8", compute_type="float32")
    worst = worst_difference(ct2_int8_rounded(model), vocab, stored, src, [s[::-1] for s in src])
    assert worst > 100 * LOGP_TOL, worst


def test_a_scale_twice_too_large_fails_the_int8_computation(reverse, tmp_path, monkeypatch):
    model, vocab, _, src = reverse
    plant_wrong_int8_scale(monkeypatch, 2.0)
    computed = engine(model, vocab, tmp_path / "ct2", quantization="int8")
    mean = mean_difference(model, vocab, computed, src, [s[::-1] for s in src])
    assert mean > INT8_MEAN_TOL, mean


# -- (b) greedy --------------------------------------------------------------------------------------------------
def test_greedy_equals_numformer_on_the_trained_model(reverse):
    model, vocab, translator, src = reverse
    assert len(src) == 86
    ours, limits = numformer_greedy(model, vocab, src, 1.0, 50)
    assert engine_search(translator, vocab, src, limits) == ours
    assert len({tuple(o) for o in ours}) > len(src) // 2    # varied outputs, not one answer for all


def test_greedy_equals_numformer_where_the_limit_cuts(small_vocab, tmp_path):
    """A random pre-LN model seldom ends by itself: the length limit (a = 0.5, b = 2) ends most outputs, so
    numformer's forced EOS at L tokens and CTranslate2's max_decoding_length L - 1 must agree."""
    model = random_model(small_vocab, seed=4, pre_norm=True)
    translator = engine(model, small_vocab, tmp_path / "ct2")
    src, _ = random_pairs(small_vocab, 30, seed=6)
    ours, limits = numformer_greedy(model, small_vocab, src, 0.5, 2)
    assert sum(len(o) == lim - 1 for o, lim in zip(ours, limits)) >= 10   # the limit did cut
    assert engine_search(translator, small_vocab, src, limits) == ours


@pytest.fixture(scope="module")
def eos_first(reverse, tmp_path_factory):
    """The trained reverse model given a frozen logits bias that raises EOS by the median, over the 86 sources,
    of its first-step margin (the best other token's logit minus EOS's): about half the sources' greedy outputs
    are empty (EOS first), the others not. (model, vocab, translator, sources)."""
    model, vocab, _, src = reverse
    biased = Transformer(model.cfg.replace(logits_bias=True), seed=0)
    biased.load_state_dict(dict(model.state_dict(), final_logits_bias=np.zeros(model.cfg.vocab_size, np.float32)))
    biased.eval()
    xs = source_batch(src, model.cfg.pad_id, vocab.eos_id)
    first = np.asarray(biased(xs, np.full((len(src), 1), vocab.bos_id)), dtype=np.float64)[:, 0, :]
    first[:, [model.cfg.pad_id, vocab.bos_id]] = -np.inf          # never generated (ban_special)
    margin = np.delete(first, vocab.eos_id, axis=1).max(axis=1) - first[:, vocab.eos_id]
    biased.final_logits_bias[vocab.eos_id] = np.float32(np.median(margin))
    return biased, vocab, engine(biased, vocab, tmp_path_factory.mktemp("ct2_eos") / "ct2"), src


def test_greedy_equals_numformer_where_numformer_outputs_nothing(eos_first):
    model, vocab, translator, src = eos_first
    ours, limits = numformer_greedy(model, vocab, src, 1.0, 50)
    empty = sum(not o for o in ours)
    assert 10 <= empty <= len(src) - 10, empty          # measured: 43 of 86 empty, the others not
    assert engine_search(translator, vocab, src, limits) == ours


def test_without_min_decoding_length_0_the_engine_fills_every_empty_output(eos_first):
    """The planted bug: CTranslate2's default ``min_decoding_length=1`` bans EOS at the first step."""
    model, vocab, translator, src = eos_first
    ours, limits = numformer_greedy(model, vocab, src, 1.0, 50)
    theirs = engine_search(translator, vocab, src, limits, without=("min_decoding_length",))
    assert all(len(t) >= 1 for o, t in zip(ours, theirs) if not o)
    assert [t for o, t in zip(ours, theirs) if o] == [o for o in ours if o]   # the rest is untouched


def numformer_beam(model, vocab, src: list, beam: int, alpha: float, a: float = 1.0, b: int = 50):
    xs = source_batch(src, model.cfg.pad_id, vocab.eos_id)
    return [hyps[0].tokens for hyps in beam_search(model, xs, vocab.bos_id, vocab.eos_id, beam, alpha, a, b)]


@pytest.mark.parametrize("which", ["trained", "eos-first"])
def test_beam_search_with_alpha_0_equals_numformer(reverse, eos_first, which):
    """With alpha 0 no length penalty's form is in the way: beam 4 gives numformer's best hypothesis, empty ones
    included (measured: 86 of 86 on both; with alpha 0.6 the penalties' two forms agree on 72 of the 86
    eos-first sources, which is why no equality is asserted there)."""
    model, vocab, translator, src = reverse if which == "trained" else eos_first
    ours = numformer_beam(model, vocab, src, 4, 0.0)
    limits = max_lengths(source_batch(src, model.cfg.pad_id, vocab.eos_id), model.cfg.pad_id, 1.0, 50,
                         model.cfg.max_len)
    assert engine_search(translator, vocab, src, limits, beam=4, alpha=0.0) == ours


def test_the_search_options_are_numformers_rules(reverse):
    _, vocab, _, _ = reverse
    greedy = nct2.numformer_search_options(vocab, 1, 0.6, 12)
    assert (greedy["beam_size"], greedy["min_decoding_length"], greedy["max_decoding_length"],
            greedy["length_penalty"], greedy["max_input_length"]) == (1, 0, 11, 0.0, 0)
    assert greedy["end_token"] == "</s>" and greedy["return_end_token"] is False
    assert greedy["suppress_sequences"] == [["<pad>"], ["<s>"]]
    assert nct2.numformer_search_options(vocab, 4, 0.6, 12)["length_penalty"] == 0.6
    assert nct2.numformer_search_options(vocab, 4, 0.0, 12)["length_penalty"] == nct2.RAW_SCORE_PENALTY
    with pytest.raises(InteropError, match="limit of 1 token"):
        nct2.numformer_search_options(vocab, 1, 0.0, 1)


# -- (c) planted bugs --------------------------------------------------------------------------------------------
def planted(change):
    """A NumformerConverter whose spec gets ``change(spec)`` before it is written."""
    from ctranslate2.specs import model_spec

    base = nct2.converter_class()

    class Planted(base):
        def _load(self):
            spec = super()._load()
            change(spec, model_spec.OPTIONAL)
            return spec
    return Planted


def _no_positions(spec, optional):   # CTranslate2's own table: sin and cos in halves, from position 1
    spec.encoder.position_encodings.encodings = optional
    spec.decoder.position_encodings.encodings = optional


def _unscaled(spec, optional):
    spec.encoder.scale_embeddings = False
    spec.decoder.scale_embeddings = False


def _zero_start(spec, optional):      # what CTranslate2's stock Marian loader sets
    spec.decoder.start_from_zero_embedding = True


@pytest.mark.parametrize("change", [_no_positions, _unscaled, _zero_start],
                         ids=["no-positions", "unscaled", "zero-start"])
def test_a_planted_bug_fails_the_comparison(reverse, tmp_path, change):
    model, vocab, _, src = reverse
    bad = planted(change).from_model(model, vocab)
    translator = engine(model, vocab, tmp_path / "ct2", converter=bad)
    worst = worst_difference(model, vocab, translator, src, [s[::-1] for s in src])
    assert worst > 1000 * LOGP_TOL, worst      # measured: 8.8 (no positions), 9.9 (unscaled), 10.7 (zero start)


# -- (d) refusals ------------------------------------------------------------------------------------------------
def test_a_model_ctranslate2_cannot_hold_is_one_line(small_vocab, tmp_path):
    model = random_model(small_vocab, d_k=4, d_v=8)
    path = tmp_path / "dk.npz"
    meta = {"model_config": model.cfg.to_dict(), "vocab_sha256": vocab_fingerprint(small_vocab), "step": 1}
    save_checkpoint(path, model.state_dict(), meta, vocab=small_vocab.to_bytes())
    with pytest.raises(InteropError) as err:
        nct2.export_ctranslate2(path, tmp_path / "ct2")
    assert "d_k 4 != d_v 8" in str(err.value) and len(str(err.value).splitlines()) == 1
    assert not (tmp_path / "ct2").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["dk.npz"]     # no staging folder left


def test_an_output_folder_in_the_way_and_an_unknown_quantization_are_one_line(reverse_model, tmp_path):
    (tmp_path / "ct2").mkdir()
    (tmp_path / "ct2" / "keep").write_text("x")
    with pytest.raises(InteropError, match="already exists and is not empty"):
        nct2.export_ctranslate2(reverse_model[0], tmp_path / "ct2")
    assert [p.name for p in (tmp_path / "ct2").iterdir()] == ["keep"]
    with pytest.raises(InteropError, match="unknown CTranslate2 quantization 'int3'"):
        nct2.export_ctranslate2(reverse_model[0], tmp_path / "new", quantization="int3")
    assert not (tmp_path / "new").exists()


def test_without_ctranslate2_the_export_is_one_line(reverse_model, tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "ctranslate2", None)   # what an installation without it raises
    with pytest.raises(InteropError, match="needs the ctranslate2 package"):
        nct2.export_ctranslate2(reverse_model[0], tmp_path / "ct2")
    assert not (tmp_path / "ct2").exists()


def test_the_vocabulary_and_special_tokens_are_numformers(reverse):
    model, vocab, translator, _ = reverse
    tokens = nct2.ct2_tokens(vocab)
    assert tokens[:4] == ["<pad>", "<unk>", "<s>", "</s>"] and len(tokens) == model.cfg.vocab_size
    assert nct2.suppressed(vocab) == [["<pad>"], ["<s>"]]


def test_numformer_imports_ctranslate2_only_inside_functions():
    offenders = []
    for path in sorted((ROOT / "numformer").rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] == "ctranslate2"]
    assert not offenders, offenders


def test_the_export_command_writes_a_ctranslate2_model(reverse_model, tmp_path, capsys):
    """``python -m numformer.checkpoint export MODEL --format ctranslate2`` (and a misplaced --quantization)."""
    import ctranslate2

    from numformer.checkpoint_command import main
    from support import run_main

    model_file = reverse_model[0]
    code, out, err = run_main(main, ["export", str(model_file), "--format", "ctranslate2", "--quantization", "int8",
                                     "--out", str(tmp_path / "ct2")], capsys)
    assert code == 0, err
    assert ctranslate2.Translator(str(tmp_path / "ct2")).score_batch([["▁a"]], [["▁a"]])
    code, _, err = run_main(main, ["export", str(model_file), "--quantization", "int8", "--out",
                                   str(tmp_path / "m.npz")], capsys)
    assert code == 2 and "--format ctranslate2 only" in err and not (tmp_path / "m.npz").exists()
