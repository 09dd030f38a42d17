"""The paper's recipe on its own corpora (numformer/training/config.py): base by default on any device,
about 25k source + 25k target tokens a step whatever batch the device holds, the averaging count, the
dropout of each language pair; and the expected-time line (numformer/training/forecast.py)."""
import pytest

import train
from numformer.presets import PRESETS
from numformer.training.config import GPU_RECIPES, accumulation, settle
from numformer.training.forecast import StepTimeForecast


def _settle(*flags, device="cpu", corpus="wmt14-en-de"):
    return settle(vars(train.parse_args(["--corpus", corpus, *flags])), device, None, "runs/x")


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_wmt_trains_base_with_the_papers_recipe_on_any_device(device):
    run = _settle(device=device)
    cfg = run.train
    assert run.preset == "base"
    assert (cfg.max_tokens, cfg.accum, cfg.step_tokens) == (25000, 2, 50000)  # not GPU_RECIPES' 12,500 x 1
    assert (cfg.warmup, cfg.lr_factor, cfg.max_steps, cfg.max_minutes) == (4000, 1.0, 100000, None)
    assert (cfg.save_every_minutes, cfg.keep_last, cfg.average_last) == (10, 5, 5)
    assert GPU_RECIPES["base"]["max_tokens"] != cfg.max_tokens


@pytest.mark.parametrize("max_tokens, accum", [(25000, 2), (12500, 4), (6000, 8), (4096, 12), (60000, 1)])
def test_a_smaller_batch_accumulates_to_the_papers_step(max_tokens, accum):
    cfg = _settle("--max-tokens", str(max_tokens)).train
    assert cfg.accum == accum == accumulation(50000, max_tokens)
    assert abs(cfg.accum * cfg.max_tokens - 50000) <= max_tokens / 2   # the nearest whole number of batches


def test_several_processes_share_the_step():
    flags = vars(train.parse_args(["--corpus", "wmt14-en-de", "--max-tokens", "3125"]))
    assert [settle(flags, "cuda", None, "runs/x", processes=n).train.accum for n in (1, 2, 8, 16, 32)] == [16, 8, 2, 1, 1]


def test_a_given_accum_is_taken_as_it_is():
    cfg = _settle("--max-tokens", "6000", "--accum", "3").train
    assert (cfg.accum, cfg.step_tokens) == (3, 0)


def test_big_averages_20_and_its_dropout_depends_on_the_language_pair():
    de, fr = _settle("--preset", "big"), _settle("--preset", "big", corpus="wmt14-en-fr")
    assert (de.train.average_last, de.train.keep_last, de.train.max_steps) == (20, 20, 300000)
    assert "dropout" not in de.model and PRESETS["big"].dropout == 0.3        # Table 3: P_drop 0.3 for big En-De
    assert fr.model["dropout"] == 0.1                                         # Section 6.1: 0.1 for big En-Fr
    assert _settle("--preset", "big", "--dropout", "0.2", corpus="wmt14-en-fr").model["dropout"] == 0.2
    assert "dropout" not in _settle(corpus="wmt14-en-fr").model and PRESETS["base"].dropout == 0.1


def test_other_corpora_keep_their_recipes():
    assert _settle(corpus="bible-en-es").preset == "small"
    gpu = _settle(device="cuda", corpus="bible-en-es").train
    assert (gpu.max_tokens, gpu.accum, gpu.step_tokens) == (12500, 1, 0)


def test_the_forecast_leaves_the_first_step_out_and_scales_to_the_budget():
    f = StepTimeForecast("base", "cpu", start_step=0, max_steps=100000, max_minutes=None, accum=2)
    lines = [f.add(step, 100.0 if step == 1 else 9.0, 24000, 25000) for step in range(1, 8)]
    assert lines[:5] == [None] * 5 and lines[6] is None
    assert lines[5] == ("base on this device (cpu): ~250 h (10.4 days) for 100,000 steps (9.00 s a step over "
                        "steps 2-6; 24,000 source + 25,000 target tokens a step in 2 accumulated batches)")


def test_the_forecast_of_a_resumed_or_timed_run():
    resumed = StepTimeForecast("big", "cuda", start_step=299990, max_steps=300000, max_minutes=None, accum=1)
    said = [resumed.add(s, 2.0, 10, 20) for s in range(299991, 299998)]
    assert said[5].startswith("big on this device (cuda): ~20 s for 10 more steps (2.00 s a step")
    timed = StepTimeForecast("small", "cpu", start_step=0, max_steps=None, max_minutes=25, accum=1)
    said = [timed.add(s, 0.5, 10, 20) for s in range(1, 7)]
    assert said[5].startswith("small on this device (cpu): ~3,000 steps in 25 min (0.50 s a step")
    short = StepTimeForecast("tiny", "cpu", start_step=0, max_steps=3, max_minutes=None, accum=1)
    assert [short.add(s, 1.0, 1, 1) for s in (1, 2)] == [None, None]
    assert short.add(3, 1.0, 1, 1).startswith("tiny on this device (cpu): ~3 s for 3 steps (1.00 s a step over steps 2-3")
