"""The cupy path computes what the numpy path computes (run with a GPU: ``pytest -m gpu``).

Skipped without cupy and CUDA. Same weights and inputs on both devices, dropout
off (the two devices draw different random numbers), every output and gradient
compared per tensor with ``norm(a - b) / norm(b)``.
"""
import numpy as np
import pytest

from grad_checks.cases import build_cases
from numformer.backend import to_host
from numformer.decoding.search import beam_search, greedy_search
from numformer.loss import LabelSmoothedCrossEntropy
from numformer.model import Transformer
from numformer.optim import Adam, NoamSchedule
from numformer.presets import get_preset
from relu_replay import force_relu_sets, record_relu_sets
from support import no_exact_gradient  # the key biases: noise on both devices (the first GPU run found 1.4 apart)

pytestmark = pytest.mark.gpu


def rel(a, b):
    a, b = to_host(a), to_host(b)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


def pair(dtype, **kw):
    cfg = get_preset("tiny", vocab_size=50, d_model=32, d_ff=64, heads=4, dropout=0.0, **kw)
    cpu = Transformer(cfg, seed=3, dtype=dtype)
    gpu = Transformer(cfg, seed=3, dtype=dtype).to("cuda")
    return cpu, gpu


BATCH = (np.array([[5, 6, 7, 8, 3], [9, 10, 3, 0, 0]]), np.array([[2, 11, 12, 13], [2, 14, 0, 0]]),
         np.array([[11, 12, 13, 3], [14, 3, 0, 0]]))


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 1e-5)])
@pytest.mark.parametrize("kw", [dict(), dict(pre_norm=True, tie_embeddings=False)])
def test_model_forward_backward_match(dtype, tol, kw):
    """The GPU's forward and backward equal the CPU's. In float32 the GPU takes the CPU's ReLU branches
    (tests/relu_replay.py): an input within rounding of zero may land on either side on two devices."""
    import cupy

    cpu, gpu = pair(dtype, **kw)
    src, tgt_in, tgt_out = BATCH
    if dtype == np.float32:
        force_relu_sets(gpu, record_relu_sets(cpu))  # the CPU runs first and fills the dict
    worst = 0.0
    for model, xp in ((cpu, np), (gpu, cupy)):
        crit = LabelSmoothedCrossEntropy(0.1)
        logits = model(xp.asarray(src), xp.asarray(tgt_in))
        model.loss = crit.forward(logits, xp.asarray(tgt_out))
        model.backward(crit.backward())
        model.logits = logits
    assert rel(gpu.logits, cpu.logits) < tol
    assert rel(gpu.loss, cpu.loss) < tol
    scale = max(np.linalg.norm(to_host(p.grad)) for p in cpu.parameters())
    for (n, a), (_, b) in zip(gpu.named_parameters(), cpu.named_parameters()):
        if no_exact_gradient(n):
            assert max(np.linalg.norm(to_host(a.grad)), np.linalg.norm(to_host(b.grad))) < 10 * tol * scale, n
            continue
        worst = max(worst, rel(a.grad, b.grad))
        assert worst < tol, n


def test_adam_steps_match():
    import cupy

    cpu, gpu = pair(np.float64)
    src, tgt_in, tgt_out = BATCH
    for model, xp in ((cpu, np), (gpu, cupy)):
        opt = Adam(model.parameters(), schedule=NoamSchedule(32, 5))
        crit = LabelSmoothedCrossEntropy(0.1)
        for _ in range(5):
            crit.forward(model(xp.asarray(src), xp.asarray(tgt_in)), xp.asarray(tgt_out))
            model.backward(crit.backward())
            opt.step()
            opt.zero_grad()
    for (n, a), (_, b) in zip(gpu.named_parameters(), cpu.named_parameters()):
        if no_exact_gradient(n):  # zero at the start; Adam moves them by round-off over its eps, on both devices
            assert max(np.abs(to_host(a.data)).max(), np.abs(to_host(b.data)).max()) < 1e-6, n
            continue
        assert rel(a.data, b.data) < 1e-10, n


def test_decoding_matches_and_checkpoint_is_host_numpy():
    cpu, gpu = pair(np.float64)
    cpu.eval(), gpu.eval()
    src = BATCH[0]
    g_cpu = greedy_search(cpu, src, 2, 3, max_len_b=8)
    g_gpu = greedy_search(gpu, src, 2, 3, max_len_b=8)
    assert [h.tokens for h in g_cpu] == [h.tokens for h in g_gpu]
    b_cpu = beam_search(cpu, src, 2, 3, beam=3, max_len_b=8)
    b_gpu = beam_search(gpu, src, 2, 3, beam=3, max_len_b=8)
    assert [h[0].tokens for h in b_cpu] == [h[0].tokens for h in b_gpu]
    assert all(type(v) is np.ndarray for v in gpu.state_dict().values())


def _dropout_off(module):
    """Every Dropout in ``module`` set to p = 0 (the two devices draw different masks)."""
    from numformer.layers import Dropout

    for m in module.modules():
        if isinstance(m, Dropout):
            m.p = 0.0


def _run(case, upstream):
    """Outputs, input gradients and parameter gradients of one forward + backward of a grad_checks case."""
    if case.before_forward is not None:
        case.before_forward()
    outs = case.forward(case.module, case.inputs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    case.module.zero_grad()
    grads = case.backward(case.module, upstream(outs))
    params = {n: to_host(p.grad).copy() for n, p in case.module.named_parameters()}
    return [to_host(o) for o in outs], {k: to_host(g) for k, g in grads.items()}, params


@pytest.mark.parametrize("layer", ["LayerNorm", "MultiHeadAttention", "Embedding", "EncoderLayer", "DecoderLayer",
                                   "Transformer"])
def test_layer_cases_match_on_gpu(layer):
    """Each grad_checks case run on cupy gives the numpy outputs and gradients (dropout set to 0 in both,
    since the devices draw different masks; the masks themselves are checked by the next test)."""
    import cupy

    cases = build_cases([layer])
    assert cases
    for case in cases:
        case.module.train()
        _dropout_off(case.module)
        rng = np.random.default_rng(0)
        host_up = []

        def upstream_cpu(outs):
            host_up[:] = [rng.standard_normal(o.shape) for o in outs]
            return host_up

        o_cpu, g_cpu, p_cpu = _run(case, upstream_cpu)
        case.module.to(cupy)
        case.inputs = {k: cupy.asarray(v) for k, v in case.inputs.items()}
        o_gpu, g_gpu, p_gpu = _run(case, lambda outs: [cupy.asarray(u) for u in host_up])
        for a, b in zip(o_gpu, o_cpu):
            assert rel(a, b) < 1e-12, case.case
        assert g_gpu.keys() == g_cpu.keys()
        for k in g_cpu:
            assert rel(g_gpu[k], g_cpu[k]) < 1e-12, (case.case, k)
        for n in p_cpu:
            if np.linalg.norm(p_cpu[n]) > 1e-9:
                assert rel(p_gpu[n], p_cpu[n]) < 1e-12, (case.case, n)


@pytest.mark.parametrize("layer", ["Dropout", "DecoderLayer", "Transformer"])
def test_dropout_masks_replay_on_gpu(layer):
    """With dropout on, a case's mask replayed through the device RNG (its before_forward) gives the same
    outputs and gradients twice, and the masks are inverted-dropout masks (0 or 1/(1-p))."""
    import cupy

    from numformer.layers import Dropout

    cases = [c for c in build_cases([layer]) if c.before_forward is not None
             and any(isinstance(m, Dropout) and m.p > 0 for m in c.module.modules())]
    assert cases, f"no {layer} case with dropout"
    for case in cases:
        case.module.train()
        case.module.to(cupy)
        for m in case.module.modules():  # stand-alone RandomStates (not the model's) move with their layer
            if isinstance(m, Dropout) and m.rng is not None:
                m.rng.to(cupy)
        case.inputs = {k: cupy.asarray(v) for k, v in case.inputs.items()}
        rng = np.random.default_rng(1)
        up = []

        def upstream(outs):
            if not up:
                up[:] = [cupy.asarray(rng.standard_normal(o.shape)) for o in outs]
            return up

        masks = []
        for m in case.module.modules():
            if isinstance(m, Dropout) and m.p > 0:
                fwd = m.forward

                def keep(x, *a, m=m, fwd=fwd, **k):
                    y = fwd(x, *a, **k)
                    masks.append((m.p, to_host(m.saved["mask"])))
                    return y
                m.forward = keep
        first = _run(case, upstream)
        second = _run(case, upstream)
        assert masks, case.case
        for p, mask in masks:
            assert np.all((mask == 0) | np.isclose(mask, 1 / (1 - p))), case.case
        dropped = np.mean(np.concatenate([(mask == 0).ravel() for _, mask in masks]))
        assert 0 < dropped < 0.5, case.case
        # Equal up to the order of a sum: cupyx's scatter_add (the embedding's gradient) adds with atomics, in
        # whatever order the threads arrive, so two runs differ in the last bits (the first GPU run found them
        # unequal, not by more). A mask drawn anew would change outputs and gradients at order one.
        for a, b in zip(first[0] + list(first[1].values()) + list(first[2].values()),
                        second[0] + list(second[1].values()) + list(second[2].values())):
            assert rel(a, b) < 1e-12, case.case
