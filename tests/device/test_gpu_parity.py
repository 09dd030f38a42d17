"""PyTorch parity of the whole model on CuPy arrays (run with a GPU: ``pytest -m gpu``).

numformer's Transformer runs on the GPU (cupy); the independent PyTorch mirror
(``tests/reference/torch_mirror.py``, float64 autograd) gets the same weights and numformer's own
dropout masks (drawn by cupy's generator, copied to the host), so dropout is on, as in
training, and in float32 numformer's ReLU active sets (see tests/relu_replay.py). The
logits, the label-smoothed loss and every parameter gradient are compared per tensor with ``norm(a - b) / norm(b)``, as in ``tests/checks/test_torch_parity.py``
(which runs on numpy arrays).
"""
import numpy as np
import pytest

from numformer.backend import to_host
from numformer.layers import Dropout, Linear
from numformer.loss import LabelSmoothedCrossEntropy
from numformer.model import Transformer
from numformer.presets import get_preset
from relu_replay import record_relu_sets

torch = pytest.importorskip("torch")
tm = pytest.importorskip("reference.torch_mirror")

pytestmark = pytest.mark.gpu

SRC = np.array([[5, 6, 7, 8, 9, 3], [10, 11, 3, 0, 0, 0], [12, 3, 0, 0, 0, 0]])
TGT = np.array([[2, 13, 14, 15, 3], [2, 16, 17, 3, 0], [2, 18, 3, 0, 0]])


def rel(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


@pytest.mark.parametrize("dtype,bound", [(np.float64, 1e-9), (np.float32, 1e-4)])
@pytest.mark.parametrize("kw", [dict(dropout=0.1), dict(dropout=0.1, pre_norm=True, tie_embeddings=False)])
def test_transformer_on_cupy_matches_pytorch(dtype, bound, kw):
    import cupy

    cfg = get_preset("tiny", vocab_size=30, d_model=16, d_ff=32, heads=2, layers=2, **kw)
    model = Transformer(cfg, seed=4, dtype=dtype).to(cupy)
    model.train()
    # numformer's masks, as drawn on the device, copied to the host when each Dropout runs
    drops = {}
    for name, mod in model.named_modules():
        if isinstance(mod, Dropout) and mod.p > 0:
            fwd = mod.forward

            def recording(x, *a, name=name, mod=mod, fwd=fwd, **k):
                y = fwd(x, *a, **k)
                drops[name] = torch.from_numpy(np.asarray(to_host(mod.saved["mask"]), dtype=np.float64))
                return y
            mod.forward = recording
    # float32 against the float64 mirror: the mirror takes numformer's ReLU branches (tests/relu_replay.py)
    relu_sets = record_relu_sets(model) if dtype == np.float32 else {}
    linear = {f"{n}.weight" for n, m in model.named_modules() if isinstance(m, Linear)}
    P = tm.MirrorParams([(n, to_host(p.data)) for n, p in model.named_parameters()], linear)

    crit = LabelSmoothedCrossEntropy(cfg.label_smoothing, cfg.pad_id)
    logits = model(cupy.asarray(SRC), cupy.asarray(TGT[:, :-1]))
    host_logits = to_host(logits).copy()
    loss = crit.forward(logits, cupy.asarray(TGT[:, 1:]))
    model.backward(crit.backward())
    assert drops, "no dropout mask was recorded"

    arch = tm.Arch.from_config(cfg)
    replay = {**drops, **{n: torch.from_numpy(a.astype(np.float64)) for n, a in relu_sets.items()}}
    t_logits = tm.transformer(P, torch.from_numpy(SRC), torch.from_numpy(TGT[:, :-1]), arch, replay)
    t_loss = tm.label_smoothed_loss(t_logits, torch.from_numpy(TGT[:, 1:]), cfg.label_smoothing, cfg.pad_id)
    t_loss.backward()

    assert rel(host_logits, t_logits.detach().numpy()) < bound
    assert rel(to_host(loss), t_loss.detach().numpy()) < bound
    want = P.grads()
    scale = max(np.linalg.norm(g) for g in want.values())
    for name, p in model.named_parameters():
        got = to_host(p.grad)
        if np.linalg.norm(want[name]) < 1e-9 * scale:  # zero by symmetry (the key bias: softmax is shift-invariant)
            assert np.linalg.norm(got) < bound * scale, name
        else:
            assert rel(got, want[name]) < bound, name
