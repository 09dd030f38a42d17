"""The CPU fast paths against their plain references.

* ``parallel_rows`` / ``parallel_tasks`` (host threads over row blocks) give the same
  result with one thread, several threads, and small or large blocks;
* the blocked loss (with and without ``overwrite_logits``) against the textbook
  formula (log-softmax, smoothed target built densely);
* the blocked LayerNorm against a plain numpy LayerNorm, forward and backward;
* fused Adam against the plain update, on contiguous and non-contiguous parameters;
* ``scatter_add_rows`` against ``np.add.at`` with and without duplicates, and scaled;
* the uint16 dropout mask: values, keep rate, determinism from the RandomState;
* the in-place attention mask: masked scores replaced by -1e9, fully masked rows uniform.
"""
import numpy as np
import pytest

from numformer import backend
from numformer.backend import RandomState, parallel_rows, parallel_tasks, scatter_add_rows
from numformer.layers import Dropout, LayerNorm, ScaledDotProductAttention
from numformer.loss import LabelSmoothedCrossEntropy
from numformer.module import Parameter
from numformer.optim import Adam


@pytest.fixture(params=[1, 2, 3])
def threads(request):
    old = backend.get_num_threads()
    backend.set_num_threads(request.param)
    yield request.param
    backend.set_num_threads(old)


def test_parallel_rows_matches_one_call(threads):
    x = np.random.default_rng(0).standard_normal((1000, 300))
    out = np.empty_like(x)

    def f(xb, ob):
        np.exp(xb, out=ob)
        return ob.sum()

    parts = parallel_rows(f, x, out, min_elements=1, chunk_elements=10_000)
    np.testing.assert_allclose(out, np.exp(x))
    assert sum(parts) == pytest.approx(np.exp(x).sum())
    # small inputs: one call on the whole arrays
    assert len(parallel_rows(lambda a: a.shape, x[:3])) == 1


def test_parallel_tasks_runs_every_task_once(threads):
    hits = np.zeros(50, dtype=int)
    parallel_tasks(lambda i: hits.__setitem__(i, hits[i] + 1), [(i,) for i in range(50)], sizes=range(1, 51))
    assert (hits == 1).all()


def plain_loss(logits, target, eps, pad):
    z = logits.reshape(-1, logits.shape[-1]).astype(np.float64)
    y = target.reshape(-1)
    v = z.shape[1]
    logp = z - z.max(1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(1, keepdims=True))
    q = np.full_like(z, eps / v)
    q[np.arange(len(y)), y] += 1 - eps
    keep = y != pad
    loss = -(q * logp).sum(1)[keep].sum() / keep.sum()
    grad = (np.exp(logp) - q) * keep[:, None] / keep.sum()
    return loss, grad.reshape(logits.shape)


@pytest.mark.parametrize("overwrite", [False, True])
@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_blocked_loss_matches_plain(threads, overwrite, eps):
    rng = np.random.default_rng(1)
    logits = (3 * rng.standard_normal((6, 50, 700))).astype(np.float64)  # 210k elements: several blocks
    target = rng.integers(0, 700, (6, 50))
    target[0, 40:] = 0
    ref_loss, ref_grad = plain_loss(logits, target, eps, 0)
    crit = LabelSmoothedCrossEntropy(eps, pad_id=0)
    original = logits.copy()
    loss = crit.forward(logits, target, overwrite_logits=overwrite)
    assert np.array_equal(logits, original) != overwrite
    np.testing.assert_allclose(float(loss), ref_loss, rtol=1e-12)
    np.testing.assert_allclose(crit.backward(), ref_grad, rtol=1e-10, atol=1e-15)
    # eval mode path (no buffer kept) gives the same loss
    assert float(LabelSmoothedCrossEntropy(eps).forward(original, target, keep_for_backward=False)) == \
        pytest.approx(ref_loss, rel=1e-12)


def test_blocked_layernorm_matches_plain(threads):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((8, 37, 64)) * 3 + 1
    dy = rng.standard_normal(x.shape)
    ln = LayerNorm(64, dtype=np.float64)
    ln.weight.data[:] = rng.standard_normal(64)
    ln.bias.data[:] = rng.standard_normal(64)
    backend.PARALLEL_MIN_ELEMENTS, old = 1, backend.PARALLEL_MIN_ELEMENTS
    try:
        y = ln(x)
        dx = ln.backward(dy)
    finally:
        backend.PARALLEL_MIN_ELEMENTS = old
    mu = x.mean(-1, keepdims=True)
    r = 1 / np.sqrt(x.var(-1, keepdims=True) + ln.eps)
    xhat = (x - mu) * r
    np.testing.assert_allclose(y, xhat * ln.weight.data + ln.bias.data, rtol=1e-12, atol=1e-12)
    dxhat = dy * ln.weight.data
    ref = r * (dxhat - dxhat.mean(-1, keepdims=True) - xhat * (dxhat * xhat).mean(-1, keepdims=True))
    np.testing.assert_allclose(dx, ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ln.weight.grad, (dy * xhat).sum((0, 1)), rtol=1e-10)
    np.testing.assert_allclose(ln.bias.grad, dy.sum((0, 1)), rtol=1e-10)


@pytest.mark.parametrize("zero_grad", [False, True])
def test_fused_adam_matches_plain(threads, zero_grad):
    from numformer.optim import ADAM_BLOCK

    rng = np.random.default_rng(3)
    big = Parameter(rng.standard_normal((2 * ADAM_BLOCK // 250 + 1, 250)))  # split into blocks
    small = Parameter(rng.standard_normal(7))
    strided = Parameter(rng.standard_normal((40, 30)).T)        # not contiguous: updated whole
    params = [big, small, strided]
    ref = [p.data.copy() for p in params]
    m = [np.zeros_like(r) for r in ref]
    v = [np.zeros_like(r) for r in ref]
    opt = Adam(params, lr=0.01)
    for t in range(1, 4):
        for p in params:
            p.grad = rng.standard_normal(p.data.shape)
        grads = [p.grad.copy() for p in params]
        opt.step(zero_grad=zero_grad)
        for p, g in zip(params, grads):  # zeroed by the fused pass, or left as they were
            np.testing.assert_array_equal(p.grad, np.zeros_like(g) if zero_grad else g)
        for i, g in enumerate(grads):
            m[i] = 0.9 * m[i] + 0.1 * g
            v[i] = 0.98 * v[i] + 0.02 * g * g
            ref[i] -= 0.01 / (1 - 0.9 ** t) * m[i] / (np.sqrt(v[i]) / np.sqrt(1 - 0.98 ** t) + 1e-9)
    for p, r in zip(params, ref):
        np.testing.assert_allclose(p.data, r, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("dups", [False, True])
def test_scatter_add_rows_matches_add_at(dups):
    rng = np.random.default_rng(4)
    index = rng.permutation(100)[:60] if not dups else rng.integers(0, 20, 200)
    values = rng.standard_normal((index.size, 8))
    target = rng.standard_normal((100, 8))
    ref = target.copy()
    np.add.at(ref, index, 2.5 * values)
    scatter_add_rows(target, index, values, scale=2.5)
    np.testing.assert_allclose(target, ref, rtol=1e-12, atol=1e-12)


def test_uint16_dropout_mask():
    rs = RandomState(5)
    state = rs.get_state()
    mask = rs.dropout_mask((200, 1000), 0.1, np.float32)
    threshold = round(0.1 * 65536)
    scale = np.float32(65536 / (65536 - threshold))
    assert set(np.unique(mask)) <= {0.0, scale}
    assert abs((mask == 0).mean() - threshold / 65536) < 3e-3
    rs.set_state(state)
    assert np.array_equal(mask, rs.dropout_mask((200, 1000), 0.1, np.float32))
    d = Dropout(0.1, RandomState(5))
    x = np.ones((200, 1000), dtype=np.float32)
    assert np.array_equal(d(x), mask)
    assert np.array_equal(d.backward(x), mask)


@pytest.mark.parametrize("n", [1, 3, 4, 5, 70_001, 1 << 18])
def test_dropout_mask_is_one_raw_draw_for_any_thread_count(n):
    """The threaded mask is bit for bit that of one ``random_raw`` call, whatever the split,
    and the generator ends where that call leaves it."""
    from numformer.backend import get_num_threads, set_num_threads

    ref_gen = np.random.default_rng(11)
    bits = ref_gen.bit_generator.random_raw(-(-n // 4)).view(np.uint16)[:n]
    threshold = round(0.25 * 65536)
    expected = np.where(bits >= threshold, np.float32(65536 / (65536 - threshold)), np.float32(0))
    before = get_num_threads()
    try:
        for threads in (1, 2, 3):
            set_num_threads(threads)
            rs = RandomState(11)
            assert np.array_equal(rs.dropout_mask((n,), 0.25, np.float32), expected), threads
            assert rs.generator.bit_generator.state["state"] == ref_gen.bit_generator.state["state"]
    finally:
        set_num_threads(before)


def test_fused_dropout_apply_matches_mask_times_input():
    """Dropout applies each mask block where it is drawn: same as x * mask (+ add), in place or not."""
    rng = np.random.default_rng(12)
    x = rng.standard_normal((64, 40, 96)).astype(np.float32)
    add = rng.standard_normal(x.shape).astype(np.float32)
    mask = RandomState(3).dropout_mask(x.shape, 0.1, np.float32)
    d = Dropout(0.1, RandomState(3))
    np.testing.assert_array_equal(d(x), x * mask)
    d = Dropout(0.1, RandomState(3))
    y = x.copy()
    out = d(y, inplace=True, add=add)
    assert out is y
    np.testing.assert_array_equal(out, x * mask + add)
    np.testing.assert_array_equal(d.backward(add), add * mask)


def test_inplace_attention_mask_replaces_scores():
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((2, 3, 4, 5)) for _ in range(3))
    mask = np.ones((2, 1, 4, 4), dtype=bool)
    mask[0, 0, 1, 2:] = False
    mask[1, 0, 3, :] = False  # a row with every key masked: uniform weights
    attn = ScaledDotProductAttention()
    attn.record_weights = True
    out = attn(q, k, v, mask)
    scores = q @ k.swapaxes(-1, -2) / np.sqrt(5)
    scores = np.where(mask, scores, -1e9)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    np.testing.assert_allclose(attn.weights, p, rtol=1e-12)
    np.testing.assert_allclose(attn.weights[1, :, 3], 0.25)
    np.testing.assert_allclose(out, p @ v, rtol=1e-12)
    dq, dk, dv = attn.backward(rng.standard_normal(out.shape))
    assert np.isfinite(dq).all() and np.isfinite(dk).all()


# -- attention without head copies, threaded over the batch ------------------------------
def plain_attention(q, k, v, mask):
    scores = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    if mask is not None:
        scores = np.where(mask, scores, -1e9)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return p @ v, p


def test_parallel_ranges_cover_once(threads):
    hits = np.zeros(37, dtype=int)

    def f(i, j):
        hits[i:j] += 1
        return j - i

    parts = backend.parallel_ranges(f, 37, work=10**9, blocks_per_thread=2)
    assert (hits == 1).all() and sum(parts) == 37
    assert backend.parallel_ranges(lambda i, j: (i, j), 37, work=10) == [(0, 37)]


@pytest.mark.parametrize("mask_kind", ["none", "padding", "causal", "causal+padding"])
def test_threaded_attention_matches_plain(threads, mask_kind, monkeypatch):
    monkeypatch.setattr(backend, "PARALLEL_MIN_ELEMENTS", 1)
    rng = np.random.default_rng(7)
    b, h, tq, tk = 5, 3, 6, 6
    # q, k, v as strided head views of one (B, T, 3*h*d) projection, like MultiHeadAttention's
    qkv = rng.standard_normal((b, tq, 3 * h * 4))
    q, k, v = (qkv[..., i * h * 4:(i + 1) * h * 4].reshape(b, tq, h, 4).transpose(0, 2, 1, 3) for i in range(3))
    pad = np.ones((b, 1, 1, tk), dtype=bool)
    pad[1, ..., 4:] = False
    causal = np.tril(np.ones((tq, tk), dtype=bool))[None, None]
    mask = {"none": None, "padding": pad, "causal": causal, "causal+padding": causal & pad}[mask_kind]
    saved = qkv.copy()
    attn = ScaledDotProductAttention()
    out = np.empty((b, tq, h * 4)).reshape(b, tq, h, 4).transpose(0, 2, 1, 3)
    got = attn(q, k, v, mask, out=out)
    ref, p = plain_attention(q, k, v, mask)
    assert got is out
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-14)
    dout = rng.standard_normal(ref.shape)
    dq, dk, dv = attn.backward(dout)
    np.testing.assert_array_equal(qkv, saved)
    dp = dout @ v.swapaxes(-1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True)) / 2.0
    if mask is not None:
        ds = np.where(mask, ds, 0.0)
    np.testing.assert_allclose(dv, p.swapaxes(-1, -2) @ dout, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(dq, ds @ k, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(dk, ds.swapaxes(-1, -2) @ q, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("cross", [False, True])
def test_fused_projections_match_separate_linears(threads, cross):
    from numformer.layers import MultiHeadAttention

    rng = np.random.default_rng(8)
    m = MultiHeadAttention(12, 3, d_k=4, d_v=5, rng=rng, dtype=np.float64)
    for lin in (m.w_q, m.w_k, m.w_v, m.w_o):
        lin.bias.data[:] = rng.standard_normal(lin.bias.shape)
    x = rng.standard_normal((2, 7, 12))
    mem = rng.standard_normal((2, 5, 12)) if cross else x
    mask = np.ones((2, 1, 1, mem.shape[1]), dtype=bool)
    mask[0, ..., -2:] = False
    saved = (x.copy(), mem.copy())
    y = m(x, mem, mask=mask) if cross else m(x, mask=mask)

    def heads(a, d):
        return a.reshape(a.shape[0], a.shape[1], 3, d).transpose(0, 2, 1, 3)

    lin = {n: (getattr(m, n).weight.data, getattr(m, n).bias.data) for n in ("w_q", "w_k", "w_v", "w_o")}
    q, k, v = heads(x @ lin["w_q"][0] + lin["w_q"][1], 4), heads(mem @ lin["w_k"][0] + lin["w_k"][1], 4), \
        heads(mem @ lin["w_v"][0] + lin["w_v"][1], 5)
    o, p = plain_attention(q, k, v, mask)
    merged = o.transpose(0, 2, 1, 3).reshape(2, 7, 15)
    np.testing.assert_allclose(y, merged @ lin["w_o"][0] + lin["w_o"][1], rtol=1e-11, atol=1e-12)
    dy = rng.standard_normal(y.shape)
    got = m.backward(dy)
    np.testing.assert_array_equal(x, saved[0])
    np.testing.assert_array_equal(mem, saved[1])
    # reference gradients of the projections from plain formulas
    dmerged = dy @ lin["w_o"][0].T
    do = heads(dmerged, 5)
    dv = p.swapaxes(-1, -2) @ do
    dp = do @ v.swapaxes(-1, -2)
    ds = np.where(mask, p * (dp - (dp * p).sum(-1, keepdims=True)) / 2.0, 0.0)
    dq, dk = ds @ k, ds.swapaxes(-1, -2) @ q
    flat = [a.transpose(0, 2, 1, 3).reshape(2, a.shape[2], -1) for a in (dq, dk, dv)]
    np.testing.assert_allclose(m.w_q.weight.grad, np.einsum("bti,btj->ij", x, flat[0]), rtol=1e-10)
    np.testing.assert_allclose(m.w_k.weight.grad, np.einsum("bti,btj->ij", mem, flat[1]), rtol=1e-10)
    np.testing.assert_allclose(m.w_v.weight.grad, np.einsum("bti,btj->ij", mem, flat[2]), rtol=1e-10)
    np.testing.assert_allclose(m.w_v.bias.grad, flat[2].sum((0, 1)), rtol=1e-10)
    dx = flat[0] @ lin["w_q"][0].T
    dmem = flat[1] @ lin["w_k"][0].T + flat[2] @ lin["w_v"][0].T
    if cross:
        np.testing.assert_allclose(got[0], dx, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(got[1], dmem, rtol=1e-10, atol=1e-12)
    else:
        np.testing.assert_allclose(got, dx + dmem, rtol=1e-10, atol=1e-12)


def test_inplace_relu_and_dropout_helpers(threads, monkeypatch):
    from numformer.layers import ReLU
    from numformer.layers.relu import relu_, relu_backward_

    monkeypatch.setattr(backend, "PARALLEL_MIN_ELEMENTS", 1)
    rng = np.random.default_rng(9)
    x = rng.standard_normal((50, 70))
    rec = ReLU()
    y = relu_(x.copy(), rec)
    np.testing.assert_array_equal(y, np.maximum(x, 0))
    np.testing.assert_array_equal(rec._cache_positive, x > 0)
    dy = rng.standard_normal(x.shape)
    np.testing.assert_array_equal(relu_backward_(dy.copy(), x > 0), dy * (x > 0))
    # Dropout: in place and with the residual added in the same pass, against the plain product
    for inplace in (False, True):
        d = Dropout(0.3, RandomState(11))
        a, res = rng.standard_normal((40, 30)), rng.standard_normal((40, 30))
        a0, res0 = a.copy(), res.copy()
        out = d(a, inplace=inplace, add=res)
        mask = d._cache_mask
        np.testing.assert_allclose(out, a0 * mask + res0, rtol=1e-15)
        assert (out is a) == inplace
        np.testing.assert_array_equal(res, res0)
        if not inplace:
            np.testing.assert_array_equal(a, a0)
        g = rng.standard_normal(a.shape)
        g0 = g.copy()
        np.testing.assert_array_equal(d.backward(g), g0 * mask)
        np.testing.assert_array_equal(g, g0)


def test_growing_decoder_cache_and_reorder():
    """Cached decoding past the first buffer doubling (16 positions), with a beam-style reorder, equals
    full forwards of the reordered prefixes."""
    from numformer.model import Transformer
    from numformer.presets import get_preset

    m = Transformer(get_preset("tiny", vocab_size=30, d_model=16, d_ff=32, heads=2, max_len=64), seed=0,
                    dtype=np.float64).eval()
    rng = np.random.default_rng(10)
    src = np.array([[5, 6, 7, 3, 0], [8, 9, 10, 11, 3], [4, 4, 5, 3, 0]])
    tgt = np.concatenate([np.full((3, 1), 2), rng.integers(4, 30, (3, 39))], axis=1)
    memory, src_mask = m.encode(src)
    caches = m.new_decoder_caches()
    prefix_rows = np.arange(3)
    for t in range(tgt.shape[1]):
        if t == 25:  # reorder: rows (2, 0) continue (the batch shrinks, as when beams are dropped)
            index = np.array([2, 0])
            m.reorder_caches(caches, index)
            memory, src_mask, prefix_rows = memory[index], src_mask[index], prefix_rows[index]
        step = m.decode_step(tgt[prefix_rows, t], memory, src_mask, caches, position=t)
    full = m(src[prefix_rows], tgt[prefix_rows])[:, -1]
    np.testing.assert_allclose(step, full, rtol=1e-10, atol=1e-10)
