"""One buffer for all parameters (numformer/parameter_buffer.py): every weight and gradient of a built model is a
view into one array per dtype, the whole-buffer Adam, norm and clipping equal the per-tensor math, and what
would silently break the views (a rebound array, a layer keeping an old array, a copy) is caught."""
import pickle

import numpy as np
import pytest

from numformer.curvature.hvp import BlockHessian
from numformer.finite_differences.any_layer import detached_copy
from numformer.kernels import kernel_mode
from numformer.layers import LayerNorm
from numformer.loss import LabelSmoothedCrossEntropy
from numformer.model import Transformer
from numformer.module import StaleParameterArray
from numformer.optim import Adam, adam_update, clip_grad_norm, grad_norm, sum_of_squares
from numformer.parameter_buffer import ALIGN, SPARE_SLOTS, ParameterBuffer, ParameterRebound
from numformer.presets import get_preset
from numformer.swap import swapped
from numformer.training.per_sentence_gradients import PerSentenceGradients

SRC = np.array([[5, 6, 7, 8, 3], [9, 10, 3, 0, 0]])
TGT = np.array([[1, 11, 12, 13, 3], [1, 14, 3, 0, 0]])  # BOS ... EOS, padded


def tiny(dtype=np.float32, **kw):
    cfg = get_preset("tiny", vocab_size=40, d_model=16, d_ff=32, heads=2, layers=2, **kw)
    return Transformer(cfg, seed=1, dtype=dtype)


def backward(model, seed=0):
    """One forward and backward with a random upstream gradient (not the loss's: every entry differs)."""
    logits = model(SRC, TGT[:, :-1])
    model.backward(np.random.default_rng(seed).standard_normal(logits.shape).astype(logits.dtype))


def address(a) -> int:
    return a.__array_interface__["data"][0]


def assert_packed(model, buffer):
    """Every parameter of ``model``, in named order, is a contiguous view of ``buffer`` at its aligned offset."""
    named = model.named_parameters()
    assert buffer.params == [p for _, p in named] and buffer.names == [n for n, _ in named]
    for g in buffer.groups:
        for p, offset in zip(g.params, g.offsets):
            assert offset % ALIGN == 0
            for view, flat in ((p.data, g.data), (p.grad, g.grad)):
                assert view.flags.c_contiguous and view.shape == p.shape
                assert address(view) == address(flat) + offset * flat.itemsize  # in place, not a copy
            assert p.packed_in is buffer


def test_a_built_model_lives_in_one_buffer():
    model = tiny()
    buffer = model.parameter_buffer()
    assert model.parameter_buffer() is buffer  # made when built, found again, not packed twice
    (group,) = buffer.groups  # one dtype: one array of values, one of gradients
    assert_packed(model, buffer)
    assert group.grad_and_spare.size == group.data.size + SPARE_SLOTS
    covered = np.zeros(group.data.size, dtype=bool)
    for p, o in zip(group.params, group.offsets):
        covered[o:o + p.size] = True
    assert not group.data[~covered].any()  # the alignment gaps hold zeros (their Adam update is zero)
    first = group.params[0]
    group.data[group.offsets[0]] = 7.0  # a write into the buffer is a write into the parameter, and back
    assert first.data.reshape(-1)[0] == 7.0
    backward(model)
    assert group.grad.any() and np.array_equal(
        group.grad[group.offsets[1]:group.offsets[1] + group.params[1].size], group.params[1].grad.reshape(-1))
    assert model.src_embed.weight is model.generator.weight  # the tied matrix: one Parameter, one place


def test_loading_keeps_the_buffer_and_moving_packs_a_new_one():
    model, other = tiny(), tiny()
    buffer = model.parameter_buffer()
    other.src_embed.weight.data[...] += 1.0
    model.load_state_dict(other.state_dict())  # what resume, --init-from and averaging do: in place
    assert ParameterBuffer.holding(model.parameters()) is buffer
    assert np.array_equal(model.src_embed.weight.data, other.src_embed.weight.data)
    values = {n: p.data.copy() for n, p in model.named_parameters()}
    model.to(dtype=np.float64)  # a new dtype: a new buffer of it, the values kept
    moved = model.parameter_buffer()
    assert moved is not buffer and moved.groups[0].data.dtype == np.float64
    assert_packed(model, moved)
    assert all(np.array_equal(p.data, values[n]) for n, p in model.named_parameters())


def test_a_copy_of_a_model_owns_its_arrays():
    """The finite-difference checks copy a layer (detached_copy: copy.deepcopy sharing modules); a pickled
    Parameter is rebuilt the same way."""
    model = tiny()
    p = model.src_embed.weight
    again = pickle.loads(pickle.dumps(p))
    assert again.packed_in is None and np.array_equal(again.data, p.data) and not np.shares_memory(again.data, p.data)
    for original in (model, model.encoder.layers[0]):
        twin = detached_copy(original)
        assert all(p.packed_in is None for p in twin.parameters())  # outside any buffer until one is made
        for a, b in zip(original.parameters(), twin.parameters()):
            assert np.array_equal(a.data, b.data) and not np.shares_memory(a.data, b.data)
        twin.parameters()[0].data[...] = 0.0
        assert model.parameter_buffer().groups[0].data.any()
        buffer = twin.parameter_buffer()
        assert [n for n, _ in twin.named_parameters()] == buffer.names and all(p.packed_in is buffer
                                                                                for p in twin.parameters())
    assert_packed(model, model.parameter_buffer())


@pytest.mark.parametrize("what", ["data", "grad"])
def test_a_rebound_parameter_stops_the_update_with_its_name(what):
    """A backward that assigns a new array (p.grad = p.grad + g, p.data = ...) instead of writing into the view
    would leave the optimizer updating memory the model no longer reads: Adam.step refuses, naming it."""
    model = tiny()
    opt = Adam(model.parameters(), lr=1e-3)
    norm = model.encoder.layers[0].ffn_residual.norm

    def rebinding(m, run, dy):
        dx = run(dy)
        setattr(m.weight, what, getattr(m.weight, what) + 0.0)  # the bug: a new array, not the view
        return dx
    with norm.tap(backward=rebinding):
        backward(model)
    with pytest.raises(ParameterRebound, match=rf"encoder.layers.0.ffn_residual.norm.weight's {what} is not its "
                                               r"view into the parameter buffer"):
        opt.step()
    assert opt.step_count == 0


def test_a_layer_keeping_its_parameter_array_is_refused_when_packed():
    class KeepsItsArray(LayerNorm):  # a student's LayerNorm that reads self.gamma instead of self.weight.data
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.gamma = self.weight.data

    with swapped(LayerNorm=KeepsItsArray), pytest.raises(StaleParameterArray, match=r"KeepsItsArray "
                                                                                    r"\(encoder.layers.0.self_attn"
                                                                                    r"_residual.norm\) keeps the "
                                                                                    r"array of parameter"):
        tiny()


@pytest.mark.parametrize("mode", ["plain", "fast"])
def test_adam_on_whole_buffers_equals_adam_per_tensor(mode):
    """Three steps of Adam on the buffer against the per-tensor update on copies: identical in float64 (the same
    arithmetic element by element), with the kernels off and on."""
    model = tiny(np.float64)
    opt = Adam(model.parameters(), lr=3e-3)
    params = [p.data.copy() for p in model.parameters()]
    ms, vs = [np.zeros_like(p) for p in params], [np.zeros_like(p) for p in params]
    with kernel_mode(mode):
        for t in range(1, 4):
            backward(model, seed=t)
            grads = [p.grad.copy() for p in model.parameters()]
            adam_update(params, grads, ms, vs, 3e-3 / (1 - 0.9 ** t), 0.9, 0.98, np.sqrt(1 - 0.98 ** t), 1e-9)
            opt.step(zero_grad=True)
            assert not opt.buffer.groups[0].grad.any()  # zeroed with the update
    for p, ref, m, v, got_m, got_v in zip(model.parameters(), params, ms, vs, opt.m, opt.v):
        assert np.array_equal(p.data, ref) and np.array_equal(got_m, m) and np.array_equal(got_v, v)


def test_adam_state_round_trips_per_tensor_into_the_buffer_layout():
    model = tiny()
    opt = Adam(model.parameters(), lr=1e-3)
    backward(model)
    opt.step(zero_grad=True)
    state = opt.state_dict()  # the checkpoint format: a list of per-tensor host arrays, unchanged
    assert [m.shape for m in state["m"]] == [p.shape for p in model.parameters()]
    again = Adam(model.parameters(), lr=1e-3)
    flat_m = again.m_flat[0]
    again.load_state_dict(state)
    assert again.m_flat[0] is flat_m and np.array_equal(flat_m, opt.m_flat[0])  # in place, in the buffer's layout
    bad = dict(state, m=[m[..., :1] for m in state["m"]])
    with pytest.raises(ValueError, match="optimizer state's m of tensor 0 has shape"):
        again.load_state_dict(bad)


def test_norm_and_clipping_on_the_buffer_equal_the_per_tensor_math():
    model = tiny(np.float64)
    backward(model)
    buffer, params = model.parameter_buffer(), model.parameters()
    exact = np.sqrt(sum((p.grad.astype(np.float64) ** 2).sum() for p in params))
    assert np.isclose(float(grad_norm(buffer)), exact, rtol=1e-14, atol=0)
    assert np.isclose(float(grad_norm(params)), exact, rtol=1e-14, atol=0)
    before = [p.grad.copy() for p in params]
    returned = clip_grad_norm(buffer, exact / 4)
    assert np.isclose(float(returned), exact, rtol=1e-14, atol=0)
    assert np.isclose(float(grad_norm(buffer)), exact / 4, rtol=1e-6, atol=0)
    for p, g in zip(params, before):
        np.testing.assert_allclose(p.grad, g * (exact / 4) / (exact + 1e-6), rtol=1e-12, atol=0)


def test_sum_of_squares_keeps_the_digits_one_float32_dot_product_loses():
    """Ten million float32 squares: one float32 dot product is off by about 1e-4 (measured 1.2e-4), the rows of
    numformer.optim.sum_of_squares by about 1e-7."""
    rng = np.random.default_rng(0)
    a = (rng.standard_normal(10_000_003) * rng.uniform(0, 1, 10_000_003) ** 4).astype(np.float32)
    exact = np.dot(a.astype(np.float64), a.astype(np.float64))
    assert abs(float(sum_of_squares(a)) - exact) / exact < 1e-6
    assert float(sum_of_squares(a[:5])) == pytest.approx(float(np.dot(a[:5].astype(np.float64), a[:5])), rel=1e-6)


def test_the_tools_that_hold_one_parameter_work_through_the_views():
    """Per-sentence gradients, Hessian-vector products (which move weights and put them back) and a training
    step read and write the parameters in place: the model keeps its one buffer, and Adam still moves them."""
    model = tiny(np.float64, dropout=0.0, attn_dropout=0.0, relu_dropout=0.0)
    buffer = model.parameter_buffer()
    crit = LabelSmoothedCrossEntropy(0.1, 0)
    with PerSentenceGradients(model) as tap:
        crit.forward(model(SRC, TGT[:, :-1]), TGT[:, 1:])
        model.backward(crit.backward())
    stats = tap.statistics()
    assert stats["encoder.layers.0.ffn.w_1.weight"].sq_norms.shape == (2,)
    name = "decoder.layers.1.ffn.w_2.weight"
    before = dict(model.named_parameters())[name].data.copy()
    hessian = BlockHessian(model, (SRC, TGT[:, :-1], TGT[:, 1:]), [name])
    hv = hessian(np.random.default_rng(0).standard_normal(hessian.dim))
    assert np.isfinite(hv).all() and np.array_equal(dict(model.named_parameters())[name].data, before)
    assert ParameterBuffer.holding(model.parameters()) is buffer
    model.zero_grad()
    opt = Adam(model.parameters(), lr=1e-2)
    assert opt.buffer is buffer
    backward(model)
    opt.step()
    assert not np.array_equal(dict(model.named_parameters())[name].data, before)  # the update reached the layer
