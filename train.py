#!/usr/bin/env python3
"""Train a Transformer translation model, then average checkpoints and report test BLEU.

Examples:
    python train.py --task reverse --preset tiny --max-steps 600   # a first run: a few minutes on a CPU
    python train.py --corpus bible-en-es                     # the main job: small preset, 25 min on a CPU
    python train.py --corpus bible-en-es --device cuda       # the paper's base model on a GPU
    python train.py --data my_corpus/ --preset small --max-minutes 60 --out runs/mine
    python train.py --out runs/mine --resume                 # continue where it stopped
    python train.py --task copy --preset tiny --swap LayerNorm=my_layernorm.py:LayerNorm   # your own backward
    mpirun -n 4 python train.py --corpus bible-en-es --device cuda   # 4 GPUs, one process each

This file is the command line and the flow; the work is in numformer: the settings
(numformer/training/config.py), the run folder and its lock (numformer/training/run_folder.py), the corpus
(numformer/prepare.py), the training step and loop (numformer/training/trainer.py). Under mpirun (several
processes, mpi4py installed) the processes train one model together (numformer/training/distributed.py,
numformer/training/replicas.py): rank 0 alone reads and writes the run folder and prints; every rank exits
with the same status.

Exit status: 0 done; 2 bad input or settings, or a run folder in use by another process (one line on
stderr, nothing started); 3 training stopped after a run of non-finite steps (the last good
checkpoint is kept); 130 interrupted by Ctrl-C or SIGTERM (a checkpoint of the current step was
saved: continue with --resume). Checkpoints are written atomically: a crash or kill at any moment
leaves the previous one loadable.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import time
import traceback
from pathlib import Path

from numformer.kernels.host.blas_threads import tune_blas_threads

tune_blas_threads()  # before numpy loads: OpenBLAS reads its thread settings then (see the module)

from numformer.backend import resolve_device, xp_for
from numformer.checkpoint import atomic_write, load_checkpoint
from numformer.cli.errors import (OneLineParser, nonneg_float, nonneg_int, one_line_errors, positive_float,
                                  positive_int, probability)
from numformer.training.distributed import SINGLE, exit_code_of, init_world, is_collective, launched_rank
from numformer.layers.init import SCHEMES as INIT_SCHEMES
from numformer.model import Transformer
from numformer.precision import MODES as PRECISIONS
from numformer.precision import check_precision
from numformer.prepare import CORPORA, DEFAULT_VOCAB_SAMPLE, prepare
from numformer.presets import PRESETS, get_preset
from numformer.training.replicas import share_run
from numformer.training.run_folder import RunFolder, write_json
from numformer.swap import check_layout, swapped_from_specs
from numformer.training.tensorboard_log import require_writer
from numformer.training.config import GPU_RECIPES, default_out, default_preset, settle, source_of
from numformer.training.trainer import Trainer
from numformer.decoding.translation import DecodeOptions, score_translations, translate_lines


def parse_args(argv=None):
    ap = OneLineParser(prog="train.py", description=__doc__.splitlines()[0], epilog=__doc__.split("Examples:")[1],
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_argument_group("data (one of; with --resume, the run's by default)")
    src.add_argument("--corpus", help=f"a corpus the project builds itself: {', '.join(CORPORA)}")
    src.add_argument("--data", metavar="DIR", help="a folder with train/valid/test .src/.tgt files")
    src.add_argument("--task", choices=["copy", "reverse"], help="a synthetic task")
    src.add_argument("--vocab-size", type=positive_int,
                     help="shared subword vocabulary size (default: from corpus size)")
    src.add_argument("--vocab-sample", type=positive_int, default=DEFAULT_VOCAB_SAMPLE,
                     help=f"sentences (both sides) the vocabulary is trained on, at most, drawn at random from the "
                          f"training pairs (default {DEFAULT_VOCAB_SAMPLE:,}); see numformer/prepare.py")
    src.add_argument("--prepare-only", action="store_true",
                     help="prepare the corpus into OUT (vocabulary, memory-mapped dataset) and stop; the same as "
                          "python -m numformer.prepare")
    m = ap.add_argument_group("model")
    m.add_argument("--preset", choices=list(PRESETS),
                   help="model size (default: the run's with --resume, else small on cpu, base on cuda)")
    m.add_argument("--pre-norm", action="store_true", help="pre-LN residual blocks instead of the paper's post-LN")
    m.add_argument("--untied", action="store_true", help="separate source, target and output embeddings")
    m.add_argument("--dropout", type=probability, help="dropout probability (default: the preset's)")
    m.add_argument("--label-smoothing", type=probability, help="label smoothing epsilon (default 0.1)")
    m.add_argument("--swap", action="append", metavar="LAYER=FILE.py:CLASS",
                   help="train with your own layer class in place of numformer's LAYER, everywhere the model uses "
                        "it (e.g. LayerNorm=my_layernorm.py:LayerNorm, from python -m grad_checks exercise layernorm); "
                        "repeatable; see docs/exercises.md")
    m.add_argument("--init", choices=list(INIT_SCHEMES),
                   help="initialisation of the linear maps: pytorch (torch.nn.Transformer's, the default) or "
                        "xavier (Xavier-uniform everywhere); see numformer/layers/init.py")
    t = ap.add_argument_group("training (defaults: the preset's recipe; with --resume, the run's settings)")
    t.add_argument("--max-steps", type=positive_int)
    t.add_argument("--max-minutes", type=positive_float, help="training time budget (evaluation not counted)")
    t.add_argument("--max-tokens", type=positive_int, help="tokens per batch, source + target, padding included")
    t.add_argument("--accum", type=positive_int, help="batches accumulated per optimizer step")
    t.add_argument("--warmup", type=positive_int, help="warmup steps of Eq. 3")
    t.add_argument("--lr-factor", type=positive_float, help="multiplies the learning rate of Eq. 3")
    t.add_argument("--clip-norm", type=nonneg_float, help="clip the global gradient norm (default 0: off)")
    t.add_argument("--max-len", type=positive_int,
                   help="leave out training pairs longer than this many subwords (default 256; counted in the log; "
                        "at most the model's positional table, 1024)")
    t.add_argument("--stop-after-nonfinite", dest="max_nonfinite_in_a_row", type=positive_int, metavar="N",
                   help="non-finite steps are skipped; stop training after N of them in a row (default 10)")
    t.add_argument("--device", default=None, help="cpu or cuda (default: $NUMFORMER_DEVICE or cpu)")
    t.add_argument("--precision", choices=list(PRECISIONS),
                   help="matmul arithmetic: fp32 (default), tf32 (GPU tensor cores) or fp16 (float32 master "
                        "weights, dynamic loss scaling; on a CPU emulated and slower); see docs/gpu.md")
    t.add_argument("--seed", type=nonneg_int, help="seed of weights, dropout and data order (default 1)")
    t.add_argument("--dropout-rng", choices=["stream", "batch"],
                   help="dropout masks from one generator per run (stream, the default with one process) or "
                        "reseeded per batch from its data position (batch: the same masks with any number of "
                        "processes and --accum; always so under mpirun)")
    r = ap.add_argument_group("run folder, checkpoints, evaluation")
    r.add_argument("--out", default=None, help="run folder (default: runs/<data>-<preset>)")
    r.add_argument("--resume", action="store_true",
                   help="continue from the newest checkpoint in --out "
                        "(data, preset and settings default to the run's)")
    r.add_argument("--save-every", type=nonneg_int, help="checkpoint every N steps (0: by time only)")
    r.add_argument("--save-every-minutes", type=nonneg_float, help="checkpoint every N minutes (0: by steps only)")
    r.add_argument("--keep-last", type=positive_int, help="checkpoints kept (default 5)")
    r.add_argument("--average-last", type=positive_int, help="checkpoints averaged at the end (default 5; 1: none)")
    r.add_argument("--eval-every", type=nonneg_int, help="validate every N steps (0: never during training)")
    r.add_argument("--eval-sentences", type=nonneg_int, help="validation sentences decoded for BLEU (default 200)")
    r.add_argument("--log-every", type=positive_int, help="write a metrics line every N steps (default 10)")
    r.add_argument("--log-grads", type=nonneg_int, metavar="N",
                   help="every N steps write per-tensor gradient, weight, update and activation statistics to "
                        "OUT/grad_stats.jsonl (0: off; default off); draw them with python -m numformer.plot OUT")
    r.add_argument("--tensorboard", action=argparse.BooleanOptionalAction, default=None,
                   help="also write TensorBoard event files into OUT (scalars; with --log-grads N, weight and "
                        "gradient histograms per layer; attention images at each validation); view them with "
                        "tensorboard --logdir OUT (default off; with --resume, the run's). Needs pip install "
                        "'numformer[tensorboard]'; see docs/tensorboard.md")
    r.add_argument("--beam", type=positive_int, default=4, help="beam size for the final test translation")
    r.add_argument("--alpha", type=nonneg_float, default=0.6, help="length penalty for the final test translation")
    r.add_argument("--no-test", action="store_true", help="skip translating the test set at the end")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    if args.corpus is not None and args.corpus not in CORPORA:
        ap.error(f"unknown corpus {args.corpus!r}: choose one of {', '.join(CORPORA)}, or pass --data DIR")
    given = [x for x in (args.corpus, args.data, args.task) if x is not None]
    if len(given) > 1 or (not given and not args.resume):
        ap.error("give exactly one of --corpus NAME, --data DIR or --task copy|reverse")
    if not given and not args.out:
        ap.error("--resume without a data flag needs --out RUN, the run folder to continue")
    if args.keep_last is not None and args.average_last is not None and args.average_last > args.keep_last:
        ap.error(f"--average-last {args.average_last} exceeds --keep-last {args.keep_last}: "
                 "only kept checkpoints can be averaged")
    return args


def _parse_quietly(argv):
    """parse_args; on ranks other than 0 its messages (a bad flag, --help) are dropped: rank 0 prints them."""
    if launched_rank() == 0:
        return parse_args(argv)
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            return parse_args(argv)
    except SystemExit:
        time.sleep(RANK0_GRACE_S)  # let rank 0 print first: mpirun ends the job at the first failed process
        raise


# Before MPI is running there is nothing to wait on: a rank other than 0 that fails the same way as rank 0
# waits this long before exiting, so that rank 0's one-line message is out before mpirun ends the job.
RANK0_GRACE_S = 1.0


def main(argv=None) -> int:
    args = _parse_quietly(argv)
    world = SINGLE
    with one_line_errors("train.py", crash_folder=lambda: _CRASH_FOLDER.get("out")):
        try:
            world = init_world(resolve_device(args.device))
            if world.size == 1:
                return _main(args, world)
            with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull if not world.is_main
                                                                           else sys.stdout):
                return _main(args, world)
        except BaseException as exc:
            _leave(world, exc)
            raise


def _leave(world, exc: BaseException) -> None:
    """How a rank ends on an exception, with several processes, without leaving the others waiting.

    An exception every rank raises together (marked collective: rank 0's failed set-up or resume,
    a run of non-finite steps, mpi4py missing) is printed by rank 0 alone, in one line; every rank
    then exits with the same status (after a barrier, so the line is out before mpirun ends the
    job). Anything else happened on this rank alone: report it here, then abort the whole job
    (MPI_Abort), since the other ranks would wait for this one forever.
    """
    rank = world.rank if world.size > 1 else launched_rank()
    if is_collective(exc):
        if world.size > 1:
            code = _report(exc) if world.is_main else exit_code_of(exc)
            sys.stderr.flush()
            world.barrier()
            sys.exit(code)
        if rank > 0:
            time.sleep(RANK0_GRACE_S)
            sys.exit(exit_code_of(exc))
        return  # one process (or rank 0 before MPI started): one_line_errors prints it
    if world.size == 1 or isinstance(exc, SystemExit) and exc.code in (0, None):
        return
    code = _report(exc)
    sys.stdout.flush()
    sys.stderr.flush()
    world.abort(code)


def _report(exc: BaseException) -> int:
    """Print ``exc`` as train.py does (one line for a user error, else the traceback); its exit status."""
    try:
        with one_line_errors("train.py"):
            raise exc
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else 1
    except BaseException:  # noqa: BLE001  (a bug: show where)
        traceback.print_exc()
        return 1


def _main(args, world) -> int:
    with swapped_from_specs(args.swap):  # --swap: the user's layer classes wherever numformer builds that layer
        return _train(args, world)


def _train(args, world) -> int:
    """The flow: settle the run in its locked folder, build the model, train, then finish (rank 0)."""
    device = resolve_device(args.device)
    # fails now, in one line, if cuda is asked for but missing; several GPU ranks: this rank's own GPU
    xp = xp_for(world.device if world.size > 1 else device)
    out = Path(args.out) if args.out else default_out(vars(args), args.preset or default_preset(device))
    settled = world.on_main(_settle, args, device, out, world.size)  # rank 0: (its locked folder, the run)
    folder = settled[0] if settled is not None else None
    try:
        run, mcfg, data = share_run(world, settled[1:] if settled is not None else None)
        if args.prepare_only:
            return 0
        tcfg = run.train
        if world.size > 1:
            tcfg.dropout_rng = "batch"  # what the trainer does with several processes; run.json says so
        model = Transformer(mcfg, seed=tcfg.seed)
        if args.swap:  # the same parameter names and shapes as numformer's model: checkpoints stay portable
            check_layout(model, lambda: Transformer(mcfg, seed=tcfg.seed))
        model.to(xp)
        print(f"model: preset {run.preset}, {model.num_parameters() / 1e6:.1f}M parameters, device "
              f"{world.device if world.size > 1 else device}; "
              f"training: {tcfg.max_tokens} tokens x {tcfg.accum} per step, warmup {tcfg.warmup}, lr factor "
              f"{tcfg.lr_factor}, " + (f"{tcfg.max_minutes} min" if tcfg.max_minutes else f"{tcfg.max_steps} steps")
              + (", precision " + tcfg.precision if tcfg.precision != "fp32" else ""))
        if device != "cpu" and run.preset in GPU_RECIPES and not args.resume:
            print(f"recipe: {run.preset} on a GPU (numformer/training/config.py GPU_RECIPES; flags override): "
                  f"checkpoints every {tcfg.save_every_minutes} min, validation every {tcfg.eval_every} steps")
        if world.size > 1:
            print(f"data parallel: {world.size} processes ({world.transport}), each step {world.size} x "
                  f"{tcfg.accum} batches of up to {tcfg.max_tokens} tokens")
        trainer = Trainer(model, data, tcfg, folder if folder is not None else out, progress=not args.no_progress,
                          world=world)
        if args.resume and not trainer.resume():
            print("no checkpoint to resume from: starting fresh")
        if world.is_main:
            record = run.record(device, data.source, mcfg.to_dict(), world.size)
            if args.swap:
                record["swap"] = args.swap
            folder.write_settings(record)
        if trainer.done():
            print(f"already at step {trainer.optimizer.step_count}: nothing left to train "
                  "(raise --max-steps or --max-minutes to train on)")
        trainer.train()
        if trainer.interrupted:
            if world.size > 1:  # mpirun ends the job when the first rank exits 130: rank 0's lines go out first
                sys.stdout.flush()
                world.barrier()
            return 130
        if not world.is_main:
            world.barrier()  # wait, without spinning, while rank 0 validates, averages and decodes the test set
            return 0
        _finish(args, trainer, model, data, out, tcfg)
        world.barrier()
        return 0
    finally:
        if folder is not None:
            folder.close()


_CRASH_FOLDER = {}  # the locked run folder: a crash report goes to its crash.log


def _check_runnable(train, device: str) -> None:
    """What this machine must have for these settings: the precision's device, the optional TensorBoard
    package; a one-line UsageError (exit 2) otherwise."""
    check_precision(train.precision, device)
    if train.tensorboard:
        require_writer()  # a missing optional package: one line with the pip command


def _settle(args, device: str, out: Path, processes: int):
    """Rank 0: lock the run folder, settle the run's settings from the flags (and, with --resume, its
    run.json), checked before anything is written, then prepare the corpus and vocabulary into it.
    A new run's flags are checked before its folder is even created. -> (RunFolder, RunSettings,
    ModelConfig, PreparedData)."""
    if not args.resume:  # refused before the run folder is even created
        _check_runnable(settle(vars(args), device, None, out).train, device)
    folder = RunFolder(out)  # the lock: another process holding the folder is refused here, in one line
    _CRASH_FOLDER["out"] = out
    saved = folder.read_settings() if args.resume else None
    run = settle(vars(args), device, saved, out)
    _check_runnable(run.train, device)
    if not args.resume:
        folder.check_new_run(source_of(run.source))
    before = saved if saved is not None else folder.read_settings()
    folder.settle_vocabulary(args.vocab_size, args.resume, (before or {}).get("vocab_size_requested"))
    if saved is not None and saved.get("processes", 1) != processes:
        print(f"note: {out} was trained with {saved.get('processes', 1)} process(es), now {processes}: "
              "each step now takes a different number of batches")
    data = prepare(out, run.source["corpus"], run.source["data"], run.source["task"], args.vocab_size,
                   seed=run.train.seed, vocab_sample=args.vocab_sample, log=lambda line: print(f"data: {line}"))
    how = f"memory-mapped from {data.folder}, prepared before" if data.reused else f"prepared into {data.folder}"
    print(f"data: {data.source}: {len(data.ids['train'])} training pairs, vocabulary {data.vocab.size} ({how}; "
          f"{data.seconds:.1f} s)")
    mcfg = get_preset(run.preset, vocab_size=data.vocab.size, pad_id=data.vocab.pad_id, **run.model)
    return folder, run, mcfg, data


def _finish(args, trainer, model, data, out, tcfg) -> None:
    """After training (rank 0): validation loss, checkpoint averaging, test translation and scores."""
    final = trainer.evaluate("valid", 0)
    print(f"trained {trainer.optimizer.step_count} steps in {trainer.elapsed / 60:.1f} min; "
          f"valid loss {final.get('valid_loss', float('nan')):.3f}, ppl {final.get('valid_ppl', float('nan')):.2f}")
    averaged = trainer.average()
    if averaged is not None:
        last_state = model.state_dict()
        model.load_state_dict(load_checkpoint(averaged, with_optimizer=False).model)
        n_avg = min(tcfg.average_last, len(trainer.checkpoints()))
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
    if not args.no_test and data.text.get("test") and data.text["test"][0]:
        src, ref = data.text["test"]
        t1 = time.perf_counter()
        opts = DecodeOptions(beam=args.beam, alpha=args.alpha)
        hyps = translate_lines(model, data.vocab, src, opts)
        secs = time.perf_counter() - t1
        hyp_bytes = "".join(h + "\n" for h in hyps).encode("utf-8")
        atomic_write(out / "test.hyp", lambda f: f.write(hyp_bytes))
        scores = score_translations(hyps, ref)
        scores.update(sentences=len(src), decode_seconds=round(secs, 1), beam=args.beam, alpha=args.alpha,
                      steps=trainer.optimizer.step_count, train_minutes=round(trainer.elapsed / 60, 2))
        write_json(out / "test_scores.json", scores)
        print(f"test: BLEU {scores['bleu']:.2f}  chrF {scores['chrf']:.2f}  ({len(src)} sentences, beam "
              f"{args.beam}, {secs:.0f} s)\n{scores['bleu_signature']}")


if __name__ == "__main__":
    sys.exit(main())
