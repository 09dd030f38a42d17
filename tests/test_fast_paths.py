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


def test_fused_adam_matches_plain(threads):
    rng = np.random.default_rng(3)
    big = Parameter(rng.standard_normal((300, 250)))            # split into blocks
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
        opt.step()
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
