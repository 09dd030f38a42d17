"""numformer's device (cupy) branches run, call only what cupy has, and compute what the host path computes.

No GPU in CI: ``tests/cupy_standin.py`` installs a stand-in for cupy whose arrays are
numpy underneath but count as device arrays (``is_cupy_array`` is True, so
``get_array_module`` returns the stand-in and every device-only branch runs). It lends
only names cupy has and refuses host arrays as device operands. Checked here, through
public functions only (model forward/backward, the loss, clipping, ``Adam.step``,
greedy and beam search, ``Module.to``, ``state_dict``):

* a model moved to the stand-in trains two steps with the same results as on the host
  (float64, dropout off; with the sinusoids and with learned positions), and with dropout on through
  the device RNG;
* the embedding backward takes the ``cupyx.scatter_add`` branch; the dropout RNG is
  ``xp.random.default_rng``'s; checkpoints (``state_dict``) come back as host numpy;
* both searches decode the same tokens as on the host.

What this cannot see: cupy behaviour that differs behind the same name, speed, CUDA
errors. ``tests/device/test_gpu.py`` (``pytest -m gpu``) covers those on a real GPU.
"""
import numpy as np
import pytest

pytest.importorskip("cupy", reason="cupy (importable without a GPU) is installed by .ci/setup")
pytest.importorskip("cupyx")

import cupy_standin as cs  # noqa: E402  (tests/ is on sys.path under pytest's rootdir conftest)

from numformer.backend import get_array_module, is_cupy_array, to_host  # noqa: E402
from support import no_exact_gradient  # noqa: E402


def _tiny(dropout=0.0, **changes):
    from numformer.presets import get_preset

    return get_preset("tiny", vocab_size=40, d_model=16, d_ff=32, heads=2, layers=2, dropout=dropout, **changes)


SRC = np.array([[5, 6, 7, 3], [8, 9, 3, 0]])
TGT = np.array([[2, 11, 12, 13, 3], [2, 14, 3, 0, 0]])


def _train(model, steps=2):
    """Two training steps (loss, backward, clipping, Adam); the losses and the weights after."""
    from numformer.loss import LabelSmoothedCrossEntropy
    from numformer.optim import Adam, NoamSchedule, clip_grad_norm

    opt = Adam(model.parameters(), schedule=NoamSchedule(16, warmup=10))
    crit = LabelSmoothedCrossEntropy(0.1, pad_id=0)
    losses = []
    for _ in range(steps):
        logits = model(SRC, TGT[:, :-1])
        loss = crit.forward(logits, TGT[:, 1:], overwrite_logits=True)
        model.backward(crit.backward())
        clip_grad_norm(model.parameters(), 1.0)
        opt.step(zero_grad=True)
        losses.append(float(loss))
    return losses, model.state_dict()


def test_the_standin_counts_as_a_device_array(monkeypatch):
    xp = cs.install(monkeypatch)
    a = xp.zeros(3)
    assert is_cupy_array(a) and get_array_module(a) is xp and get_array_module(np.zeros(3)) is np
    assert type(to_host(a)) is np.ndarray and cs.READS["get"] == 1
    with pytest.raises(AssertionError, match="does not exist in cupy"):
        xp.nanargmin_made_up_name  # noqa: B018
    with pytest.raises(AssertionError, match="where"):
        xp.exp(a, where=a > 0)
    with pytest.raises(TypeError, match="host numpy array"):
        a + np.ones(3)  # cupy refuses a host operand
    with pytest.raises(AssertionError, match="cupy.ndarray has no"):
        a.made_up_method  # noqa: B018
    float(a.sum())
    assert cs.READS["float"] == 1


@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
def test_device_branches_train_like_the_host_path(monkeypatch, positional):
    from numformer.model import Transformer

    host = Transformer(_tiny(positional=positional), seed=0, dtype=np.float64)
    host_losses, host_state = _train(host)

    xp = cs.install(monkeypatch)
    dev = Transformer(_tiny(positional=positional), seed=0, dtype=np.float64).to(xp)
    assert dev.xp is xp and is_cupy_array(dev.src_embed.weight.data) and dev.rng.xp is xp
    dev_losses, dev_state = _train(dev)

    assert cs.SCATTER_CALLS, "the embedding backward did not take the cupyx.scatter_add branch"
    assert all(type(v) is np.ndarray for v in dev_state.values()), "state_dict must hold host arrays"
    np.testing.assert_allclose(dev_losses, host_losses, rtol=1e-12)
    for name in host_state:
        # w_k.bias has an exactly-zero gradient in exact arithmetic (softmax ignores a per-row shift):
        # both paths update it from round-off noise, summed in another order by the host kernels
        atol = 1e-10 if no_exact_gradient(name) else 1e-13
        np.testing.assert_allclose(dev_state[name], host_state[name], rtol=1e-10, atol=atol, err_msg=name)
    assert {"cupy.sqrt", "cupy.take_along_axis", "cupy.where"} <= cs.USED  # the plain math's module calls


def test_device_dropout_uses_the_device_generator(monkeypatch):
    from numformer.model import Transformer

    xp = cs.install(monkeypatch)
    model = Transformer(_tiny(dropout=0.3), seed=0).to(xp)
    assert type(model.rng.counter) is xp.ndarray  # the counter generator's [seed, offset], on the device
    losses, state = _train(model)
    from numformer.counter_rng import read_state  # noqa: PLC0415
    assert read_state(model.rng.counter)[1] > 0  # the masks' draws moved its offset (on the device)
    assert all(np.isfinite(x) for x in losses)
    assert all(np.isfinite(v).all() for v in state.values())


def test_device_searches_decode_like_the_host(monkeypatch):
    from numformer.decoding.search import beam_search, greedy_search
    from numformer.model import Transformer

    host = Transformer(_tiny(), seed=1, dtype=np.float64).eval()
    want_g = [h.tokens for h in greedy_search(host, SRC, bos_id=2, eos_id=3, max_len_a=1, max_len_b=6)]
    want_b = [h[0].tokens for h in beam_search(host, SRC, bos_id=2, eos_id=3, beam=3, max_len_a=1, max_len_b=6)]

    xp = cs.install(monkeypatch)
    dev = Transformer(_tiny(), seed=1, dtype=np.float64).to(xp).eval()
    got_g = [h.tokens for h in greedy_search(dev, SRC, bos_id=2, eos_id=3, max_len_a=1, max_len_b=6)]
    got_b = [h[0].tokens for h in beam_search(dev, SRC, bos_id=2, eos_id=3, beam=3, max_len_a=1, max_len_b=6)]
    assert got_g == want_g
    assert got_b == want_b
    assert "cupy.argsort" in cs.USED  # the device branch of the candidate selection (a sort on a GPU)
