"""Checkpoints: round trip, atomic writes, clear errors, averaging, no pickles."""

import numpy as np
import pytest

from numformer.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from numformer.model import Transformer
from numformer.optim import Adam, NoamSchedule
from numformer.presets import get_preset
from numformer.checkpoint.averaging import average_checkpoints


def model(seed=0):
    return Transformer(get_preset("tiny", vocab_size=30, d_model=16, d_ff=32, heads=2), seed=seed)


def test_round_trip_with_optimizer(tmp_path):
    m = model()
    opt = Adam(m.parameters(), schedule=NoamSchedule(16, 10))
    for p in m.parameters():
        p.grad[...] = 0.01
    opt.step()
    path = tmp_path / "ck.npz"
    save_checkpoint(path, m.state_dict(), {"step": 1, "config": m.cfg.to_dict()}, opt.state_dict())
    ck = load_checkpoint(path)
    assert ck.meta["step"] == 1 and ck.optimizer["step_count"] == 1
    m2 = model(seed=5)
    m2.load_state_dict(ck.model)
    opt2 = Adam(m2.parameters(), schedule=NoamSchedule(16, 10))
    opt2.load_state_dict(ck.optimizer)
    for a, b in zip(m.parameters(), m2.parameters()):
        assert np.array_equal(a.data, b.data)
    for a, b in zip(opt.m + opt.v, opt2.m + opt2.v):
        assert np.array_equal(a, b)
    with np.load(path, allow_pickle=False) as z:  # loads without pickle
        assert "meta" in z.files


def test_errors_are_one_line(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "missing.npz")
    good = tmp_path / "good.npz"
    save_checkpoint(good, model().state_dict(), {"step": 3})
    data = good.read_bytes()
    bad = tmp_path / "truncated.npz"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt") as err:
        load_checkpoint(bad)
    assert "\n" not in str(err.value)
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not a zip file at all")
    with pytest.raises(CheckpointError, match="is a text file, not a model"):  # named as what it is
        load_checkpoint(junk)


def test_failed_write_keeps_previous_file(tmp_path):
    path = tmp_path / "ck.npz"
    save_checkpoint(path, model().state_dict(), {"step": 1})
    before = path.read_bytes()

    class Boom(dict):
        def items(self):
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        save_checkpoint(path, Boom(), {"step": 2})
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["ck.npz"]  # no temporary file left behind


def test_average(tmp_path):
    paths = []
    for i in range(3):
        p = tmp_path / f"ck{i}.npz"
        save_checkpoint(p, model(seed=i).state_dict(), {"step": i})
        paths.append(p)
    avg = average_checkpoints(paths)
    expect = np.mean([model(seed=i).state_dict()["src_embed.weight"].astype(np.float64) for i in range(3)], axis=0)
    np.testing.assert_allclose(avg.model["src_embed.weight"], expect, rtol=1e-6)
    assert avg.model["src_embed.weight"].dtype == np.float32
    assert avg.meta["step"] == 2 and len(avg.meta["averaged_from"]) == 3


def test_average_command(tmp_path):
    from numformer.checkpoint_command import main

    run = tmp_path / "run"
    for i in range(4):
        save_checkpoint(run / "checkpoints" / f"step_{i:07d}.npz", model(seed=i).state_dict(), {"step": i})
    assert main(["average", "--last", "2", str(run), "--out", str(run / "averaged.npz")]) == 0
    avg = load_checkpoint(run / "averaged.npz")
    expect = (model(seed=2).state_dict()["src_embed.weight"].astype(np.float64)
              + model(seed=3).state_dict()["src_embed.weight"]) / 2
    np.testing.assert_allclose(avg.model["src_embed.weight"], expect, rtol=1e-6)
    assert main(["average", str(tmp_path / "none.npz"), "--out", str(tmp_path / "x.npz")]) == 2
