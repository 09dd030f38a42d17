"""table3: the paper's Table 3 ablation (variations on the base model), each row trained alike and compared.

Paper: A. Vaswani et al., "Attention Is All You Need", NeurIPS 2017 (arXiv:1706.03762), Section 6.2 and
Table 3 (variations on the Transformer architecture, En-De newstest2013 dev, no checkpoint averaging).

Claim: changing the base model in one set of columns moves its dev perplexity (per word-piece) and BLEU
in these directions: (A) one attention head is worse than the best head count (the computation held
constant); (B) a smaller key size d_k is worse; (C) bigger models are better (N, d_model, d_ff);
(D) dropout helps (no dropout is worse) while label smoothing hurts perplexity (eps_ls 0 has the lower
PPL; the paper: "hurts perplexity, as the model learns to be more unsure, but improves accuracy and BLEU");
(E) learned positional embeddings are about equal to the sinusoids.

What numformer runs: every chosen row (``--rows``: group letters and/or row names of
:data:`numformer.presets.TABLE3`; ``base`` always, since every direction compares with it) with numformer's
own Trainer, one after the other, each for every seed, with the same data, the same budget (``--steps`` or
``--minutes`` per run) and, for a seed, the same batches in the same order and the same initial draw of every
weight the rows share. The schedule is Eq. 3 (Section 5.3, each row's own d_model) with a warm-up of a fifth
of the step budget (``--warmup`` to change; 120 steps under a ``--minutes`` budget), times ``lr_factor``
(0.25 at small scale, 1.0 at full). No checkpoint averaging (Table 3 has none). After training: dev PPL =
exp of the unsmoothed NLL per target word-piece over the whole valid split; dev BLEU = sacreBLEU of the first
``--dev-sentences`` valid sentences decoded with the paper's beam 4 and length penalty alpha 0.6 (Section
6.1; output at most input + 50). The table puts the paper's dev PPL and BLEU beside numformer's mean over
seeds and its min..max, and says per group whether the paper's direction held, reversed, or fell inside the
seed spread, judged on PPL as the paper words it; the picture shows both.

Shapes and seeds: at ``--scale small`` (the default) each row applies the same relative change to a CPU-sized
base, N 3, d_model 128, d_ff 512, h 8 (d_k = d_v = 16), P_drop 0.1, eps_ls 0.1 (table3_config says why each);
at ``--scale full`` every row is the paper's own shape (N 6, d_model 512, d_ff 2048, h 8; the vocabulary is
the corpus's), for a GPU (``--device cuda``; batches of 12,500 tokens and Eq. 3 at 1.0x unless told
otherwise). ``FULL``: rows A, D and E plus base, 1,000 steps of 2,000 tokens each, seeds 1 and 2,
bible-en-es (8,000 pieces): 20 trainings. ``SMALL`` (the CI's): base and A-h1 on a base of width 32 (2
layers), the synthetic copy task, 30 steps of 600 tokens, seeds 1 and 2, 10 dev sentences.

Resume: each finished (row, seed) is kept as ``OUT/table3/ROW-seedS/result.json`` and its checkpoint dropped;
a started study trains only the runs without one, and renders the table (``OUT/table3.md``, ``.json``,
``.png``, each written beside and renamed over) from every finished run in the folder, so a start with other
``--rows`` adds its rows to the table (table3_record). A run stopped inside its training (Ctrl-C or SIGTERM:
the Trainer saves a checkpoint; a periodic one every ``SAVE_EVERY_MINUTES`` otherwise) continues from its
checkpoint through ``Trainer.resume``; a run folder without a checkpoint is started again clean.

The files, one job each: this module trains and evaluates each (row, seed) and ties the study together;
``table3_config`` (``Config``, ``FULL``, ``SMALL``, the small base, each row's model), ``table3_flags`` (the
command line), ``table3_record`` (the run folders and ``study.json``), ``table3_compare`` (the summary over
seeds, the paper's directions, the integrity check), ``table3_report`` (the table and the picture). Every
name of theirs a caller uses is importable from here.

What numformer found: the measured table, the verdicts and the commit they were measured at are in
docs/studies.md (section table3), not here; ``OUT/table3.md`` is what a run of this code writes.

Where it differs: the paper trains each row 100k steps of 25k + 25k tokens on WMT14 En-De (4.5M pairs) and
scores newstest2013; ``FULL`` trains 1,000 steps of 2,000 tokens on bible-en-es (28k pairs, about one epoch)
with a model about 1/27 of base's size, scored on bible-en-es's own valid split, so a direction that does
not hold is a statement about this budget. Row E's learned table starts as noise (N(0, 1/2), the sinusoids'
scale) where the sinusoids are right from step 0; at d_model 128 the heads of rows A-h16 and A-h32 are 8 and
4 wide, narrower than any head of the paper (16).

Command: ``python -m numformer.studies table3 [--rows A,D,E] [--scale small|full] [--steps S | --minutes M]
[--seeds 1,2] [--corpus NAME | --data DIR] [--out DIR]`` (``--small``: the CI's configuration).
Time: stated at most ``MINUTES`` (60) minutes on 2 cores for ``FULL``, what the progress lines measure
against; docs/studies.md has the measured time.
"""
from __future__ import annotations

import shutil
import time
from dataclasses import asdict
from pathlib import Path

from ..backend import resolve_device, xp_for
from ..checkpoint import vocab_fingerprint
from ..decoding.translation import DecodeOptions
from ..errors import StopTraining
from ..files import write_json
from ..model import Transformer
from ..presets import TABLE3, ModelConfig, count_parameters
from ..run_file_names import CHECKPOINTS, run_checkpoints
from ..training.config import TrainConfig
from ..training.trainer import Trainer
from ..training.validation import evaluate
from .common import Budget, write_outputs
from .table3_compare import (E_TOLERANCE, EFFECTIVE, GROUP_CLAIMS, about_equal, check, compare, directions,
                             effective, summary)
# train_one calls row_config by its name here: a test plants a change by replacing table3.row_config.
from .table3_config import (CITATION, FULL, GROUPS, MINUTES, NAME, SAVE_EVERY_MINUTES, SCALE_DEFAULTS, SCALES,
                            SMALL, SMALL_BASE, TITLE, Config, base_config, row_config, settings, stated_minutes)
from .table3_flags import add_arguments, config_from_args, parse_rows, parse_seeds
from .table3_record import (RESULT, STUDY_FILE, check_study_file, finished_runs, last_train_loss, read_result,
                            run_folder)
from .table3_report import HEADER, as_run, picture, table

__all__ = ["CITATION", "EFFECTIVE", "E_TOLERANCE", "FULL", "GROUPS", "GROUP_CLAIMS", "HEADER", "MINUTES", "NAME",
           "RESULT", "SAVE_EVERY_MINUTES", "SCALES", "SCALE_DEFAULTS", "SMALL", "SMALL_BASE", "STUDY_FILE", "TITLE",
           "Config", "ModelConfig", "about_equal", "add_arguments", "as_run", "base_config", "check",
           "check_study_file", "compare", "config_from_args", "directions", "effective", "finished_runs",
           "last_train_loss", "load_data", "measure", "parse_rows", "parse_seeds", "picture", "read_result",
           "row_config", "run", "run_folder", "settings", "stated_minutes", "summary", "table", "train_one"]


def load_data(cfg: Config, folder: Path, log=print):
    """The study's data, prepared under ``folder`` (OUT/data) on first use and reused after."""
    from ..data.prepared_dataset import prepare  # noqa: PLC0415

    say = lambda line: log(f"data: {line}")  # noqa: E731
    v = f"-v{cfg.vocab_size}" if cfg.vocab_size is not None else ""
    if cfg.task is not None:
        return prepare(folder / f"{cfg.task}{v}", task=cfg.task, vocab_size=cfg.vocab_size, log=say)
    if cfg.data is not None:
        return prepare(folder / f"data-{Path(cfg.data).name}{v}", data_dir=cfg.data, vocab_size=cfg.vocab_size,
                       log=say)
    from .common import bible_data  # noqa: PLC0415

    if cfg.corpus == "bible-en-es":
        return bible_data(folder, log, cfg.vocab_size)  # the folder the other studies share
    return prepare(folder / f"{cfg.corpus}{v}", corpus=cfg.corpus, vocab_size=cfg.vocab_size, log=say)


def train_one(row: str, seed: int, cfg: Config, data, out: Path, log=print) -> dict:
    """Train and evaluate one (row, seed) into its run folder (resuming its checkpoint if it has one); -> the
    result, also written to ``result.json``. Ctrl-C / SIGTERM: the checkpoint is saved, KeyboardInterrupt."""
    s = settings(cfg)
    folder = run_folder(out, row, seed)
    if folder.exists() and not run_checkpoints(folder):
        shutil.rmtree(folder)  # a run stopped before its first checkpoint: start it again clean
    mcfg = row_config(row, cfg, data)
    device = resolve_device(cfg.device)
    model = Transformer(mcfg, seed=seed).to(xp_for(device))
    tcfg = TrainConfig(max_tokens=s["max_tokens"], accum=1, warmup=s["warmup"], lr_factor=s["lr_factor"],
                       max_steps=cfg.steps, max_minutes=cfg.minutes, save_every=0,
                       save_every_minutes=SAVE_EVERY_MINUTES, keep_last=1, average_last=1, eval_every=0,
                       log_every=cfg.log_every, seed=seed)
    trainer = Trainer(model, data, tcfg, folder, progress=False, log=lambda *a: None)
    diverged = None
    try:
        if trainer.resume():
            log(f"[{NAME}] {row} seed {seed}: resumed at step {trainer.optimizer.step_count}")
        try:
            trainer.train()
        except StopTraining as exc:  # non-finite steps: a result of this row at this learning rate
            diverged = str(exc).split(":")[0]
        if trainer.interrupted:  # Ctrl-C or SIGTERM: stop the study (the checkpoint is saved)
            log(f"[{NAME}] stopped during {row} seed {seed} at step {trainer.optimizer.step_count} (checkpoint "
                "saved): run the same command again to resume at this row")
            raise KeyboardInterrupt
        t0 = time.perf_counter()
        found = {} if diverged else evaluate(model, data, "valid", s["max_tokens"], s["dev_sentences"],
                                             DecodeOptions(beam=cfg.beam, alpha=cfg.alpha))
        eval_seconds = time.perf_counter() - t0
    finally:
        trainer.folder.close()
    result = {"row": row, "seed": seed, "config": mcfg.to_dict(), "params": int(model.num_parameters()),
              "steps": int(trainer.optimizer.step_count), "train_seconds": round(trainer.elapsed, 2),
              "eval_seconds": round(eval_seconds, 2), "seconds": round(trainer.elapsed + eval_seconds, 2),
              "train_loss": last_train_loss(folder), "dev_ppl": found.get("valid_ppl"),
              "dev_nll": found.get("valid_nll"), "dev_bleu": found.get("valid_bleu") if s["dev_sentences"] else None,
              "diverged": diverged, "device": device}
    write_json(folder / RESULT, result)
    shutil.rmtree(folder / CHECKPOINTS, ignore_errors=True)  # the numbers are the result; 3x the weights each
    return result


def measure(cfg: Config = FULL, out="runs/studies", log=print) -> dict:
    """Train every (row, seed) not yet finished in ``OUT/table3/``, one after the other; -> every result."""
    cfg.checked()
    out = Path(out)
    data = load_data(cfg, out / "data", log)
    current = {"study": NAME, **settings(cfg), "data_source": data.source,
               "vocab_sha256": vocab_fingerprint(data.vocab)}
    check_study_file(out, current)
    todo = [(row, seed) for row in cfg.rows for seed in cfg.seeds
            if read_result(run_folder(out, row, seed)) is None]
    finished = len(cfg.rows) * len(cfg.seeds) - len(todo)
    if finished:
        log(f"[{NAME}] {finished} of {len(cfg.rows) * len(cfg.seeds)} runs already finished in {out / NAME}: "
            "read back, not trained again")
    budget = Budget(NAME, len(todo), stated_minutes(cfg, len(todo)), log)
    for row, seed in todo:
        r = train_one(row, seed, cfg, data, out, log)
        budget.step(f"{row} seed {seed}: {r['steps']} steps, dev PPL {_fmt(r['dev_ppl'])}, BLEU {_fmt(r['dev_bleu'])}"
                    + (f" (diverged: {r['diverged']})" if r["diverged"] else ""))
    # The table holds every row run into this folder, not only this start's: a start with other --rows adds
    # to it (the runs' result.json are the record; study.json guarantees they share the settings).
    found = finished_runs(out)
    rows = [row for row in TABLE3 if row in cfg.rows or any(r == row for r, _ in found)]
    seeds = list(cfg.seeds) + sorted({s for _, s in found} - set(cfg.seeds))
    kept = [row for row in rows if row not in cfg.rows]
    if kept:
        log(f"[{NAME}] the table keeps rows {', '.join(kept)} run before into {out / NAME} (their result.json)")
    runs = [found[row, seed] for row in rows for seed in seeds if (row, seed) in found]
    base = base_config(cfg, data)
    return {"study": NAME, "config": asdict(cfg), "settings": settings(cfg), "data": data.source,
            "base": base.to_dict(), "base_params": count_parameters(base), "rows": rows,
            "seeds": seeds, "runs": runs, "seconds": round(sum(r["seconds"] for r in runs), 1),
            "wall_seconds": round(budget.seconds, 1)}


def _fmt(x, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def run(out, cfg: Config = FULL, log=print) -> dict:
    """Every (row, seed) into ``OUT/table3/ROW-seedS/`` (result.json, metrics.jsonl), then ``OUT/table3.png``,
    ``.md`` and ``.json`` of every row run into ``OUT``."""
    out = Path(out)
    results = measure(cfg, out, log)
    results["summary"] = summary(results)
    results["directions"] = directions(results)
    return write_outputs(out, NAME, results, check, picture, table)  # each file written beside, renamed over
