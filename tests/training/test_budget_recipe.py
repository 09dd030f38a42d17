"""The CPU recipe of a time budget (numformer/training/budget_recipe.py): its rule at and between the swept
budgets, and how a run's settings take it (numformer/training/config.py's settle): a new CPU run of ``small``
given ``--max-minutes``, never over a flag the user gave, never on a resumed run, never for another preset or
a GPU."""
import pytest

import train
from numformer.training.budget_recipe import SWEPT_MAX_TOKENS, budget_recipe
from numformer.training.config import RECIPES, settle


def _train(*flags, device="cpu", saved=None):
    return settle(vars(train.parse_args(["--corpus", "bible-en-es", *flags])), device, saved, "runs/x").train


def test_the_main_jobs_budget_gives_the_main_jobs_recipe():
    assert budget_recipe("small", 25) == {"max_tokens": RECIPES["small"]["max_tokens"],
                                          "save_every_minutes": RECIPES["small"]["save_every_minutes"]}


@pytest.mark.parametrize("minutes, tokens, every", [(10, 1500, 0.6), (5, 1500, 0.3), (16, 2100, 0.96),
                                                    (20, 2500, 1.2), (60, 3000, 3.6)])
def test_batches_follow_the_swept_budgets_and_checkpoints_the_budget(minutes, tokens, every):
    assert budget_recipe("small", minutes) == {"max_tokens": tokens, "save_every_minutes": every}


@pytest.mark.parametrize("minutes", [0.05, 0.08, 0.001])
def test_a_very_short_budget_still_checkpoints(minutes):
    # 0 means "no timed checkpoints": a budget of seconds must not round to it
    assert budget_recipe("small", minutes)["save_every_minutes"] == 0.01


def test_batches_grow_with_the_budget_between_the_swept_ones():
    sizes = [budget_recipe("small", m)["max_tokens"] for m in range(1, 40)]
    assert sizes == sorted(sizes)
    assert (sizes[0], sizes[-1]) == (min(SWEPT_MAX_TOKENS.values()), max(SWEPT_MAX_TOKENS.values()))


@pytest.mark.parametrize("preset", ["tiny", "base", "big", "C-N2"])
def test_presets_without_a_budget_rule_keep_their_recipe(preset):
    assert budget_recipe(preset, 10) == {}
    given = _train("--preset", preset, "--max-minutes", "10")
    assert (given.max_tokens, given.save_every_minutes) == (RECIPES[preset].get("max_tokens", 25000),
                                                            RECIPES[preset].get("save_every_minutes", 0))


def test_a_cpu_run_of_small_given_minutes_takes_the_budget_recipe():
    cfg = _train("--max-minutes", "10")
    assert (cfg.max_minutes, cfg.max_tokens, cfg.save_every_minutes) == (10, 1500, 0.6)
    assert (cfg.warmup, cfg.lr_factor, cfg.average_last) == (500, 0.7, 5)  # the preset's, measured best at 10 min


def test_the_main_job_without_minutes_is_unchanged():
    cfg = _train()
    assert (cfg.max_minutes, cfg.max_tokens, cfg.save_every_minutes) == (25, 3000, 1.5)


def test_given_flags_override_the_budget_recipe():
    cfg = _train("--max-minutes", "10", "--max-tokens", "4000", "--save-every-minutes", "2")
    assert (cfg.max_tokens, cfg.save_every_minutes) == (4000, 2)


def test_a_step_budget_and_a_gpu_run_take_no_budget_rule():
    assert _train("--max-steps", "300").max_tokens == 3000
    assert _train("--preset", "small", "--max-minutes", "10", "--device", "cuda", device="cuda").max_tokens == 3000


def test_a_resumed_run_keeps_its_own_batches():
    saved = {"data": "corpus:bible-en-es", "preset": "small",
             "train_config": {**vars(_train()), "max_tokens": 3000, "save_every_minutes": 1.5}}
    cfg = _train("--max-minutes", "10", saved=saved)
    assert (cfg.max_minutes, cfg.max_tokens, cfg.save_every_minutes) == (10, 3000, 1.5)
