#!/usr/bin/env python3
"""Train a Transformer translation model, then average checkpoints and report test BLEU.

Examples:
    python train.py --task reverse --preset tiny --max-steps 600   # a first run: a few minutes on a CPU
    python train.py --corpus bible-en-es                     # the main job: small preset, 25 min on a CPU
    python train.py --corpus bible-en-es --device cuda       # the paper's base model on a GPU
    python train.py --corpus wmt14-en-de --device cuda       # the paper's experiment: WMT 2014, base, two BLEUs
    python train.py --corpus wmt14-en-de --wmt-dir ~/wmt14   # ... from WMT files you have (docs/paper.md)
    python train.py --data my_corpus/ --preset small --max-minutes 60 --out runs/mine
    python train.py --out runs/mine --resume                 # continue where it stopped
    python train.py --task copy --preset tiny --swap LayerNorm=my_layernorm.py:LayerNorm   # your own backward
    mpirun -n 4 python train.py --corpus bible-en-es --device cuda   # 4 GPUs, one process each

This file is the command line and the flow (:func:`main`, top to bottom: parse, open the run, prepare
the data, build the model and the trainer, train, test); the work is in numformer: the settings
(numformer/training/config.py), the run folder and its lock (numformer/training/run_folder.py), the
corpus (numformer/data/prepared_dataset.py), the training step and loop (numformer/training/trainer.py). Under
mpirun (several processes, mpi4py installed) the processes train one model together
(numformer/training/distributed.py, numformer/training/replicas.py): rank 0 alone reads and writes the
run folder and prints; every rank exits with the same status (numformer/training/processes.py).

Exit status: 0 done; 2 bad input or settings, or a run folder in use by another process (one line on
stderr, nothing started); 3 training stopped after a run of non-finite steps (the last good
checkpoint is kept); 130 interrupted by Ctrl-C, 143 by SIGTERM (a cluster scheduler's), 129 by SIGHUP (a
checkpoint of the current step was saved: continue with --resume; a second signal stops at once). Checkpoints are written atomically: a crash or kill at any moment
leaves the previous one loadable.
"""
from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path
from typing import NamedTuple

from numformer.kernels.host import tune_host

tune_host()  # before numpy loads: OpenBLAS reads its thread settings then (numformer/kernels/host/)

from grad_checks.swap_grading import grade_swap, solved_specs  # --swap: the student's layers graded before training
from numformer import run_file_names
from numformer.backend import xp_for
from numformer.checkpoint import load_checkpoint
from numformer.checkpoint.trained_model import load_model
from numformer.cli.arguments import NUMBERS, OneLineParser, beam_size, positive_int
from numformer.cli.front import command_line
from numformer.cli.standard_streams import output_that_may_go
from numformer.decoding.paper_bleu import WHICH_FIGURE, paper_bleu
from numformer.decoding.translation import DecodeOptions, score_translations, translate_lines
from numformer.decoding.valid_choice import choose_alpha, write_choice
from numformer.errors import UsageError, first_line
from numformer.stop_signals import exit_status as stop_exit_status
from numformer.stop_signals import stops_say
from numformer.file_kinds import shown
from numformer.files import atomic_write_text, write_json
from numformer.model import Transformer
from numformer.precision import MODES as PRECISIONS
from numformer.precision import check_precision
from numformer.data.batching import training_pair_sizes
from numformer.data.prepared_dataset import prepare
from numformer.data.sources import CORPORA
from numformer.data.wmt14 import WMT14
from numformer.data.vocab_sample import DEFAULT_VOCAB_SAMPLE
from numformer.presets import ModelConfig, get_preset
from numformer.presets import PRESETS
from numformer.swap import check_layout, swapped_from_specs
from numformer.training.config import RANGES as R
from numformer.training.config import (GPU_RECIPES, TrainConfig, default_out, default_preset, run_json_of,
                                       saved_model_config, settle, source_of)
from numformer.training.processes import parse_on_rank0, processes, wait_for_every_rank
from numformer.training.replicas import SharedRun, share_run
from numformer.training.run_folder import RunFolder
from numformer.training.run_lock import refusal_leaves_folder_as_found
from numformer.training.tensorboard_log import require_writer
from numformer.training.model_flags import TRAINING_ONLY, add_model_flags, clashing_with_init_from
from numformer.training.trainer import Trainer

TRAIN_DEFAULTS, MODEL_DEFAULTS, DECODE_DEFAULTS = TrainConfig(), ModelConfig(), DecodeOptions()
# the length penalty's choice on the validation split: a few percent of the budget (issue: "at most a few percent"),
# and none for runs too short to be worth translating (the tests' runs of a few steps among them)
TUNE_SHARE, TUNE_MIN_TRAIN_S = 0.03, 60.0


class OpenedRun(NamedTuple):
    """What rank 0 opens before training (:func:`open_run`): the run folder, locked by this process, and
    what every rank trains from."""

    folder: RunFolder
    shared: SharedRun


class InitFrom(NamedTuple):
    """The model file ``--init-from`` fine-tunes, as :func:`~numformer.checkpoint.trained_model.load_model`
    reads it."""

    model: Transformer
    vocab: object       # a sentencepiece or a Marian vocabulary
    path: Path          # the file read (of a run folder: its fresh average, else its newest checkpoint)


def parse_args(argv=None, prog: str = "train.py"):
    ap = OneLineParser(prog=prog, description=__doc__.splitlines()[0], epilog=__doc__.split("Examples:")[1],
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_argument_group("data (one of; with --resume, the run's by default)")
    src.add_argument("--corpus", help=f"a corpus the project builds itself: {', '.join(CORPORA)}")
    src.add_argument("--data", metavar="DIR", help="a folder with train/valid/test .src/.tgt files")
    src.add_argument("--task", choices=["copy", "reverse"], help="a synthetic task")
    src.add_argument("--wmt-dir", metavar="DIR",
                     help="with --corpus wmt14-en-de or wmt14-en-fr: your WMT 2014 files (train.en/.de, "
                          "newstest2013.*, newstest2014.*, or a datasets save_to_disk folder) instead of the "
                          "datasets library's download; see docs/paper.md")
    src.add_argument("--vocab-size", type=positive_int,
                     help="shared subword vocabulary size (default: from corpus size)")
    src.add_argument("--vocab-sample", type=positive_int, default=DEFAULT_VOCAB_SAMPLE,
                     help=f"sentences (both sides) the vocabulary is trained on, at most, drawn at random from the "
                          f"training pairs (default {DEFAULT_VOCAB_SAMPLE:,}); see numformer/data/vocab_sample.py")
    src.add_argument("--prepare-only", action="store_true",
                     help="prepare the corpus into OUT (vocabulary, memory-mapped dataset) and stop; the same as "
                          "python -m numformer.prepare")
    m = ap.add_argument_group("model")
    m.add_argument("--preset", choices=list(PRESETS),
                   help="model size (default: the run's with --resume, else small on cpu, base on cuda)")
    m.add_argument("--init-from", metavar="MODEL",
                   help="fine-tune this model (a numformer model file or run folder, or one imported from Hugging "
                        "Face with python -m numformer.checkpoint import): its architecture, weights and vocabulary "
                        "(no new one is trained); the preset gives the training recipe only; see docs/interop.md")
    add_model_flags(m)  # --pre-norm, --untied, --dropout, ...: numformer/training/model_flags.py's table
    m.add_argument("--swap", action="append", metavar="LAYER=FILE.py:CLASS",
                   help="train with your own layer class in place of numformer's LAYER, everywhere the model uses "
                        "it (e.g. LayerNorm=my_layernorm.py:LayerNorm, from python -m grad_checks exercise layernorm); "
                        "repeatable; all=DIR swaps in every layer whose exercise file in DIR checks exact (and "
                        "refuses a folder holding one that does not); see docs/exercises.md")
    t = ap.add_argument_group("training (defaults: the preset's recipe; with --resume, the run's settings)")
    t.add_argument("--max-steps", type=R["max_steps"])
    t.add_argument("--max-minutes", type=R["max_minutes"],
                   help="training time budget (evaluation not counted); on a CPU small's batch size and checkpoint "
                   "interval follow it (numformer/training/budget_recipe.py)")
    t.add_argument("--max-tokens", type=R["max_tokens"], help="tokens per batch, source + target, padding included")
    t.add_argument("--accum", type=R["accum"], help="batches accumulated per optimizer step (default: the "
                                                       "recipe's; base and big: as many as --step-tokens needs)")
    t.add_argument("--step-tokens", type=R["step_tokens"],
                   help="tokens per optimizer step, source + target: the batches accumulated follow --max-tokens "
                        "(base and big: 50000, the paper's ~25k source + 25k target; 0: --accum as given)")
    t.add_argument("--warmup", type=R["warmup"], help="warmup steps of Eq. 3")
    t.add_argument("--lr-factor", type=R["lr_factor"], help="multiplies the learning rate of Eq. 3")
    t.add_argument("--clip-norm", type=R["clip_norm"], help=f"clip the global gradient norm (default {TRAIN_DEFAULTS.clip_norm:g}: off)")
    t.add_argument("--max-len", type=R["max_len"],
                   help=f"leave out training pairs longer than this many subwords (default {TRAIN_DEFAULTS.max_len}; counted in "
                        f"the log; at most the model's positional table, {MODEL_DEFAULTS.max_len})")
    t.add_argument("--stop-after-nonfinite", dest="max_nonfinite_in_a_row", type=R["max_nonfinite_in_a_row"], metavar="N",
                   help=f"non-finite steps are skipped; stop training after N of them in a row "
                        f"(default {TRAIN_DEFAULTS.max_nonfinite_in_a_row})")
    t.add_argument("--device", default=None, help="cpu or cuda (default: $NUMFORMER_DEVICE or cpu)")
    t.add_argument("--precision", choices=list(PRECISIONS),
                   help="matmul arithmetic: fp32 (default), tf32 (GPU tensor cores) or fp16 (float32 master "
                        "weights, dynamic loss scaling; on a CPU emulated and slower); see docs/gpu.md")
    t.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=None,
                   help="GPU: capture each batch shape's step once as a CUDA graph and replay it, so the host no "
                        "longer issues every operation (default off; batches padded to multiples of 8; steps "
                        "that cannot be captured run as usual and say why once); see docs/gpu.md")
    t.add_argument("--seed", type=R["seed"], help=f"seed of weights, dropout and data order (default {TRAIN_DEFAULTS.seed})")
    t.add_argument("--dropout-rng", choices=["stream", "batch"],
                   help="dropout masks from one generator per run (stream, the default with one process) or "
                        "reseeded per batch from its data position (batch: the same masks with any number of "
                        "processes and --accum; always so under mpirun)")
    r = ap.add_argument_group("run folder, checkpoints, evaluation")
    r.add_argument("--out", default=None, help="run folder (default: runs/<data>-<preset>)")
    r.add_argument("--resume", action="store_true",
                   help="continue from the newest checkpoint in --out "
                        "(data, preset and settings default to the run's)")
    r.add_argument("--save-every", type=R["save_every"], help="checkpoint every N steps (0: by time only)")
    r.add_argument("--save-every-minutes", type=R["save_every_minutes"], help="checkpoint every N minutes (0: by steps only)")
    r.add_argument("--keep-last", type=R["keep_last"], help=f"checkpoints kept (default {TRAIN_DEFAULTS.keep_last})")
    r.add_argument("--average-last", type=R["average_last"], help=f"checkpoints averaged at the end (default {TRAIN_DEFAULTS.average_last}; 1: none)")
    r.add_argument("--eval-every", type=R["eval_every"], help="validate every N steps (0: never during training)")
    r.add_argument("--eval-sentences", type=R["eval_sentences"], help=f"validation sentences decoded for BLEU (default {TRAIN_DEFAULTS.eval_sentences})")
    r.add_argument("--log-every", type=R["log_every"], help=f"write a metrics line every N steps (default {TRAIN_DEFAULTS.log_every})")
    r.add_argument("--log-grads", type=R["log_grads"], metavar="N",
                   help="every N steps write per-tensor gradient, weight, update and activation statistics and the "
                        "gradient noise scale (per tensor, layer type and in total, from per-sentence gradients) to "
                        "OUT/grad_stats.jsonl (0: off; default off); draw them with python -m numformer.plot OUT")
    r.add_argument("--tensorboard", action=argparse.BooleanOptionalAction, default=None,
                   help="also write TensorBoard event files into OUT (scalars; with --log-grads N, weight and "
                        "gradient histograms per layer; attention images at each validation); view them with "
                        "tensorboard --logdir OUT (default off; with --resume, the run's). Needs pip install "
                        "'numformer[tensorboard]'; see docs/tensorboard.md")
    r.add_argument("--beam", type=beam_size, default=DECODE_DEFAULTS.beam,
                   help=f"beam size for the final test translation (default {DECODE_DEFAULTS.beam})")
    r.add_argument("--alpha", type=NUMBERS["length penalty"], default=None,
                   help="length penalty for the final test translation (default: chosen on the validation split "
                        f"when --tune-seconds allows, else the paper's {DECODE_DEFAULTS.alpha})")
    r.add_argument("--tune-seconds", type=NUMBERS["seconds or 0"], default=None, metavar="S",
                   help="after training, choose the length penalty on validation sentences for about S seconds "
                        f"(written to the run's {run_file_names.DECODING}; translate.py uses it; 0: the paper's "
                        f"{DECODE_DEFAULTS.alpha}). Default: {TUNE_SHARE * 100:.0f}%% of the training time for runs of "
                        f"{TUNE_MIN_TRAIN_S:.0f} s or more, none for shorter ones")
    r.add_argument("--no-test", action="store_true", help="skip translating the test set at the end")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    if args.corpus is not None and args.corpus not in CORPORA:
        ap.error(f"unknown corpus {args.corpus!r}: choose one of {', '.join(CORPORA)}, or pass --data DIR")
    if args.init_from is not None:
        clash = [flag for flag, given in (("--resume", args.resume), ("--vocab-size", args.vocab_size)) if given]
        clash += clashing_with_init_from(vars(args))
        if clash:
            ap.error(f"--init-from takes the model's architecture and vocabulary as they are: leave out "
                     f"{', '.join(clash)}" + (" (a resumed run continues from its own checkpoint)"
                                              if args.resume else ""))
    if args.wmt_dir is not None and args.corpus not in WMT14:
        ap.error(f"--wmt-dir gives the files of a WMT 2014 corpus: add --corpus {' or --corpus '.join(WMT14)}")
    given = [x for x in (args.corpus, args.data, args.task) if x is not None]
    if len(given) > 1 or (not given and not args.resume):
        ap.error("give exactly one of --corpus NAME, --data DIR or --task copy|reverse")
    if not given and not args.out:
        ap.error("--resume without a data flag needs --out RUN, the run folder to continue")
    if args.keep_last is not None and args.average_last is not None and args.average_last > args.keep_last:
        ap.error(f"--average-last {args.average_last} exceeds --keep-last {args.keep_last}: "
                 "only kept checkpoints can be averaged")
    return args


@command_line("train.py")
def main(argv=None) -> int:
    """train.py: the flow below with numformer's :class:`Trainer`."""
    return train_with(Trainer, argv)


def train_with(trainer_class, argv=None, prog: str = "train.py") -> int:
    """The flow: parse, open the run, prepare the data, build the model and the trainer, train, test.

    ``trainer_class``: numformer's :class:`Trainer`, or a subclass that computes the step elsewhere
    (bench/torch_trainer.py: the same flow, data, schedule, checkpoints and beam search around a PyTorch step).
    """
    args = parse_on_rank0(functools.partial(parse_args, prog=prog), argv)
    phase = RunPhase(prog, args)  # what a stop at any moment says is saved, and the command that goes on
    goes_on = ("the run goes on (the progress bar on standard error; every logged step in the run folder's "
               f"{run_file_names.METRICS}), what it would print dropped")
    with processes(prog, args.device) as procs, stops_say(phase.line), output_that_may_go(prog, goes_on), \
            swapped_from_specs(args.swap, grade=grade_swap, expand=solved_specs):
        world, device = procs.world, procs.device
        xp = xp_for(world.device if world.size > 1 else device)  # cuda asked for but missing: one line, now
        preset = args.preset or default_preset(device, args.corpus)
        out = phase.out = Path(args.out) if args.out else default_out(vars(args), preset)
        opened = world.on_main(open_run, args, device, out, world.size, procs.report)  # rank 0: locked, prepared
        folder = opened.folder if opened is not None else None  # the other ranks never touch the run folder
        try:
            run, mcfg, data = share_run(world, opened.shared if opened is not None else None)
            if args.prepare_only:
                return 0
            tcfg = run.train
            if world.size > 1:
                tcfg.dropout_rng = "batch"  # what the trainer does with several processes; run.json says so
            model = build_model(mcfg, tcfg.seed, args.swap)
            if run.init_from and world.is_main:  # --init-from: its weights (the other ranks get rank 0's)
                load_init_weights(model, run.init_from, out)
            model = model.to(xp)
            print_plan(model, run, tcfg, args, device, world)
            trainer = phase.trainer = trainer_class(model, data, tcfg, folder if folder is not None else out,
                                                    progress=not args.no_progress, world=world, name=run.preset)
            if args.resume and not trainer.resume():
                print("no checkpoint to resume from: starting fresh")
            if world.is_main:
                folder.write_settings(run.record(device, data.source, mcfg.to_dict(), world.size)
                                         | ({"swap": args.swap} if args.swap else {}))
            if trainer.done():
                print(f"already at step {trainer.optimizer.step_count}: nothing left to train "
                      "(raise --max-steps or --max-minutes to train on)")
            phase.now = "training"
            trainer.train()
            if trainer.interrupted:  # no averaging or test translation after a stop: the scheduler's kill follows
                wait_for_every_rank(world)  # mpirun ends the job at the first rank that exits 130
                return stop_exit_status(trainer.stop_signal)  # 130 Ctrl-C, 143 SIGTERM, 129 SIGHUP
            if world.is_main:
                finish(args, trainer, model, data, out, phase)
            world.barrier()  # the other ranks wait, without spinning, while rank 0 tests
            return 0
        finally:
            if folder is not None:
                folder.close()


class RunPhase:
    """Where a run stands, for the one line a stop (Ctrl-C, SIGTERM, SIGHUP) ends it with anywhere outside the
    training loop, whose own line the trainer prints (numformer/training/trainer.py): what is saved and the command
    that finishes the job. ``now``: "before training", "training" (a second signal, which stops at once), then the
    steps after it (the final validation, the checkpoint averaging, the length penalty's choice, the test
    translation: all done again by ``--resume``, which finds the training done)."""

    def __init__(self, prog: str, args):
        self.prog, self.resume, self.now, self.out, self.trainer = prog, args.resume, "before training", None, None

    def line(self, what: str) -> str | None:
        if self.out is None:
            return None
        again = f"{self.prog} --out {shown(self.out)} --resume"
        newest = self.trainer.checkpoints()[-1] if self.trainer is not None and self.trainer.checkpoints() else None
        if self.now == "before training":
            return (f"{what} before training started: nothing new was trained; continue with {again}" if self.resume
                    else f"{what} before training started: nothing was trained; run the same command again")
        if self.now == "training":
            step = self.trainer.optimizer.step_count
            return (f"{what} again, before the checkpoint of step {step} was complete: "
                    + (f"the newest checkpoint is {shown(newest)}; continue with {again}" if newest else
                       "no checkpoint was written yet: run the same command again"))
        return (f"{what} during {self.now}: training is done, its last step saved in {shown(newest)}; finish the "
                f"run (the final validation, averaging and test translation) with {again}")


def open_run(args, device: str, out: Path, processes: int, report):
    """Rank 0: the run's settings worked out from the flags (and, with --resume, its run.json) and checked
    once, its folder locked, the corpus and vocabulary prepared into it. A new run's settings are checked
    before its folder is even created; a run refused on the way leaves its folder as it found it.
    -> :class:`OpenedRun`."""
    with refusal_leaves_folder_as_found(out):
        return _open_run(args, device, out, processes, report)


def _open_run(args, device: str, out: Path, processes: int, report):
    folder = saved = None
    if args.resume:  # the run.json to resume is read under the lock
        folder, report.crash_folder = RunFolder(out), out  # a bug from here on: its traceback in RUN/crash.log
        saved = folder.read_settings()
    run = settle(vars(args), device, saved, out, processes)
    check_runnable(run.train, device)
    if folder is None:  # the lock: another process holding the folder is refused here, in one line
        folder, report.crash_folder = RunFolder(out), out
        folder.check_new_run(source_of(run.source))
    before = saved if saved is not None else folder.read_settings()  # a new run: what an earlier attempt left
    if saved is not None:  # a vocabulary lost from the run is its checkpoints' own, not one trained anew
        folder.restore_vocabulary()
    folder.settle_vocabulary(args.vocab_size, args.resume, (before or {}).get("vocab_size_requested"))
    if saved is not None and saved.get("processes", 1) != processes:
        print(f"note: {out} was trained with {saved.get('processes', 1)} process(es), now {processes}: "
              "each step now takes a different number of batches")
    init = InitFrom(*load_model(run.init_from)) if run.init_from and saved is None else None  # to fine-tune
    if init is not None:
        print(f"init: {init.path} ({init.model.num_parameters() / 1e6:.1f}M parameters, vocabulary "
              f"{init.vocab.size} {'Marian' if getattr(init.vocab, 'kind', 'spm') == 'marian' else 'sentencepiece'})")
    data = prepare(out, run.source["corpus"], run.source["data"], run.source["task"], args.vocab_size,
                   seed=run.train.seed, vocab_sample=args.vocab_sample, log=lambda line: print(f"data: {line}"),
                   wmt_dir=args.wmt_dir, given_vocab=init.vocab if init is not None else None)
    how = f"memory-mapped from {data.folder}, prepared before" if data.reused else f"prepared into {data.folder}"
    print(f"data: {data.source}: {len(data.ids['train'])} training pairs, vocabulary {data.vocab.size} ({how}; "
          f"{data.seconds:.1f} s)")
    if init is not None:  # the model file's architecture; dropout and label smoothing may be set for training
        run.init_from = str(init.path.resolve())
        if args.max_len is None and run.train.max_len > init.model.cfg.max_len:  # the model's table bounds the pairs
            run.train.max_len = init.model.cfg.max_len
            print(f"init: training pairs of up to {run.train.max_len} subwords a side (the model's positional table)")
        mcfg = init.model.cfg.replace(**{k: v for k, v in run.model.items() if k in TRAINING_ONLY})
    elif run.init_from:  # a resumed fine-tuning run: the architecture its run.json recorded
        mcfg = saved_model_config(saved, out)
    else:
        mcfg = get_preset(run.preset, vocab_size=data.vocab.size, pad_id=data.vocab.pad_id, **run.model)
    refuse_a_budget_no_pair_fits(run.train, data, args.max_tokens is None and saved is not None, out)
    return OpenedRun(folder, SharedRun(run, mcfg, data))


def refuse_a_budget_no_pair_fits(train, data, from_run: bool, out) -> None:
    """A token budget smaller than every training pair (``--max-tokens 1``) would train on pairs one at a time,
    each over the budget, without a word: refused in one line naming the smallest budget that holds a pair (a
    refusal here, inside open_run, leaves the run folder as it was found)."""
    sizes = training_pair_sizes(*data.ids["train"].lengths, train.max_len)
    if not sizes.size or int(sizes.min()) <= train.max_tokens:
        return
    name = f"{run_json_of(out)}'s train_config.max_tokens" if from_run else "--max-tokens"
    raise UsageError(f"{name} {train.max_tokens} holds no training pair: the smallest takes {int(sizes.min())} "
                     f"tokens (source + target with BOS and EOS), the largest {int(sizes.max())}: give at least "
                     f"{int(sizes.min())} (a pair larger than the budget is a batch of its own)")


def load_init_weights(model, init_from: str, out: Path) -> None:
    """The weights of the model file a fine-tuning run started from, into ``model``. A resumed run builds its
    model from its run.json: a file edited to another architecture than the one it fine-tunes is the user's to
    correct, one line, not a shape mismatch reported as a bug."""
    weights = load_checkpoint(init_from, with_optimizer=False).model
    try:
        model.load_state_dict(weights)
    except ValueError as exc:
        raise UsageError(f"{run_json_of(out)}'s model_config does not fit {init_from}, the model this run fine-tunes "
                         f"({first_line(exc)}): correct that file") from None


def check_runnable(train, device: str) -> None:
    """What this machine must have for these settings: the precision's device, the optional TensorBoard
    package; a one-line UsageError (exit 2) otherwise."""
    check_precision(train.precision, device)
    if train.cuda_graphs and device == "cpu":
        raise UsageError("--cuda-graphs needs --device cuda (a CUDA graph replays GPU work): on a CPU leave it out")
    if train.tensorboard:
        require_writer()  # a missing optional package: one line with the pip command


def build_model(mcfg, seed: int, swap) -> Transformer:
    """The model of ``mcfg``; with --swap, checked to have numformer's parameter names and shapes, so
    that its checkpoints stay portable."""
    model = Transformer(mcfg, seed=seed)
    if swap:
        check_layout(model, lambda: Transformer(mcfg, seed=seed))
    return model


def print_plan(model, run, tcfg, args, device: str, world) -> None:
    """The first lines of a run: the model, the training budget, the GPU recipe, the processes."""
    print(f"model: preset {run.preset}, {model.num_parameters() / 1e6:.1f}M parameters, device "
          f"{world.device if world.size > 1 else device}; "
          f"training: {tcfg.max_tokens} tokens x {tcfg.accum} per step" + (
              f" (the recipe's ~{tcfg.step_tokens:,} source + target tokens a step)" if tcfg.step_tokens else "")
          + f", warmup {tcfg.warmup}, lr factor "
          f"{tcfg.lr_factor}, " + (f"{tcfg.max_minutes} min" if tcfg.max_minutes else f"{tcfg.max_steps} steps")
          + (", precision " + tcfg.precision if tcfg.precision != "fp32" else ""))
    if run.budget:
        print(f"recipe: {run.preset} for {tcfg.max_minutes:g} min (numformer/training/budget_recipe.py; flags "
              f"override): batches of {tcfg.max_tokens:,} tokens, checkpoints every {tcfg.save_every_minutes:g} min")
    if device != "cpu" and run.preset in GPU_RECIPES and not args.resume:
        print(f"recipe: {run.preset} on a GPU (numformer/training/config.py GPU_RECIPES; flags override): "
              f"checkpoints every {tcfg.save_every_minutes} min, validation every {tcfg.eval_every} steps")
    if world.size > 1:
        print(f"data parallel: {world.size} processes ({world.transport}), each step {world.size} x "
              f"{tcfg.accum} batches of up to {tcfg.max_tokens} tokens")


def finish(args, trainer, model, data, out, phase: RunPhase | None = None) -> None:
    """After training (rank 0): validation loss, checkpoint averaging (Section 6.1), test translation and scores.
    ``phase``: told each step, so that a stop says where it came (a --resume does them all again)."""
    phase = phase or RunPhase("train.py", argparse.Namespace(resume=True))
    phase.now = "the final validation"
    final = trainer.evaluate("valid", 0)
    print(f"trained {trainer.optimizer.step_count} steps in {trainer.elapsed / 60:.1f} min; "
          f"valid loss {final.get('valid_loss', float('nan')):.3f}, ppl {final.get('valid_ppl', float('nan')):.2f}")
    phase.now = "the checkpoint averaging"
    averaged = trainer.average()
    if averaged is not None:
        last_state = model.state_dict()
        model.load_state_dict(load_checkpoint(averaged, with_optimizer=False).model)
        n_avg = min(trainer.cfg.average_last, len(trainer.checkpoints()))
        avg_valid = trainer.evaluate("valid", 0) if final else {}
        if not avg_valid:
            print(f"averaged the last {n_avg} checkpoints "
                  "(no validation data to compare with: keeping the average)")
        else:
            print(f"averaged the last {n_avg} checkpoints: "
                  f"valid loss {avg_valid['valid_loss']:.3f}, ppl {avg_valid['valid_ppl']:.2f}")
            if avg_valid["valid_loss"] > final["valid_loss"]:
                print("the average is worse on validation than the last checkpoint: testing the last checkpoint")
                model.load_state_dict(last_state)
                averaged.unlink()
    phase.now = "the choice of the length penalty"
    alpha, alpha_from = decoding_alpha(args, trainer, model, data, out)
    phase.now = "the test translation"
    if not args.no_test and data.text.get("test") and data.text["test"][0]:
        src, ref = data.text["test"]
        t1 = time.perf_counter()
        opts = DecodeOptions(beam=args.beam, alpha=alpha)
        hyps = translate_lines(model, data.vocab, src, opts)
        secs = time.perf_counter() - t1
        atomic_write_text(out / run_file_names.TEST_HYPOTHESES, "".join(h + "\n" for h in hyps))
        scores = score_translations(hyps, ref)
        corpus = data.source.partition(":")[2] if data.source.startswith("corpus:") else None
        paper = paper_bleu(hyps, ref, WMT14[corpus].target) if corpus in WMT14 else None
        if paper is not None:  # the paper's corpora: its own BLEU beside sacreBLEU's, each labelled
            scores.update(bleu_paper=paper["bleu"], bleu_paper_method=paper["method"],
                          bleu_paper_counts=paper["counts"], bleu_paper_totals=paper["totals"])
        scores.update(sentences=len(src), decode_seconds=round(secs, 1), beam=args.beam, alpha=alpha, alpha_from=alpha_from,
                      steps=trainer.optimizer.step_count, train_minutes=round(trainer.elapsed / 60, 2))
        write_json(out / run_file_names.TEST_SCORES, scores)
        print(f"test: BLEU {scores['bleu']:.2f}  chrF {scores['chrf']:.2f}  ({len(src)} sentences, beam "
              f"{args.beam}, alpha {alpha:g}, {secs:.0f} s)\n{scores['bleu_signature']}")
        if paper is not None:
            print(f"test: BLEU {paper['bleu']:.2f} paper-comparable ({paper['method']}); the one above is "
                  f"sacreBLEU on detokenised text\n{WHICH_FIGURE}")


def decoding_alpha(args, trainer, model, data, out) -> tuple:
    """(alpha, where it came from) for the test translation: ``--alpha``; else chosen on the validation split
    (numformer/decoding/valid_choice.py) within ``--tune-seconds``, written to the run for translate.py; else
    the paper's."""
    if args.alpha is not None:
        return args.alpha, "--alpha"
    seconds = args.tune_seconds
    if seconds is None:
        seconds = TUNE_SHARE * trainer.elapsed if trainer.elapsed >= TUNE_MIN_TRAIN_S else 0.0
    valid = data.text.get("valid")
    if seconds <= 0 or not valid or not valid[0]:
        return DECODE_DEFAULTS.alpha, "the paper's"
    choice = choose_alpha(model, data.vocab, valid[0], valid[1], seconds, beam=args.beam)
    if choice is None:
        return DECODE_DEFAULTS.alpha, "the paper's"
    write_choice(out, choice)
    print(f"decoding: {choice.line()} ({run_file_names.DECODING})")
    return choice.alpha, "validation"


if __name__ == "__main__":
    sys.exit(main())
