"""numformer.kernels: every fast kernel equals the plain math it replaces, at the sizes training runs.

For each registered kernel (``numformer.kernels.registered()``), the fast and the plain
function run on the same inputs at the small preset's training shape (64 sentences x
about 40 tokens, d_model 256, 4 heads, vocabulary 8,000), at base's layer shapes
(d_model 512, 8 heads, d_ff 2048) and on a batch of one, with odd lengths, padding and
a source row that is all padding (fully masked attention rows), in float64 and float32,
with 2 and 3 host threads. Every output (and every array a kernel updates in place) must
agree with ``norm(fast - plain) / norm(plain) <= TOL[dtype]``. Each kernel also gets a
planted bug (a block of rows lost by the thread split, a mask not applied, duplicates
lost in a scatter-add) that this comparison must catch.

The whole model against PyTorch at these sizes, on both kernel sets, is in
``test_torch_parity.py`` (``test_parity_at_training_sizes``).

``NUMFORMER_TEST_DEVICE=cuda`` runs the candidate side on cupy arrays (the plain math on
the GPU, since kernels hand cupy arrays to it) against the host's plain math: the GPU
acceptance command uses this. Dropout is host-only there (the GPU draws other bits).
"""
from __future__ import annotations

import contextlib
import copy
import os

import numpy as np
import pytest

from numformer import kernels
from numformer.backend import RandomState, to_host
from numformer.decode import beam_candidates, greedy_pick
from numformer.kernels import threads as kthreads
from numformer.layers.attention import attention_backward, attention_forward
from numformer.layers.dropout import dropout_backward, dropout_forward, dropout_mask
from numformer.layers.embedding import embedding_backward
from numformer.layers.layernorm import layernorm_backward, layernorm_forward
from numformer.layers.linear import linear_backward, linear_forward
from numformer.layers.relu import relu_backward, relu_forward
from numformer.loss import smoothed_cross_entropy, smoothed_cross_entropy_backward
from numformer.model import causal_mask, padding_mask
from numformer.optim import adam_update

TOL = {np.float64: 1e-9, np.float32: 1e-4}
DEVICE = os.environ.get("NUMFORMER_TEST_DEVICE", "cpu")
# (batch, source length, target length, d_model, heads, d_ff, vocab)
SIZES = {
    "small-train-shape": (64, 41, 39, 256, 4, 1024, 8000),
    "base-layer-shape": (8, 35, 29, 512, 8, 2048, 8000),
    "batch-of-one": (1, 57, 53, 512, 8, 2048, 8000),
}


def rel(a, b) -> float:
    """norm(a - b) / norm(b); equal entries (-inf scores of dead beams included) count as no difference."""
    a, b = np.asarray(to_host(a), dtype=np.float64), np.asarray(to_host(b), dtype=np.float64)
    with np.errstate(invalid="ignore"):  # inf - inf, where the two agree
        diff = np.where(a == b, 0.0, a - b)
    nb = np.linalg.norm(b[np.isfinite(b)])
    return float(np.linalg.norm(diff) / nb) if nb else float(np.linalg.norm(diff))


@pytest.fixture(params=[2, 3], ids=lambda n: f"{n}threads")
def threads(request):
    old = kthreads.get_num_threads()
    kthreads.set_num_threads(request.param)
    yield request.param
    kthreads.set_num_threads(old)


# -- inputs at real sizes ---------------------------------------------------------------------
def _masks(rng, b, s, t):
    """Source padding mask with row 7 (when there is one) all padding, and the causal target mask."""
    s_len = rng.integers(s // 3, s + 1, b)
    s_len[0] = s
    t_len = rng.integers(2, t + 1, b)
    t_len[0] = t
    if b > 7:
        s_len[7] = 0
    src = np.where(np.arange(s)[None] < s_len[:, None], 5, 0)
    tgt = np.where(np.arange(t)[None] < t_len[:, None], 5, 0)
    return padding_mask(src, 0), causal_mask(t) & padding_mask(tgt, 0)


def _heads(rng, b, t, h, d, dt):
    """A (B, h, T, d) strided view of a (B, T, h*d) projection, as MultiHeadAttention passes it."""
    return rng.standard_normal((b, t, h * d)).astype(dt).reshape(b, t, h, d).transpose(0, 2, 1, 3)


def inputs(name, rng, size, dt):
    """Arguments of the plain function ``name`` at ``size``; arrays only where the call takes arrays."""
    b, s, t, d, h, dff, v = SIZES[size]
    n = b * s
    if name in ("attention_forward", "attention_backward"):
        src_mask, tgt_mask = _masks(rng, b, s, t)
        q, k, vv = _heads(rng, b, t, h, d // h, dt), _heads(rng, b, s, h, d // h, dt), _heads(rng, b, s, h, d // h, dt)
        scale = 1.0 / np.sqrt(d // h)
        if name == "attention_forward":
            return (q, k, vv, ~src_mask, scale)
        out, p, _ = attention_forward(q, k, vv, ~src_mask, scale)
        dout = rng.standard_normal(out.shape).astype(dt)
        return (dout, q, k, vv, p, p, ~src_mask, scale)
    if name == "attention_forward:causal":
        src_mask, tgt_mask = _masks(rng, b, s, t)
        q, k, vv = (_heads(rng, b, t, h, d // h, dt) for _ in range(3))
        return (q, k, vv, ~tgt_mask, 1.0 / np.sqrt(d // h))
    if name == "layernorm_forward":
        return (3 * rng.standard_normal((n, d)).astype(dt) + 1, 1 + rng.standard_normal(d).astype(dt),
                rng.standard_normal(d).astype(dt), 1e-5)
    if name == "layernorm_backward":
        x = 3 * rng.standard_normal((n, d)).astype(dt) + 1
        gamma = 1 + rng.standard_normal(d).astype(dt)
        _, xhat, r = layernorm_forward(x, gamma, np.zeros(d, dt), 1e-5)
        return (rng.standard_normal((n, d)).astype(dt), xhat, r, gamma)
    if name in ("dropout_forward", "dropout_forward:add"):
        x = rng.standard_normal((b, s, d)).astype(dt)
        return (x, RandomState(int(rng.integers(1 << 30))), 0.1,
                rng.standard_normal(x.shape).astype(dt) if name.endswith("add") else None)
    if name == "dropout_backward":
        return (rng.standard_normal((b, s, dff)).astype(dt),
                dropout_mask(RandomState(3), (b, s, dff), 0.1, dt))
    if name == "relu_forward":
        return (rng.standard_normal((b, s, dff)).astype(dt),)
    if name == "relu_backward":
        return (rng.standard_normal((b, s, dff)).astype(dt), rng.standard_normal((b, s, dff)) > 0)
    if name == "linear_forward":
        return (rng.standard_normal((n, d)).astype(dt), rng.standard_normal((d, dff)).astype(dt),
                rng.standard_normal(dff).astype(dt))
    if name == "linear_backward":
        return (rng.standard_normal((n, dff)).astype(dt), rng.standard_normal((n, d)).astype(dt),
                rng.standard_normal((d, dff)).astype(dt), True)
    if name == "embedding_backward":
        ids = rng.integers(1, v, n)
        ids[: n // 4] = 17  # many repeats of one id (a frequent token), as in real batches
        return (np.zeros((v, d), dt), ids, rng.standard_normal((n, d)).astype(dt), float(np.sqrt(d)))
    if name in ("smoothed_cross_entropy", "smoothed_cross_entropy:overwrite"):
        return (3 * rng.standard_normal((b * t, v)).astype(dt), rng.integers(0, v, b * t), 0.1, True,
                name.endswith("overwrite"))
    if name == "smoothed_cross_entropy_backward":
        z = 3 * rng.standard_normal((b * t, v)).astype(dt)
        y = rng.integers(0, v, b * t)
        _, _, p = smoothed_cross_entropy(z, y, 0.1)
        weight = (y % 5 != 0).astype(dt) / np.asarray(b * t, dtype=dt)   # some rows padding
        return (p, y, 0.1, weight)
    if name in ("adam_update", "adam_update:zero_grad"):
        shapes = [(v, d), (d, dff), (dff,), (d,), (dff, d)]   # embedding, W_1, biases, W_2 (some > one block)
        params = [rng.standard_normal(sh).astype(dt) for sh in shapes]
        grads = [rng.standard_normal(sh).astype(dt) for sh in shapes]
        ms = [0.1 * rng.standard_normal(sh).astype(dt) for sh in shapes]
        vs = [0.01 * rng.random(sh).astype(dt) for sh in shapes]
        return (params, grads, ms, vs, 1e-3 / (1 - 0.9 ** 3), 0.9, 0.98, np.sqrt(1 - 0.98 ** 3), 1e-9,
                name.endswith("zero_grad"))
    if name in ("beam_candidates", "greedy_pick"):
        m = b  # sentences, each with 4 beams; the decoder's logits over the vocabulary
        force = rng.random(m) < 0.2   # sentences whose length budget is spent: EOS forced
        force[0] = True
        if name == "greedy_pick":
            return (4 * rng.standard_normal((m, v)).astype(dt), 0, 1, 2, force)
        scores = np.log(rng.uniform(0.01, 1, (m, 4))).astype(dt)
        scores[-1, 1:] = -np.inf  # a sentence at its first step: only beam 0 is live
        return (4 * rng.standard_normal((m * 4, v)).astype(dt), scores, 8, 0, 1, 2, force)
    raise KeyError(name)


PLAIN = {
    "attention_forward": attention_forward, "attention_forward:causal": attention_forward,
    "attention_backward": attention_backward,
    "layernorm_forward": layernorm_forward, "layernorm_backward": layernorm_backward,
    "dropout_forward": dropout_forward, "dropout_forward:add": dropout_forward, "dropout_backward": dropout_backward,
    "relu_forward": relu_forward, "relu_backward": relu_backward,
    "linear_forward": linear_forward, "linear_backward": linear_backward,
    "embedding_backward": embedding_backward,
    "smoothed_cross_entropy": smoothed_cross_entropy, "smoothed_cross_entropy:overwrite": smoothed_cross_entropy,
    "smoothed_cross_entropy_backward": smoothed_cross_entropy_backward,
    "adam_update": adam_update, "adam_update:zero_grad": adam_update,
    "beam_candidates": beam_candidates, "greedy_pick": greedy_pick,
}
# Arguments a kernel may consume (their contents are unspecified afterwards): not compared.
CONSUMED = {"smoothed_cross_entropy:overwrite": {0}, "smoothed_cross_entropy_backward": {0},
            "beam_candidates": {0}, "greedy_pick": {0}}
# Outputs defined only in part: the index of a -inf candidate (a filler where fewer than n extensions
# exist, e.g. a sentence that may only end) is arbitrary, so it is compared as -1.
DEFINED = {"beam_candidates": lambda r: (np.where(np.isfinite(to_host(r[1])), to_host(r[0]), -1), r[1])}
HOST_ONLY = {"dropout_forward", "dropout_forward:add"}  # the GPU draws other random bits


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


KERNEL_MODULES = ("attention", "layernorm", "dropout", "relu", "linear", "embedding", "loss", "adam")


@contextlib.contextmanager
def poisoned_allocations():
    """Every kernel module's ``np`` poisons its new arrays (an unpatched ``np`` only)."""
    import importlib  # noqa: PLC0415
    mods = [importlib.import_module(f"numformer.kernels.{m}") for m in KERNEL_MODULES]
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
    fast = kernels.registered()[plain]
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
    if DEVICE != "cpu" and name in HOST_ONLY:
        pytest.skip("host-only comparison: the GPU draws other dropout bits")
    errors = compare(name, size, dtype)
    bad = {i: e for i, e in errors.items() if not e <= TOL[dtype]}
    assert not bad, f"{name} at {size}: outputs {bad} differ (tolerance {TOL[dtype]})"


def test_every_kernel_is_compared():
    assert set(kernels.registered()) == set(PLAIN.values())


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
    att, ln, dr, re, li, em, lo, ad, dec = (_module(m) for m in
                                            ("attention", "layernorm", "dropout", "relu", "linear", "embedding",
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
        ("dropout_forward: last range of bits lost", "dropout_forward:add", dr, "parallel_ranges",
         lose(kthreads.parallel_ranges)),
        ("dropout_backward: last row block lost", "dropout_backward", dr, "parallel_rows",
         lose(kthreads.parallel_rows)),
        ("relu_forward: last row block lost", "relu_forward", re, "parallel_rows", lose(kthreads.parallel_rows)),
        ("relu_backward: last row block lost", "relu_backward", re, "parallel_rows", lose(kthreads.parallel_rows)),
        ("linear_forward: bias missing on the last rows", "linear_forward", li, "parallel_rows",
         lose(kthreads.parallel_rows)),
        ("linear_backward: bias gradient from all rows but one", "linear_backward", li, "np",
         _NumpyWithShortOnes()),
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
    ]


class _NumpyWithShortOnes(_PoisonedNumpy):
    """numpy, except that ``ones(n)`` has a zero in its last place (an off-by-one in a column sum)."""

    @staticmethod
    def ones(shape, dtype=None):
        o = np.ones(shape, dtype=dtype)
        o[-1] = 0
        return o


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
    assert covered == set(kernels.registered())


# -- the machinery's own pieces ----------------------------------------------------------------
def test_parallel_rows_matches_one_call(threads):
    x = np.random.default_rng(0).standard_normal((1000, 300))
    out = np.empty_like(x)

    def f(xb, ob):
        np.exp(xb, out=ob)
        return ob.sum()

    parts = kthreads.parallel_rows(f, x, out, min_elements=1, chunk_elements=10_000)
    np.testing.assert_allclose(out, np.exp(x))
    assert sum(parts) == pytest.approx(np.exp(x).sum())
    assert len(kthreads.parallel_rows(lambda a: a.shape, x[:3])) == 1  # small inputs: one call


def test_parallel_ranges_cover_once(threads):
    hits = np.zeros(37, dtype=int)

    def f(i, j):
        hits[i:j] += 1
        return j - i

    parts = kthreads.parallel_ranges(f, 37, work=10**9, blocks_per_thread=2)
    assert (hits == 1).all() and sum(parts) == 37
    assert kthreads.parallel_ranges(lambda i, j: (i, j), 37, work=10) == [(0, 37)]


def test_parallel_tasks_runs_every_task_once(threads):
    hits = np.zeros(50, dtype=int)
    kthreads.parallel_tasks(lambda i: hits.__setitem__(i, hits[i] + 1), [(i,) for i in range(50)],
                            sizes=range(1, 51))
    assert (hits == 1).all()


@pytest.mark.parametrize("n", [1, 3, 4, 5, 70_001, 1 << 18])
def test_dropout_mask_is_one_raw_draw_for_any_thread_count(n):
    """The threaded mask is bit for bit the plain one (one ``random_raw`` call), whatever the split,
    and the generator ends where that call leaves it."""
    x = np.ones(n, dtype=np.float32)
    want_rs = RandomState(11)
    want = dropout_mask(want_rs, (n,), 0.25, np.float32)
    fast = kernels.registered()[dropout_forward]
    before = kthreads.get_num_threads()
    try:
        for t in (1, 2, 3):
            kthreads.set_num_threads(t)
            rs = RandomState(11)
            y, mask = fast(x, rs, 0.25)
            assert np.array_equal(mask, want) and np.array_equal(y, want), t
            assert rs.get_state()["bit_generator"] == want_rs.get_state()["bit_generator"]
    finally:
        kthreads.set_num_threads(before)


def test_dropout_mask_values_and_rate():
    """Kept elements are scaled by 1/(1 - p') with p' = round(p * 2^16) / 2^16; about p' are dropped."""
    mask = dropout_mask(RandomState(5), (200, 1000), 0.1, np.float32)
    threshold = round(0.1 * 65536)
    assert set(np.unique(mask)) == {0.0, np.float32(65536 / (65536 - threshold))}
    assert abs((mask == 0).mean() - threshold / 65536) < 3e-3


def test_switch_runs_the_plain_math():
    """kernel(f) is the fast version when kernels are on and f itself under kernel_mode('plain')."""
    fast = kernels.registered()[layernorm_forward]
    with kernels.kernel_mode("fast"):
        assert kernels.kernel(layernorm_forward) is fast
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
            assert kernels.kernel(relu_forward) is kernels.registered()[relu_forward]
    finally:
        kernels.set_disabled(previous)
    with pytest.raises(kernels.KernelModeError, match="unknown kernel"):
        kernels.set_disabled({"softmax_turbo"})


def test_environment_switch_reaches_a_fresh_process():
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415
    code = ("from numformer import kernels; from numformer.layers.relu import relu_forward; "
            "print(kernels.get_kernels(), kernels.kernel(relu_forward) is relu_forward)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "NUMFORMER_KERNELS": "plain"})
    assert out.stdout.split() == ["plain", "True"]
