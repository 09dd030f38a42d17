"""The training recipes (numformer/training/config.py). ``train.py --device cuda`` with no other flags: base
with a stated time budget that fits bible-en-es; big averages the last 20 checkpoints (Section 6.1).

The paper's recipe (2 x 25k tokens, warmup 4000, 100k steps, no time limit) would be 2,400
epochs of the 28k-pair corpus; the GPU recipe (numformer/training/config.py's GPU_RECIPES) is checked
here, and that every flag still overrides it and the CPU defaults are untouched.
"""
from pathlib import Path

import train
from numformer.training.config import default_out, default_preset, recipe, settle


def _cfg(*flags, device="cuda", preset="base"):
    return settle(vars(train.parse_args(["--corpus", "bible-en-es", "--preset", preset, *flags])), device, None,
                  "runs/x").train


def test_cuda_base_has_a_time_budget_and_a_recipe_for_the_corpus():
    cfg = _cfg("--device", "cuda")
    assert (cfg.max_minutes, cfg.max_steps) == (30, None)
    assert (cfg.max_tokens, cfg.accum, cfg.warmup, cfg.lr_factor) == (12500, 1, 1000, 1.0)
    assert (cfg.save_every_minutes, cfg.eval_every, cfg.precision) == (5, 500, "fp32")


def test_flags_override_the_gpu_recipe():
    cfg = _cfg("--device", "cuda", "--max-steps", "2000", "--warmup", "4000", "--max-tokens", "25000",
               "--accum", "2")
    assert (cfg.max_steps, cfg.max_minutes) == (2000, None)
    assert (cfg.warmup, cfg.max_tokens, cfg.accum) == (4000, 25000, 2)


def test_cpu_defaults_are_unchanged():
    assert _cfg(device="cpu", preset="base").max_steps == 100000  # base on a CPU: the paper's recipe, as before
    small = _cfg(device="cpu", preset="small")
    assert (small.max_minutes, small.max_tokens, small.warmup) == (25, 3000, 500)


def test_the_default_preset_on_cuda_is_base():
    flags = vars(train.parse_args(["--corpus", "bible-en-es", "--device", "cuda"]))
    preset = settle(flags, "cuda", None, "runs/x").preset
    assert preset == default_preset("cuda") == "base"
    assert default_out(flags, preset) == Path("runs/bible-en-es-base")


def test_big_averages_the_last_20_checkpoints():
    tcfg = recipe("big")
    assert tcfg.average_last == 20 and tcfg.keep_last >= 20
    assert recipe("base").average_last == 5


def test_positional_flag_and_the_row_e_preset_choose_learned_positions():
    flags = vars(train.parse_args(["--corpus", "bible-en-es", "--positional", "learned"]))
    assert settle(flags, "cpu", None, "runs/x").model["positional"] == "learned"
    row_e = settle(vars(train.parse_args(["--corpus", "bible-en-es", "--preset", "E-learned"])), "cpu", None, "runs/x")
    assert row_e.preset == "E-learned" and row_e.train == recipe("base")
