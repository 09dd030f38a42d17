"""numformer.kernels: every fast kernel equals the plain math it replaces, at the sizes training runs.

For each registered kernel (``numformer.kernels.registered()``), the fast and the plain
function run on the same inputs (``tests/reference/kernel_cases.py``) at the small preset's training shape (64 sentences x
about 40 tokens, d_model 256, 4 heads, vocabulary 8,000), at base's layer shapes
(d_model 512, 8 heads, d_ff 2048) and on a batch of one, with odd lengths, padding and
a source row that is all padding (fully masked attention rows), in float64 and float32,
with 2 and 3 host threads. Every output (and every array a kernel updates in place) must
agree with ``norm(fast - plain) / norm(plain) <= TOL[dtype]``. Each kernel also gets a
planted bug (a block of rows lost by the thread split, a mask not applied, duplicates
lost in a scatter-add) that this comparison must catch.

The decoding kernels return choices (top-n candidates, the greedy token): fast and plain
round differently in float32, so two candidates closer than that rounding could be ordered
either way on another CPU. The inputs are drawn from a fixed seed, so whether such a near-tie
exists is a property of the data, not of the machine:
``test_decoding_kernel_inputs_have_no_near_ties`` asserts that every choice compared is
separated from the next candidate by far more than float32 rounding.

The whole model against PyTorch at these sizes, on both kernel sets, is in
``test_torch_parity.py`` (``test_parity_at_training_sizes``).

``NUMFORMER_TEST_DEVICE=cuda`` runs the candidate side on cupy arrays (the plain math on
the GPU, since kernels hand cupy arrays to it) against the host's plain math: the GPU
acceptance command uses this.
"""
from __future__ import annotations

import contextlib
import copy
import importlib
import os
from pathlib import Path

import numpy as np
import pytest

from numformer import kernels
from numformer.backend import RandomState, to_host
from numformer.kernels.host import threads as kthreads
from numformer.kernels.twins import name_of
from numformer.kernels.decoding import top_n
from numformer.decoding.search import beam_candidates, greedy_pick
from numformer.layers.layernorm import layernorm_forward
from numformer.optim import adam_update
from reference.kernel_cases import PLAIN, SIZES, inputs
from numformer.decoding.search import ban_special, force_end, log_softmax
from support import threads  # noqa: F401  (the host thread count, a fixture)
from worst_error import record_worst

TOL = {np.float64: 1e-9, np.float32: 1e-4}
DEVICE = os.environ.get("NUMFORMER_TEST_DEVICE", "cpu")


def rel(a, b) -> float:
    """norm(a - b) / norm(b); equal entries (-inf scores of dead beams included) count as no difference."""
    a, b = np.asarray(to_host(a), dtype=np.float64), np.asarray(to_host(b), dtype=np.float64)
    with np.errstate(invalid="ignore"):  # inf - inf, where the two agree
        diff = np.where(a == b, 0.0, a - b)
    nb = np.linalg.norm(b[np.isfinite(b)])
    return float(np.linalg.norm(diff) / nb) if nb else float(np.linalg.norm(diff))




# Arguments a kernel may consume (their contents are unspecified afterwards): not compared.
CONSUMED = {"smoothed_cross_entropy:overwrite": {0}, "smoothed_cross_entropy_backward": {0},
            "beam_candidates": {0}, "greedy_pick": {0}}
# Outputs defined only in part: the index of a -inf candidate (a filler where fewer than n extensions
# exist, e.g. a sentence that may only end) is arbitrary, so it is compared as -1.
DEFINED = {"beam_candidates": lambda r: (np.where(np.isfinite(to_host(r[1])), to_host(r[0]), -1), r[1])}


def _to_device(args):
    import cupy  # noqa: PLC0415  (only with NUMFORMER_TEST_DEVICE=cuda)
    from numformer.backend import import_cupy  # noqa: PLC0415
    import_cupy()

    def move(a):
        if isinstance(a, np.ndarray):
            return cupy.asarray(a)
        if isinstance(a, list):
            return [move(x) for x in a]
        return a
    return tuple(move(a) for a in args)


def _arrays(result, args, consumed=()):
    """Everything to compare: the returned arrays, then the arrays of args (kernels may update them)."""
    args = [a for i, a in enumerate(args) if i not in consumed]
    out = []
    for r in result if isinstance(result, tuple) else (result,):
        if r is not None and not isinstance(r, (int, float)):
            out.append(r)
    for a in args:
        if isinstance(a, list):
            out += a
        elif hasattr(a, "shape") and not np.issubdtype(np.asarray(to_host(a)).dtype, np.bool_):
            out.append(a)
        elif isinstance(a, RandomState):
            out.append(np.frombuffer(repr(a.get_state()).encode(), dtype=np.uint8))  # where it left the generator
    return out


class _PoisonedNumpy:
    """numpy, except that ``empty``/``empty_like`` return arrays filled with NaN (True for bool):
    a kernel that leaves part of an output unwritten then shows it, instead of the allocator
    handing back a freed block that still holds the right values from an earlier run."""

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def _poison(a):
        a.fill(True if a.dtype == np.bool_ else np.nan if a.dtype.kind == "f" else 12345)
        return a

    def empty(self, shape, dtype=float, **kw):
        return self._poison(np.empty(shape, dtype=dtype, **kw))

    def empty_like(self, a, dtype=None, **kw):
        return self._poison(np.empty_like(a, dtype=dtype, **kw))


def host_kernel_modules() -> list:
    """The kernel files that allocate through numpy (``np``), found from the kernel registry, so a new
    kernel file is poisoned without being listed here (the decoding kernels go through ``xp``)."""
    names = sorted({fast.__module__ for fast in kernels.registered().values()})
    return [m for m in map(importlib.import_module, names) if getattr(m, "np", None) is not None]


@contextlib.contextmanager
def poisoned_allocations():
    """Every kernel module's ``np`` poisons its new arrays (an unpatched ``np`` only)."""
    mods = host_kernel_modules()
    saved = [m.np for m in mods]
    for m in mods:
        if m.np is np:
            m.np = _PoisonedNumpy()
    try:
        yield
    finally:
        for m, old in zip(mods, saved):
            m.np = old


def _copy(a):
    """An independent copy of one argument (a RandomState gets a twin at the same state)."""
    if isinstance(a, RandomState):
        twin = RandomState(a.seed)
        twin.set_state(a.get_state())
        return twin
    return copy.deepcopy(a)


def compare(name, size, dt, seed=0):
    """{output index: rel error} of the fast kernel against the plain function (fast runs first,
    on its own copy of the inputs, so no buffer of the plain run can be recycled into its outputs)."""
    plain = PLAIN[name]
    fast = kernels.fast_twin(plain)
    args = inputs(name, np.random.default_rng(seed), size, dt)
    fast_args = tuple(_copy(a) for a in args)
    if DEVICE != "cpu":
        fast_args = _to_device(fast_args)
        fast = plain
    consumed = CONSUMED.get(name, ())
    defined = DEFINED.get(name, lambda r: r)
    with poisoned_allocations():
        got = _arrays(defined(fast(*fast_args)), fast_args, consumed)
    want = _arrays(defined(plain(*args)), args, consumed)
    assert len(got) == len(want)
    return {i: rel(g, w) for i, (g, w) in enumerate(zip(got, want))}


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("name", list(PLAIN))
def test_fast_kernel_equals_plain_math(name, size, dtype, threads):
    errors = compare(name, size, dtype)
    for i, e in errors.items():
        record_worst(f"kernels-{np.dtype(dtype).name}", e, f"{name} at {size}, output {i}, {threads} threads")
    bad = {i: e for i, e in errors.items() if not e <= TOL[dtype]}
    assert not bad, f"{name} at {size}: outputs {bad} differ (tolerance {TOL[dtype]})"


# Candidates of magnitude up to ~30 (log-probabilities summed over a few steps) carry a float32 rounding
# of a few times 30 * 2**-24 ~ 2e-6 in either version; a gap ten times the worst of that cannot close.
MIN_CHOICE_GAP = 1e-4


def closest_choice_gap(name, args) -> float:
    """How much better each choice of the decoding kernel ``name`` on ``args`` is than the next candidate,
    at worst (float64, from the inputs as given); inf when no row has two finite candidates."""
    if name == "greedy_pick":
        logits, pad, bos, eos, force = args
        cand, n = force_end(ban_special(log_softmax(logits.astype(np.float64)), pad, bos), force, eos), 1
    else:
        logits, scores, n, pad, bos, eos, force = args
        m, k = scores.shape
        logp = ban_special(log_softmax(logits.astype(np.float64)), pad, bos).reshape(m, k, -1)
        cand = (scores.astype(np.float64)[:, :, None] + force_end(logp, force, eos)).reshape(m, -1)
    top = -np.sort(-cand, axis=1)[:, : n + 1]
    # Only finite neighbours can tie: a sentence whose budget is spent has EOS as its one candidate.
    finite = np.isfinite(top[:, 1:])
    with np.errstate(invalid="ignore"):  # -inf - -inf where both are fillers
        gaps = (top[:, :-1] - top[:, 1:])[finite]
    return float(gaps.min()) if gaps.size else float("inf")


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("name", ["greedy_pick", "beam_candidates"])
def test_decoding_kernel_inputs_have_no_near_ties(name, size):
    """Every choice the comparison checks is better than the next candidate by MIN_CHOICE_GAP (float64,
    from the float32 inputs the comparison uses): measured at least 6.8e-4."""
    args = inputs(name, np.random.default_rng(0), size, np.float32)  # the seed compare() uses
    closest = closest_choice_gap(name, args)
    assert closest > MIN_CHOICE_GAP, f"{name} at {size}: two candidates {closest:.2g} apart"


def test_a_planted_near_tie_is_seen():
    logits, pad, bos, eos, force = inputs("greedy_pick", np.random.default_rng(0), "base-layer-shape", np.float32)
    row = int(np.nonzero(~force)[0][0])
    allowed = np.arange(logits.shape[1]) > max(pad, bos)  # padding and BOS are banned
    best = int(np.argmax(np.where(allowed, logits[row], -np.inf)))
    other = best + 1 if best + 1 < logits.shape[1] else best - 1
    logits[row, other] = logits[row, best] - 1e-6
    assert closest_choice_gap("greedy_pick", (logits, pad, bos, eos, force)) < MIN_CHOICE_GAP


ROOT = Path(__file__).resolve().parents[2]


# Twins with no host kernel: on numpy arrays the switch runs the plain math, on cupy arrays a CUDA kernel,
# compared with the plain math (and its planted bugs caught) on the host emulator by the file named here
GPU_ONLY = {
    "numformer.optim.grad_norm": "tests/kernels/test_cuda_optimizer_on_host.py",
    "numformer.layers.dropout.dropout_forward": "tests/kernels/test_cuda_dropout_attention_on_host.py",
}


def test_every_kernel_is_compared():
    assert set(kernels.registered()) - set(GPU_ONLY) == {name_of(f) for f in PLAIN.values()}
    for name, test_file in GPU_ONLY.items():
        assert name in kernels.registered() and (ROOT / test_file).exists(), name


def test_every_twin_names_a_plain_function_of_the_math():
    """A kernel registers by the plain function's dotted name (the machinery never imports the math): each
    name must resolve to a function, or a renamed piece of math would silently lose its kernel."""
    for name, fast in kernels.registered().items():
        module, _, function = name.rpartition(".")
        plain = getattr(importlib.import_module(module), function, None)
        assert callable(plain), f"{fast.__name__} replaces {name}, which is no function"
        assert kernels.fast_twin(plain) is fast


# -- planted bugs: the comparison must catch each ---------------------------------------------
def _lose_last_block(splitter):
    """A splitter with an off-by-one: the last row block, range or task is never run."""
    if splitter is kthreads.parallel_tasks:
        def planted(fn, tasks, sizes=None):
            for t in list(tasks)[:-1]:
                fn(*t)
        return planted
    if splitter is kthreads.parallel_ranges:
        def planted(fn, n, work, *a, **kw):
            return [fn(0, max(n - 1, 0))] if n > 1 else []
        return planted

    def planted(fn, *arrays, **kw):
        n = arrays[0].shape[0]
        return [fn(*(x[: n - 1] for x in arrays))]
    return planted


@contextlib.contextmanager
def planted(module, attr, replacement):
    old = getattr(module, attr)
    setattr(module, attr, replacement)
    try:
        yield
    finally:
        setattr(module, attr, old)


def _module(name):
    import importlib  # noqa: PLC0415
    return importlib.import_module(f"numformer.kernels.{name}")


def _plants():
    """(case id, kernel name to compare, size, module, attribute, replacement)."""
    att, ln, li, re, em, lo, ad, dec = (_module(m) for m in ("attention", "layernorm", "linear", "relu", "embedding",
                                                             "loss", "adam", "decoding"))
    top_n = dec.top_n
    lose = _lose_last_block
    return [
        ("attention_forward: last batch range lost", "attention_forward", att, "parallel_ranges",
         lose(kthreads.parallel_ranges)),
        ("attention_forward: mask not applied", "attention_forward", att, "_batch_rows", lambda a, i, j: None),
        ("attention_backward: masked scores keep their gradient", "attention_backward", att, "_batch_rows",
         lambda a, i, j: None),
        ("attention_backward: last batch range lost", "attention_backward", att, "parallel_ranges",
         lose(kthreads.parallel_ranges)),
        ("layernorm_forward: last row block lost", "layernorm_forward", ln, "parallel_rows",
         lose(kthreads.parallel_rows)),
        ("layernorm_backward: last row block lost", "layernorm_backward", ln, "parallel_rows",
         lose(kthreads.parallel_rows)),
        ("linear_forward: the bias not added to the last row", "linear_forward", li, "_add_to_rows_",
         lambda y, b: np.add(y[:-1], b, out=y[:-1])),
        ("linear_backward: the bias gradient misses the last row", "linear_backward", li, "_column_sums",
         lambda a: np.ones(a.shape[0] - 1, dtype=a.dtype) @ a[:-1]),
        ("relu_forward: last row block lost", "relu_forward", re, "parallel_rows", lose(kthreads.parallel_rows)),
        ("relu_backward: last row block lost", "relu_backward", re, "parallel_rows", lose(kthreads.parallel_rows)),
        ("embedding_backward: repeated ids lost (fancy-index +=)", "embedding_backward", em, "_add_duplicates",
         lambda grad, ids, rows: None),
        ("smoothed_cross_entropy: last row block lost", "smoothed_cross_entropy", lo, "parallel_rows",
         lose(kthreads.parallel_rows)),
        ("smoothed_cross_entropy_backward: last row block lost", "smoothed_cross_entropy_backward", lo,
         "parallel_rows", lose(kthreads.parallel_rows)),
        ("adam_update: last block of the update lost", "adam_update", ad, "parallel_tasks",
         lose(kthreads.parallel_tasks)),
        ("beam_candidates: the last beams' extensions never searched", "beam_candidates", dec, "top_n",
         lambda a, n: top_n(a[:, : a.shape[1] // 2], n)),
        ("greedy_pick: log-probability without the log-sum-exp", "greedy_pick", dec, "_log_normaliser",
         lambda z: z.max(axis=-1, keepdims=True)),
        ("beam_candidates: the last sentence's block never searched", "beam_candidates", dec, "parallel_rows",
         lose(kthreads.parallel_rows)),
        ("greedy_pick: the last row's block never picked", "greedy_pick", dec, "parallel_rows",
         lose(kthreads.parallel_rows)),
    ]


PLANTS = _plants()


@pytest.mark.parametrize("plant", PLANTS, ids=[p[0] for p in PLANTS])
def test_planted_bug_is_caught(plant, threads):
    _, name, module, attr, replacement = plant
    assert max(compare(name, "small-train-shape", np.float64).values()) <= TOL[np.float64]
    with planted(module, attr, replacement):
        errors = compare(name, "small-train-shape", np.float64)
    assert not all(e <= TOL[np.float64] for e in errors.values()), f"planted bug not caught: {errors}"  # NaN counts


def test_every_kernel_has_a_planted_bug():
    covered = {PLAIN[p[1]] for p in PLANTS}
    assert {name_of(f) for f in covered} == set(kernels.registered()) - set(GPU_ONLY)








def test_switch_runs_the_plain_math():
    """kernel(f) is the fast version when kernels are on and f itself under kernel_mode('plain')."""
    fast = kernels.fast_twin(layernorm_forward)
    with kernels.kernel_mode("fast"):
        assert kernels.kernel(layernorm_forward).fast is fast  # taken for host arrays (twins.on_host)
    with kernels.kernel_mode("plain"):
        assert kernels.kernel(layernorm_forward) is layernorm_forward
    with pytest.raises(kernels.KernelModeError, match="fast or plain"):
        kernels.use_kernels("turbo")


def test_one_kernel_can_be_left_out():
    """set_disabled({'layernorm'}): LayerNorm runs its plain math, the other kernels stay fast."""
    previous = kernels.set_disabled({"layernorm"})
    try:
        with kernels.kernel_mode("fast"):
            assert kernels.kernel(layernorm_forward) is layernorm_forward
            assert kernels.kernel(adam_update).fast is kernels.fast_twin(adam_update)
    finally:
        kernels.set_disabled(previous)
    with pytest.raises(kernels.KernelModeError, match="unknown kernel"):
        kernels.set_disabled({"softmax_turbo"})


def test_environment_switch_reaches_a_fresh_process():
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415
    code = ("from numformer import kernels; from numformer.layers.layernorm import layernorm_forward as f; "
            "print(kernels.get_kernels(), kernels.kernel(f) is f)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "NUMFORMER_KERNELS": "plain"})
    assert out.stdout.split() == ["plain", "True"]


# -- the decoding kernels against the math written out here ----------------------------------------------------
# Beam candidates: the best n of ``scores + log_softmax(logits)`` per sentence with padding/BOS banned and,
# where the length budget is spent, EOS the only extension at the model's own EOS log-probability; greedy
# pick: the arg-max of the same log-probabilities and its value; top_n: the n largest entries of each row.
PAD, BOS, EOS = 0, 1, 2


def _expected_logp(logits, force):
    """log_softmax over the vocabulary, PAD and BOS at -inf, forced rows: only EOS, with its own value."""
    z = logits.astype(np.float64)
    logp = z - z.max(axis=-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(axis=-1, keepdims=True))
    logp[..., [PAD, BOS]] = -np.inf
    eos = logp[..., EOS].copy()
    logp[force] = -np.inf
    logp[..., EOS][force] = eos[force]
    return logp


@pytest.fixture(params=["fast", "plain"])
def mode(request):
    with kernels.kernel_mode(request.param):
        yield request.param


def test_beam_candidates_are_the_best_of_scores_plus_log_softmax(mode):
    rng = np.random.default_rng(0)
    m, k, v = 5, 3, 50
    logits = rng.standard_normal((m * k, v)) * 3
    scores = np.log(rng.uniform(0.01, 1, (m, k)))
    scores[1, 1:] = -np.inf  # a sentence at its first step: only beam 0 is live
    force = np.array([False, False, True, False, False])
    logp = _expected_logp(logits.reshape(m, k, v), force)
    cand = (scores[:, :, None] + logp).reshape(m, k * v)
    top, top_scores = kernels.kernel(beam_candidates)(logits.copy(), scores, 2 * k, PAD, BOS, EOS, force)
    expected = np.sort(cand, axis=1)[:, ::-1][:, : 2 * k]
    np.testing.assert_allclose(top_scores, expected, rtol=1e-12)
    np.testing.assert_allclose(np.take_along_axis(cand, top, axis=1), top_scores, rtol=1e-12)  # indices match values
    assert set((top[2][np.isfinite(top_scores[2])] % v).tolist()) == {EOS}  # forced: only EOS is finite
    # forced EOS keeps the model's own log-probability: beam j's candidate is scores[j] + log p(EOS | beam j)
    forced = top_scores[2][np.isfinite(top_scores[2])]
    np.testing.assert_allclose(np.sort(forced), np.sort(scores[2] + logp[2, :, EOS]), rtol=1e-12)
    assert (forced < scores[2].max()).all()  # a free EOS (log p 0) would score scores[2] itself
    assert not np.isin(top % v, [PAD, BOS])[np.isfinite(top_scores)].any()  # -inf ones are mere filler


def test_greedy_pick_is_the_argmax_of_log_softmax(mode):
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((6, 40)) * 4
    logits[3, PAD] = 100.0  # padding would win without the ban
    force = np.array([False, True, False, False, False, True])
    logp = _expected_logp(logits, force)
    nxt, gained = kernels.kernel(greedy_pick)(logits.copy(), PAD, BOS, EOS, force)
    np.testing.assert_array_equal(nxt, logp.argmax(axis=1))
    np.testing.assert_allclose(gained, logp.max(axis=1), rtol=1e-12, atol=1e-12)
    assert (gained[force] < 0).all()  # the model's own EOS log-probability, not a free 0


def test_top_n_finds_the_largest_entries_of_each_row():
    rng = np.random.default_rng(3)
    for width in (32000, 4 * 37, 97):  # grouped (16 | 32000), a smaller divisor (4), prime: whole-row fallback
        a = rng.standard_normal((7, width)).astype(np.float32)
        a[0, :] = -np.inf        # a row of -inf (all beams dead) still yields n entries
        a[1, ::3] = 5.0          # ties at the top
        idx, vals = top_n(a, 8)
        np.testing.assert_array_equal(np.take_along_axis(a, idx, axis=1), vals)
        np.testing.assert_array_equal(np.sort(vals, axis=1), np.sort(a, axis=1)[:, -8:])
        assert all(len(set(row)) == 8 for row in idx.tolist())  # 8 distinct columns
