"""Training configuration in one place: :class:`TrainConfig`, the recipe of each preset, and how the
command line's flags and a run's saved settings (``run.json``) settle into one configuration.

The architecture is :class:`numformer.presets.ModelConfig`; everything else about a training run is
a :class:`TrainConfig`, whose defaults are the paper's recipe (Section 5). :data:`RECIPES` changes
them per preset where a setting of the paper is wrong for a run of minutes on a CPU, and
:data:`GPU_RECIPES` for ``base`` on a GPU; each entry says why. :func:`settle` builds a run's
settings: on ``--resume`` from the run's own ``run.json`` (every setting defaults to the run's, and
the data, preset and seed may not change), else from the preset's recipe; given flags override
either. The result is written once, to ``RUN/run.json`` (:meth:`numformer.training.run_folder.RunFolder.write_settings`).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

from ..cli.arguments import NUMBERS
from ..errors import UsageError
from ..precision import MODES as PRECISIONS
from ..presets import PRESETS, TABLE3, ModelConfig
from . import model_flags
from .budget_recipe import budget_recipe


@dataclass
class TrainConfig:
    """Everything about training that is not the architecture (defaults: the paper's recipe)."""

    max_tokens: int = 25000        # tokens per batch, source + target, padding included
    accum: int = 2                 # batches per optimizer step (2 x 25k ~ 25k source + 25k target)
    step_tokens: int = 0           # > 0: accum follows max_tokens, about this many tokens a step (settle())
    warmup: int = 4000
    lr_factor: float = 1.0         # multiplies Eq. 3
    clip_norm: float = 0.0         # 0: no clipping (the paper does not clip)
    max_steps: int | None = None
    max_minutes: float | None = None
    max_len: int = 256             # training pairs longer than this (subwords, per side) are dropped
    save_every: int = 1000         # steps; 0 = only by time
    save_every_minutes: float = 0  # 0 = only by steps
    keep_last: int = 5
    average_last: int = 5
    eval_every: int = 1000
    eval_sentences: int = 200      # validation BLEU on this many sentences (greedy, for speed)
    log_every: int = 10
    seed: int = 1
    log_grads: int = 0             # record per-layer gradient statistics every N steps (0: off)
    tensorboard: bool = False      # also write TensorBoard event files (numformer/training/tensorboard_log.py)
    dropout_rng: str = "stream"    # "stream": one generator per run; "batch": reseeded per batch (trainer.py)
    precision: str = "fp32"        # matmuls: fp32, tf32 (GPU) or fp16 with loss scaling (numformer/precision.py)
    cuda_graphs: bool = False      # GPU: each batch shape's step captured once, replayed (training/step_graphs.py)
    max_nonfinite_in_a_row: int = 10  # this many skipped (non-finite) steps in a row stop training

    def checked(self, positional_table: int | None = None, named: dict | None = None) -> "TrainConfig":
        """Refuse, in one line (UsageError, named by its flag), a configuration training cannot run;
        ``positional_table``: the model's ``max_len``, which ``max_len`` may not exceed; ``named``: {field: how
        the line names it} for values that did not come from a flag (a resumed run's ``run.json``), so that
        the user is not told to change a flag never typed. Returns self."""
        flags = {"max_nonfinite_in_a_row": "--stop-after-nonfinite"}
        flag = lambda field: flags.get(field, "--" + field.replace("_", "-"))  # noqa: E731
        name = lambda field: (named or {}).get(field) or flag(field)  # noqa: E731
        for field in named or {}:  # run.json edited by hand: a value of the wrong type
            default, value = getattr(TrainConfig, field, None), getattr(self, field)
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            wrong = (type(default) in (int, float) and not number or default is None and value is not None and not number
                     or isinstance(default, str) and not isinstance(value, str))
            if wrong:
                raise UsageError(f"{name(field)} is {value!r}, not a {'string' if isinstance(default, str) else 'number'}: "
                                 f"correct it, or resume with {flag(field)} given")
        if self.max_steps is None and self.max_minutes is None:
            raise UsageError("give --max-steps or --max-minutes (or both): training needs an end")
        for field, numbers in RANGES.items():  # the flags' own ranges, for values read from run.json too
            value = getattr(self, field)
            if value is None and field in ("max_steps", "max_minutes"):
                continue
            refused = numbers.refusal(name(field), value)
            if refused is not None:
                raise UsageError(refused + (f": correct it, or resume with {flag(field)} given" if field in (named or {})
                                            else ""))
        if self.precision not in PRECISIONS:
            raise UsageError(f"{name('precision')} must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.dropout_rng not in ("stream", "batch"):
            raise UsageError(f"{name('dropout_rng')} must be stream or batch, got {self.dropout_rng!r}")
        if self.max_len < 2:
            raise UsageError(f"{name('max_len')} must be at least 2 (one token and the EOS), got {self.max_len}")
        if positional_table is not None and self.max_len > positional_table:
            raise UsageError(f"{name('max_len')} {self.max_len} exceeds the model's positional table "
                             f"({positional_table}): use --max-len {positional_table} or less")
        if self.average_last > self.keep_last:
            where = "".join(f" ({name(f)} is {getattr(self, f)})" for f in ("average_last", "keep_last")
                            if f in (named or {}))
            raise UsageError(f"cannot average the last {self.average_last} checkpoints while keeping only "
                             f"{self.keep_last}{where}: raise --keep-last or lower --average-last")
        return self


#: The range of every numeric setting: the type of its flag in train.py and the check of the value a resumed run's
#: run.json holds (numformer/cli/arguments.py's table of numbers).
RANGES = {
    "max_tokens": NUMBERS["count"], "accum": NUMBERS["count"], "step_tokens": NUMBERS["count or 0"],
    "warmup": NUMBERS["count"], "lr_factor": NUMBERS["rate factor"], "clip_norm": NUMBERS["at least 0"],
    "max_steps": NUMBERS["count"], "max_minutes": NUMBERS["minutes"], "max_len": NUMBERS["count"],
    "save_every": NUMBERS["count or 0"], "save_every_minutes": NUMBERS["minutes or 0"],
    "keep_last": NUMBERS["count"], "average_last": NUMBERS["count"], "eval_every": NUMBERS["count or 0"],
    "eval_sentences": NUMBERS["count or 0"], "log_every": NUMBERS["count"], "seed": NUMBERS["seed"],
    "log_grads": NUMBERS["count or 0"], "max_nonfinite_in_a_row": NUMBERS["count"],
}

#: Section 5.1: "Each training batch contained a set of sentence pairs containing approximately 25000 source
#: tokens and 25000 target tokens": one optimizer step's tokens, source + target (max_tokens counts both).
PAPER_STEP_TOKENS = 50000

# The recipe of each preset: TrainConfig's defaults (the paper's) changed where they are wrong for it.
#  * base, big: the paper (Section 5): steps of about 25k source + 25k target tokens (step_tokens 50,000:
#    2 x 25k-token batches, or as many accumulated batches as --max-tokens makes it on a smaller device),
#    warmup 4000, 100k / 300k steps, checkpoints every 10 minutes; big averages the last 20 checkpoints
#    (Section 6.1), so it keeps 20.
#  * small (the CPU main job): 4000 warmup steps would be most of a 25-minute run (~2,500 steps), and on
#    a CPU more, smaller updates train better than fewer large ones: batches of 3,000 padded tokens,
#    warmup 500 and 0.7x Eq. 3 (the measurements behind these: docs/training.md, "Recipes per preset").
#    A CPU run given another --max-minutes changes its batches and checkpoint interval with the budget
#    (budget_recipe.py, from measured sweeps: in 10 minutes 1,500-token batches and a checkpoint every 0.6
#    minutes reached 11.07 validation BLEU on bible-en-es against 8.03 with the 25-minute recipe; a shorter
#    warmup or a lower rate did worse).
#  * tiny: synthetic smoke runs of minutes: batches of 2,000 tokens, warmup 200, 0.5x Eq. 3, where 1.0x
#    (a peak of 6.3e-3 for d_model 128) leaves the reverse task's result to the seed (docs/training.md).
RECIPES: dict[str, dict] = {
    "base": dict(step_tokens=PAPER_STEP_TOKENS, max_steps=100000, save_every=0, save_every_minutes=10),
    "big": dict(step_tokens=PAPER_STEP_TOKENS, max_steps=300000, save_every=0, save_every_minutes=10, keep_last=20,
                average_last=20),
    "small": dict(max_tokens=3000, accum=1, warmup=500, lr_factor=0.7, max_minutes=25, save_every=0,
                  save_every_minutes=1.5, eval_every=500),
    "tiny": dict(max_tokens=2000, accum=1, warmup=200, lr_factor=0.5, max_minutes=10, save_every=200,
                 eval_every=200),
}
# Table 3's variants of base (presets.TABLE3) train with base's recipe: the paper trains every row the same
# 100k steps, big excepted (its own recipe above).
RECIPES.update({name: RECIPES["base"] for name in TABLE3 if name not in RECIPES})

# base on a GPU (``--device cuda``, where base is the default preset). The paper's recipe is for 4.5M
# sentence pairs: on bible-en-es (28k pairs, about 2.1M source + target tokens) a 50k-token step is 1/42
# of an epoch, so 100k steps would be 2,400 epochs, and 4000 warmup steps alone about 95 epochs. Instead:
# batches of 12,500 tokens (about 170 steps an epoch), warmup 1000 (about 6 epochs), Eq. 3's rate, and a
# stated budget of 30 minutes with a checkpoint every 5 and validation every 500 steps. Chosen by this
# arithmetic, not by a measurement: no GPU has run it yet (docs/gpu.md).
GPU_RECIPES: dict[str, dict] = {
    "base": dict(max_tokens=12500, accum=1, step_tokens=0, warmup=1000, max_minutes=30, max_steps=None, save_every=0,
                 save_every_minutes=5, eval_every=500),
}
GPU_RECIPES.update({name: GPU_RECIPES["base"] for name in TABLE3 if name not in ("base", "big")})  # base's variants

SOURCE_FLAGS = ("corpus", "data", "task")   # the data flags, exactly one per run
#: The paper's own corpora (numformer/data/wmt14.py): trained with the paper's recipe on any device, base by default.
PAPER_CORPORA = ("wmt14-en-de", "wmt14-en-fr")
#: Dropout of a preset on one language pair where the paper changed it. Section 6.1: "The Transformer (big)
#: model trained for English-to-French used dropout rate P_drop = 0.1, instead of 0.3."
PAIR_DROPOUT = {("big", "wmt14-en-fr"): 0.1}


def default_preset(device: str, corpus: str | None = None) -> str:
    """The preset of a run that names none: ``small`` on a CPU (the main job), ``base`` on a GPU and,
    on any device, on the paper's own corpora (the experiment of Table 2)."""
    return "small" if device == "cpu" and corpus not in PAPER_CORPORA else "base"


def recipe(preset: str, device: str = "cpu", corpus: str | None = None) -> TrainConfig:
    """The preset's recipe as a TrainConfig: GPU_RECIPES on a GPU, where the preset has one, except on
    the paper's own corpora, which get the paper's recipe whatever the device."""
    changes = dict(RECIPES[preset])
    if device != "cpu" and corpus not in PAPER_CORPORA:
        changes.update(GPU_RECIPES.get(preset, {}))
    return TrainConfig(**changes)


def accumulation(step_tokens: int, max_tokens: int, processes: int = 1) -> int:
    """Batches of up to ``max_tokens`` each of ``processes`` accumulates so that one step holds about
    ``step_tokens`` tokens in all (at least one)."""
    return max(1, round(step_tokens / (max_tokens * processes)))


def default_out(flags: dict, preset: str) -> Path:
    """``runs/<corpus, task or data folder's name>-<preset>``: the run folder when ``--out`` is not given."""
    name = flags.get("corpus") or flags.get("task") or Path(flags["data"]).name
    return Path(f"runs/{name}-{preset}")


def source_of(source: dict) -> str:
    """The data source string preparation records (``corpus:NAME``, ``data:RESOLVED_DIR``, ``task:NAME``)."""
    if source.get("data") is not None:
        return f"data:{Path(source['data']).resolve()}"
    return f"corpus:{source['corpus']}" if source.get("corpus") is not None else f"task:{source['task']}"


def _saved_source(text, where: str = "run.json") -> dict:
    """'corpus:NAME' / 'data:DIR' / 'task:NAME' (run.json's "data") -> the matching flag."""
    kind, _, value = text.partition(":") if isinstance(text, str) else ("", "", "")
    if kind not in SOURCE_FLAGS or not value:
        raise UsageError(f"{where}'s data is {text!r}, not a data source (corpus:NAME, data:DIR or task:NAME): correct "
                         "that file, or resume with the run's --corpus, --data or --task given")
    return {"corpus": None, "data": None, "task": None, kind: value}


def check_saved_run(saved: dict, where: str) -> None:
    """Refuse, in one line naming ``WHERE's FIELD``, a run.json field a resume reads that is of the wrong type or out
    of range (a hand-edited file): its preset, settings groups, the vocabulary size it asked for, its process count,
    the model it fine-tunes. train_config's and model_config's fields are checked where they are read
    (:meth:`TrainConfig.checked`, :func:`check_saved_model_values`)."""
    preset = saved.get("preset")
    if preset is not None and preset not in PRESETS:
        raise UsageError(f"{where}'s preset is {preset!r}, not a preset (one of {', '.join(PRESETS)}): correct that "
                         "file to the run's preset")
    for group in ("train_config", "model_config"):
        if saved.get(group) is not None and not isinstance(saved[group], dict):
            raise UsageError(f"{where}'s {group} is {saved[group]!r}, not the run's settings: restore that file, or "
                             "start a new run with another --out")
    for field, numbers in (("vocab_size_requested", NUMBERS["count"]), ("processes", NUMBERS["count"])):
        if saved.get(field) is not None:
            refused = numbers.refusal(f"{where}'s {field}", saved[field])
            if refused is not None:
                raise UsageError(f"{refused}: correct that file")
    if saved.get("init_from") is not None and not isinstance(saved["init_from"], str):
        raise UsageError(f"{where}'s init_from is {saved['init_from']!r}, not the path of the model it fine-tunes: "
                         "correct that file")


@dataclass
class RunSettings:
    """What a run is, settled: its data source (one of :data:`SOURCE_FLAGS` set), preset, training
    config, the model config's changes to the preset, the ``--vocab-size`` it asked for, and the model
    file it started from (``--init-from``: its architecture and vocabulary, not the preset's)."""

    source: dict
    preset: str
    train: TrainConfig
    model: dict = field(default_factory=dict)
    vocab_size_requested: int | None = None
    init_from: str | None = None
    budget: dict = field(default_factory=dict)  # what budget_recipe changed in the preset's recipe (before flags)

    def record(self, device: str, data: str, model_config: dict, processes: int = 1) -> dict:
        """``run.json``: what a ``--resume`` of this run reads back."""
        from dataclasses import asdict  # noqa: PLC0415

        run = {"preset": self.preset, "device": device, "data": data, "model_config": model_config,
               "train_config": asdict(self.train)}
        if self.vocab_size_requested:
            run["vocab_size_requested"] = self.vocab_size_requested  # the size asked for (the data may allow fewer)
        if processes > 1:
            run["processes"] = processes
        if self.init_from:
            run["init_from"] = self.init_from
        return run


def settle(flags: dict, device: str, saved: dict | None, out, processes: int = 1) -> RunSettings:
    """The run's settings from the command line's ``flags`` (argparse's names; None = not given) and,
    on ``--resume``, the run's own ``run.json`` (``saved``; None for a new run); ``processes``: how many
    train together (the step's tokens are shared out among them).

    A resumed run keeps its data, preset, seed and model: a flag that contradicts them is a one-line
    UsageError. Every other training setting defaults to the run's (or to the preset's recipe for a
    new run) and a given flag overrides it.
    """
    source = {k: flags.get(k) for k in SOURCE_FLAGS}
    preset = flags.get("preset")
    if saved is not None:
        check_saved_run(saved, run_json_of(out))
        old = _saved_source(saved.get("data", ""), run_json_of(out))
        if all(v is None for v in source.values()):
            source = old
        else:
            new_kind = next(k for k, v in source.items() if v is not None)
            old_kind = next(k for k, v in old.items() if v is not None)
            same = new_kind == old_kind and (str(Path(source[new_kind]).resolve()) == old[old_kind]
                                             if new_kind == "data" else source[new_kind] == old[old_kind])
            if not same:
                raise UsageError(f"{out} was trained on {old_kind} {old[old_kind]}, not {new_kind} "
                                 f"{source[new_kind]}: resume with the run's data (or leave the data flag out) "
                                 "or choose another --out")
        run_preset = saved.get("preset")
        if preset is not None and run_preset is not None and preset != run_preset:
            raise UsageError(f"{out} was trained with --preset {run_preset}, not {preset}: resume with --preset "
                             f"{run_preset} (or leave --preset out) or choose another --out")
        preset = preset or run_preset
    elif flags.get("resume") and all(v is None for v in source.values()):
        raise UsageError(f"{out} holds no run.json to resume: give the data flag (--corpus, --data or --task) "
                         "and the run's --preset")
    preset = preset or default_preset(device, source.get("corpus"))
    if preset not in PRESETS:
        raise UsageError(f"unknown preset {preset!r}: choose one of {', '.join(PRESETS)}")
    budget = budget_recipe(preset, flags["max_minutes"]) if (  # a new CPU run's recipe follows its budget
        saved is None and device == "cpu" and flags.get("max_minutes") is not None) else {}
    train = _settle_training(flags, preset, device, saved, source.get("corpus"), processes, budget, out)
    asked = flags.get("vocab_size") or (saved or {}).get("vocab_size_requested")
    model = _settle_model(flags, saved, out)
    if saved is None and flags.get("dropout") is None and (preset, source.get("corpus")) in PAIR_DROPOUT:
        model["dropout"] = PAIR_DROPOUT[preset, source["corpus"]]
    init_from = (saved or {}).get("init_from") if saved is not None else flags.get("init_from")
    if init_from and saved is None:
        init_from = str(Path(init_from).resolve())
    return RunSettings(source, preset, train, model, asked, init_from, budget)


def _settle_training(flags: dict, preset: str, device: str, saved: dict | None, corpus: str | None,
                     processes: int, budget: dict, out=None) -> TrainConfig:
    names = [f.name for f in fields(TrainConfig)]
    from_run = {}  # field -> how a refusal names it: a value read from run.json, not typed
    if saved is not None and isinstance(saved.get("train_config"), dict):
        base = {k: v for k, v in saved["train_config"].items() if k in names}
        from_run = {k: f"{run_json_of(out)}'s train_config.{k}" for k in base if flags.get(k) is None}
        if flags.get("seed") is not None and flags["seed"] != base.get("seed", flags["seed"]):
            raise UsageError(f"--seed {flags['seed']} differs from the run's seed {base['seed']}: a resumed run keeps "
                             "its seed (leave --seed out) or start a new run with another --out")
    else:
        base = {**vars(recipe(preset, device, corpus)), **budget}
    for name in names:  # every TrainConfig field is a flag of the same name
        if flags.get(name) is not None:
            base[name] = flags[name]
    if flags.get("max_steps") is not None and flags.get("max_minutes") is None:
        base["max_minutes"] = None  # a step budget given alone replaces a time budget, and the other way round
    if flags.get("max_minutes") is not None and flags.get("max_steps") is None:
        base["max_steps"] = None
    if flags.get("accum") is not None:  # a given --accum is taken as it is: the step's size follows from it
        base["step_tokens"] = 0
    elif base.get("step_tokens"):  # the paper's step size whatever a batch the device holds (--max-tokens)
        base["accum"] = accumulation(base["step_tokens"], base["max_tokens"], processes)
    return TrainConfig(**base).checked(positional_table=PRESETS[preset].max_len, named=from_run)


#: The model settings a resumed run takes from its run.json unless a flag is given, and the flags that take any
#: value (a refusal suggests them): both from the table of model flags.
RESUMED_MODEL_FIELDS, VALUE_FLAGS = model_flags.RESUMED_MODEL_FIELDS, model_flags.VALUE_FLAGS


def run_json_of(out) -> str:
    """How a refusal names a run's settings file: ``RUN/run.json``."""
    return str(Path(out or ".") / "run.json")


def _settle_model(flags: dict, saved: dict | None, out=None) -> dict:
    """The model config's changes to the preset: the flags', on top of a resumed run's own (checked, and named
    ``RUN/run.json's model_config.FIELD`` when refused: the user typed no flag for them)."""
    changes, given = model_flags.model_changes(flags)
    if saved is not None and isinstance(saved.get("model_config"), dict):
        run = saved["model_config"]
        taken = {k: run[k] for k in RESUMED_MODEL_FIELDS if run.get(k) is not None and not given[k]}
        check_saved_model_values(taken, run_json_of(out))
        changes.update(taken)
    return changes


def saved_model_config(saved: dict, out) -> ModelConfig:
    """The architecture a resumed run's run.json records (a fine-tuning run's, whose model is no preset), checked:
    a field unknown, of the wrong type or out of range is one line naming ``RUN/run.json's model_config.FIELD``."""
    where = run_json_of(out)
    values = saved.get("model_config")
    if not isinstance(values, dict):
        raise UsageError(f"{where}'s model_config is {values!r}, not the model's settings: restore that file, or "
                         "start a new run with another --out")
    unknown = sorted(set(values) - {f.name for f in fields(ModelConfig)})
    if unknown:
        raise UsageError(f"{where}'s model_config has unknown fields {', '.join(map(repr, unknown))}: remove them")
    check_saved_model_values(values, where)
    return ModelConfig.from_dict(values).checked(source=where)


def check_saved_model_values(values: dict, where: str) -> None:
    """Refuse, in one line naming ``WHERE's model_config.FIELD``, a value of ``values`` (model settings read from
    a run's run.json) of the wrong type or out of range: a hand-edited file, never a flag the user typed."""
    for name, value in values.items():
        expected = _expected_type(getattr(ModelConfig, name), value)
        if expected is not None:
            raise UsageError(f"{where}'s model_config.{name} is {value!r}, not {expected}: correct it in that file"
                             + (f", or resume with {VALUE_FLAGS[name]} given" if name in VALUE_FLAGS else ""))
    ModelConfig().replace(**values).checked(source=where)  # the defaults are valid: a refusal names a value here


def _expected_type(default, value) -> str | None:
    """What a model setting whose default is ``default`` must be, when ``value`` is not that (else None). JSON has
    no tuples or sets: the types told apart are true/false, strings, integers (or null) and numbers."""
    if isinstance(default, bool):
        return None if isinstance(value, bool) else "true or false"
    if isinstance(default, str):
        return None if isinstance(value, str) else "a string"
    integer = isinstance(value, int) and not isinstance(value, bool)
    if default is None:  # decoder_layers, d_k, d_v: unset means "follow d_model and heads"
        return None if value is None or integer else "an integer or null"
    if isinstance(default, int):
        return None if integer else "an integer"
    return None if integer or isinstance(value, float) else "a number"
