"""numformer.studies.table3: the Table 3 ablation as one command. Its small configuration (two rows, a
width-32 base, the copy task, 30 steps, two seeds) writes a table with the paper's and numformer's columns, a
row per Table 3 row and a line per group; a stopped study resumes at the row it was on (from the run's
checkpoint), a finished one trains nothing again, other settings refuse; a planted change (row A-h1 built as
base) is caught by check(); the CLI writes the picture, table and numbers, and a bad flag is one line."""
import json
from dataclasses import replace
from types import SimpleNamespace

import pytest

from numformer.errors import UsageError
from numformer.presets import TABLE3, count_parameters
from numformer.studies import table3
from numformer.training.trainer import Trainer

CFG = table3.SMALL


class Stopped(Exception):
    pass


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """The small study run twice into one folder: the first start is stopped inside A-h1 seed 1 (the third run)
    at step 10, as Ctrl-C leaves a run (its checkpoint saved); the second start finishes it. Plus a reference
    A-h1 seed 1 trained without a stop, in another folder."""
    out = tmp_path_factory.mktemp("table3")
    original, calls = Trainer.train, []

    def stopped_in_the_third_run(self):
        calls.append(self.folder.path.name)
        if len(calls) == 3:
            self.cfg.max_steps = 10
            record = original(self)
            self._interrupted = True  # what SIGINT leaves: the checkpoint of the last step is saved
            return record
        return original(self)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Trainer, "train", stopped_in_the_third_run)
        with pytest.raises(KeyboardInterrupt):
            table3.run(out, CFG, log=lambda line: None)
    first = {(r, s): table3.read_result(table3.run_folder(out, r, s)) for r in CFG.rows for s in CFG.seeds}
    second_log, trained = [], []

    def recorded(self):
        trained.append(self.folder.path.name)
        return original(self)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Trainer, "train", recorded)
        results = table3.run(out, CFG, log=second_log.append)
    reference = tmp_path_factory.mktemp("reference")
    data = table3.load_data(CFG, reference / "data", log=lambda line: None)
    uninterrupted = table3.train_one("A-h1", 1, CFG, data, reference, log=lambda line: None)
    return SimpleNamespace(out=out, results=results, first=first, calls=calls, trained=trained, log=second_log,
                           uninterrupted=uninterrupted)


def test_the_table_has_the_papers_and_numformers_columns_a_row_per_row_and_a_line_per_group(small):
    results = small.results
    assert results["failed"] == [] and table3.check(results) == []
    md = (small.out / "table3.md").read_text()
    assert "| " + " | ".join(table3.HEADER) + " |" in md
    for column in ("paper dev PPL", "numformer dev PPL (min..max)", "paper dev BLEU", "numformer dev BLEU (min..max)",
                   "params", "paper's change", "as run here"):
        assert column in table3.HEADER
    assert "| base | base | base |" in md
    assert f"| A-h1 | {TABLE3['A-h1'].label} | h 1, d_k 32, d_v 32 |" in md  # the paper's 512 is 8x base's d_k
    assert f"| {TABLE3['A-h1'].ppl:.2f} |" in md  # the paper's dev PPL beside numformer's
    group_lines = [line for line in md.splitlines() if line.startswith("* ")]
    assert len(group_lines) == 1 and group_lines[0].startswith("* A,")  # only the groups run
    assert any(v in group_lines[0] for v in ("**held**", "**reversed**", "**inside the seed spread**"))
    assert table3.CITATION in md and "Measured in" in md and "task:copy" in md
    summ = results["summary"]
    assert set(summ) == {"base", "A-h1"} and all(s["seeds"] == 2 for s in summ.values())
    for row in CFG.rows:
        for seed in CFG.seeds:
            folder = table3.run_folder(small.out, row, seed)
            r = json.loads((folder / table3.RESULT).read_text())
            assert r["steps"] == CFG.steps and r["dev_ppl"] > 1 and r["dev_bleu"] is not None
            assert r["params"] == count_parameters(table3.ModelConfig.from_dict(r["config"]))
            assert not (folder / "checkpoints").exists()  # the numbers are kept, not the weights
    a_h1 = table3.ModelConfig.from_dict(next(r["config"] for r in results["runs"] if r["row"] == "A-h1"))
    assert (a_h1.heads, a_h1.head_dim_k, a_h1.d_model) == (1, 32, 32)  # h 1 of 8, d_k 8x: computation constant


def test_a_stopped_study_resumes_at_the_row_it_was_on(small):
    assert small.first[("base", 1)] and small.first[("base", 2)]  # finished before the stop
    assert small.first[("A-h1", 1)] is None and small.first[("A-h1", 2)] is None
    assert small.calls == ["base-seed1", "base-seed2", "A-h1-seed1"]
    assert small.trained == ["A-h1-seed1", "A-h1-seed2"]  # the second start: from the row it was stopped in
    assert any("2 of 4 runs already finished" in line for line in small.log)
    assert any("A-h1 seed 1: resumed at step 10" in line for line in small.log)
    resumed = next(r for r in small.results["runs"] if (r["row"], r["seed"]) == ("A-h1", 1))
    # continued from its checkpoint, the run is the run that was never stopped (bit-identical on the CPU)
    for key in ("steps", "dev_ppl", "train_loss", "dev_bleu"):
        assert resumed[key] == small.uninterrupted[key], key


def test_a_finished_study_trains_nothing_again(small, monkeypatch):
    def no_training(self):
        raise AssertionError("trained again")

    monkeypatch.setattr(Trainer, "train", no_training)
    again = table3.measure(CFG, small.out, log=lambda line: None)
    assert again["runs"] == small.results["runs"]


def test_other_settings_refuse_instead_of_mixing_results(small):
    before = (small.out / "table3" / table3.STUDY_FILE).read_text()
    with pytest.raises(UsageError, match="--out") as err:
        table3.measure(replace(CFG, steps=31), small.out, log=lambda line: None)
    assert "steps 30 (now 31)" in str(err.value) and "\n" not in str(err.value)
    assert (small.out / "table3" / table3.STUDY_FILE).read_text() == before


def test_planted_change_a_row_built_as_base_is_caught(tmp_path, monkeypatch):
    built = table3.row_config
    monkeypatch.setattr(table3, "row_config",
                        lambda name, cfg, data: built("base" if name == "A-h1" else name, cfg, data))
    results = table3.measure(replace(CFG, seeds=(1,)), tmp_path, log=lambda line: None)
    failed = table3.check(results)
    assert any(f.startswith("A-h1 seed 1: built unlike its row") and "heads" in f for f in failed), failed
    assert any(f.startswith("A-h1 seed 1: measured exactly as base") for f in failed), failed
    assert not any(f.startswith("base") for f in failed), failed


def _fake_results(ppl: dict, scale: str = "small") -> dict:
    """Results of the rows in ``ppl`` (row -> dev PPL per seed) without training: each run's config is the one
    the study builds for its row (a 37,000-piece vocabulary)."""
    cfg = replace(table3.FULL, rows=tuple(r for r in TABLE3 if r in ppl), scale=scale, seeds=(1, 2))
    data = SimpleNamespace(vocab=SimpleNamespace(size=37000, pad_id=0))
    runs = []
    for row in cfg.rows:
        mcfg = table3.row_config(row, cfg, data)
        for seed, p in zip(cfg.seeds, ppl[row]):
            runs.append({"row": row, "seed": seed, "config": mcfg.to_dict(), "params": count_parameters(mcfg),
                         "dev_ppl": p, "dev_bleu": 10.0 + p, "train_loss": p, "seconds": 1.0})
    return {"rows": list(cfg.rows), "seeds": list(cfg.seeds), "runs": runs,
            "base": table3.base_config(cfg, data).to_dict()}


@pytest.mark.parametrize("scale", ["small", "full"])
def test_every_row_differs_from_base_in_its_own_columns_only(scale):
    results = _fake_results({row: [10.0 + i, 10.5 + i] for i, row in enumerate(TABLE3)}, scale)
    assert table3.check(results) == []
    if scale == "full":  # the paper's rows, as presets.py defines them
        data = SimpleNamespace(vocab=SimpleNamespace(size=37000, pad_id=0))
        cfg = replace(table3.FULL, scale="full")
        for row in TABLE3:
            assert table3.row_config(row, cfg, data) == TABLE3[row].config, row
    del results["runs"][-1]
    assert table3.check(results) == ["big seed 2: no result"]


def test_directions_held_reversed_or_inside_the_seed_spread():
    results = _fake_results({"base": [10.0, 10.1], "A-h1": [11.0, 11.1], "A-h16": [9.0, 9.1],
                             "B-dk16": [10.1, 10.3], "C-N2": [9.0, 9.2], "C-N4": [12.0, 12.1],
                             "D-drop0.0": [10.3, 10.4], "D-ls0.0": [9.5, 9.6], "E-learned": [10.2, 10.2]})
    d = table3.directions(results)
    assert set(d) == {"A", "B", "C", "D", "E"}
    assert d["A"][0]["better"] == "A-h16" and d["A"][0]["verdict"] == "held"
    assert d["B"][0]["verdict"] == "inside the seed spread"
    assert [(p["worse"], p["better"], p["verdict"]) for p in d["C"]] == [
        ("C-N2", "C-N4", "reversed"), ("C-N4", "base", "held")]
    assert [(p["worse"], p["better"], p["verdict"]) for p in d["D"]] == [
        ("D-drop0.0", "base", "held"), ("base", "D-ls0.0", "held")]
    assert d["E"][0]["verdict"] == "held (within 2% of base)"
    results["runs"] = [r for r in results["runs"] if r["row"] != "E-learned"] + [
        dict(r, row="E-learned", dev_ppl=12.0) for r in results["runs"] if r["row"] == "base"]
    assert table3.directions(results)["E"][0]["verdict"].startswith("differs (+19")


def test_rows_take_group_letters_and_row_names():
    assert table3.parse_rows("A,D,E") == ("base", "A-h1", "A-h4", "A-h16", "A-h32", "D-drop0.0", "D-drop0.2",
                                          "D-ls0.0", "D-ls0.2", "E-learned")
    assert table3.parse_rows("e, a-h1") == ("base", "A-h1", "E-learned")
    assert table3.FULL.rows == table3.parse_rows("A,D,E")
    with pytest.raises(UsageError, match="'Z'"):
        table3.parse_rows("A,Z")


def test_cli_writes_the_picture_the_table_and_the_numbers(small):
    from numformer.studies.__main__ import main

    assert main(["table3", "--small", "--out", str(small.out)]) == 0  # every run read back: nothing trained
    png, md, js = (small.out / f"table3.{ext}" for ext in ("png", "md", "json"))
    assert png.read_bytes().startswith(b"\x89PNG")
    assert " | ".join(table3.HEADER) in md.read_text()
    numbers = json.loads(js.read_text())
    assert numbers["failed"] == [] and len(numbers["runs"]) == 4 and "A" in numbers["directions"]


@pytest.mark.parametrize("flags, says", [
    (["--rows", "A,Z"], "unknown row or group 'Z'"),
    (["--steps", "5", "--minutes", "1"], "not allowed with argument"),
    (["--data", "/no/such/folder"], "does not exist"),
    (["--seeds", "1,x"], "--seeds"),
])
def test_cli_refuses_a_bad_flag_in_one_line(flags, says, capsys, tmp_path):
    from numformer.studies.__main__ import main

    code = main(["table3", "--out", str(tmp_path), *flags])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and says in err, err
    assert not (tmp_path / "table3").exists()
