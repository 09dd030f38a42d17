"""The cupy path computes what the numpy path computes (run with a GPU: ``pytest -m gpu``).

Skipped without cupy and CUDA. Same weights and inputs on both devices, dropout
off (the two devices draw different random numbers), every output and gradient
compared per tensor with ``norm(a - b) / norm(b)``.
"""
import numpy as np
import pytest

from grad_checks.cases import build_cases
from numformer.backend import to_host
from numformer.decode import beam_search, greedy_search
from numformer.loss import LabelSmoothedCrossEntropy
from numformer.model import Transformer
from numformer.optim import Adam, NoamSchedule
from numformer.presets import get_preset

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
    import cupy

    cpu, gpu = pair(dtype, **kw)
    src, tgt_in, tgt_out = BATCH
    worst = 0.0
    for model, xp in ((cpu, np), (gpu, cupy)):
        crit = LabelSmoothedCrossEntropy(0.1)
        logits = model(xp.asarray(src), xp.asarray(tgt_in))
        model.loss = crit.forward(logits, xp.asarray(tgt_out))
        model.backward(crit.backward())
        model.logits = logits
    assert rel(gpu.logits, cpu.logits) < tol
    assert rel(gpu.loss, cpu.loss) < tol
    for (n, a), (_, b) in zip(gpu.named_parameters(), cpu.named_parameters()):
        worst = max(worst, rel(a.grad, b.grad) if np.linalg.norm(to_host(b.grad)) > 1e-9 else 0.0)
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


@pytest.mark.parametrize("layer", ["LayerNorm", "MultiHeadAttention", "Embedding", "DecoderLayer"])
def test_layer_cases_match_on_gpu(layer):
    """Each grad_checks case run on cupy gives the numpy outputs and gradients."""
    import cupy

    for case in build_cases([layer]):
        rng = np.random.default_rng(0)
        case.module.train()
        outs_cpu = case.forward(case.module, case.inputs)
        outs_cpu = outs_cpu if isinstance(outs_cpu, tuple) else (outs_cpu,)
        up = [rng.standard_normal(o.shape) for o in outs_cpu]
        case.module.zero_grad()
        g_cpu = case.backward(case.module, up)
        p_cpu = {n: p.grad.copy() for n, p in case.module.named_parameters()}
        if case.before_forward is not None:
            continue  # dropout draws differ between devices
        case.module.to(cupy)
        inputs = {k: cupy.asarray(v) for k, v in case.inputs.items()}
        outs_gpu = case.forward(case.module, inputs)
        outs_gpu = outs_gpu if isinstance(outs_gpu, tuple) else (outs_gpu,)
        case.module.zero_grad()
        g_gpu = case.backward(case.module, [cupy.asarray(u) for u in up])
        for a, b in zip(outs_gpu, outs_cpu):
            assert rel(a, b) < 1e-12
        for k in g_cpu:
            assert rel(g_gpu[k], g_cpu[k]) < 1e-12, k
        for n, p in case.module.named_parameters():
            if np.linalg.norm(p_cpu[n]) > 1e-9:
                assert rel(p.grad, p_cpu[n]) < 1e-12, n
