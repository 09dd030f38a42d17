#!/usr/bin/env python3
"""Train a Transformer translation model, then average checkpoints and report test BLEU.

Examples:
    python train.py --corpus bible-en-es                     # the main job: small preset, 25 min on a CPU
    python train.py --corpus bible-en-es --device cuda       # the paper's base model on a GPU
    python train.py --task reverse --preset tiny --max-steps 600
    python train.py --data my_corpus/ --preset small --max-minutes 60 --out runs/mine
    python train.py --out runs/mine --resume                 # continue where it stopped
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from numformer.backend import resolve_device, xp_for
from numformer.cli_common import one_line_errors
from numformer.model import Transformer
from numformer.prepare import prepare
from numformer.presets import PRESETS, get_preset
from numformer.trainer import TrainConfig, Trainer
from numformer.translation import DecodeOptions, score_translations, translate_lines

# Training defaults per preset. base and big follow the paper (Section 5); the CPU
# presets differ where a paper setting is wrong for a run of minutes:
#  * small (the CPU main job): 4000 warmup steps would be most of a 25-minute run
#    (~2,500 steps), and on a CPU more, smaller updates beat fewer large ones
#    (DESIGN.md: warmup >= 1000 or 8k-token batches trained visibly worse in 5
#    minutes), so batches of 3,000 padded tokens, warmup 500 and 0.7x Eq. 3.
#  * tiny: synthetic smoke runs of a minute: batches of 2,000 tokens, warmup 200.
TRAIN_PRESETS = {
    "base": dict(max_tokens=25000, accum=2, warmup=4000, lr_factor=1.0, max_minutes=None, max_steps=100000,
                 save_every=0, save_every_minutes=10, eval_every=1000),
    "big": dict(max_tokens=25000, accum=2, warmup=4000, lr_factor=1.0, max_minutes=None, max_steps=300000,
                save_every=0, save_every_minutes=10, eval_every=1000),
    "small": dict(max_tokens=3000, accum=1, warmup=500, lr_factor=0.7, max_minutes=25, max_steps=None,
                  save_every=0, save_every_minutes=1.5, eval_every=500),
    "tiny": dict(max_tokens=2000, accum=1, warmup=200, lr_factor=1.0, max_minutes=10, max_steps=None,
                 save_every=200, save_every_minutes=0, eval_every=200),
}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("Examples:")[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_argument_group("data (one of)")
    src.add_argument("--corpus", help="a corpus the project builds itself: bible-en-es")
    src.add_argument("--data", metavar="DIR", help="a folder with train/valid/test .src/.tgt files")
    src.add_argument("--task", choices=["copy", "reverse"], help="a synthetic task")
    src.add_argument("--vocab-size", type=int, help="shared subword vocabulary size (default: from corpus size)")
    m = ap.add_argument_group("model")
    m.add_argument("--preset", choices=list(PRESETS), help="model size (default: small on cpu, base on cuda)")
    m.add_argument("--pre-norm", action="store_true", help="pre-LN residual blocks instead of the paper's post-LN")
    m.add_argument("--untied", action="store_true", help="separate source, target and output embeddings")
    m.add_argument("--dropout", type=float, help="dropout probability (default: the preset's)")
    m.add_argument("--label-smoothing", type=float, help="label smoothing epsilon (default 0.1)")
    t = ap.add_argument_group("training (defaults: the preset's recipe)")
    t.add_argument("--max-steps", type=int)
    t.add_argument("--max-minutes", type=float, help="training time budget (evaluation not counted)")
    t.add_argument("--max-tokens", type=int, help="tokens per batch, source + target, padding included")
    t.add_argument("--accum", type=int, help="batches accumulated per optimizer step")
    t.add_argument("--warmup", type=int, help="warmup steps of Eq. 3")
    t.add_argument("--lr-factor", type=float, help="multiplies the learning rate of Eq. 3")
    t.add_argument("--clip-norm", type=float, default=0.0, help="clip the global gradient norm (0: off)")
    t.add_argument("--max-len", type=int, default=256, help="drop training pairs longer than this (subwords)")
    t.add_argument("--device", default=None, help="cpu or cuda (default: $NUMFORMER_DEVICE or cpu)")
    t.add_argument("--seed", type=int, default=1)
    r = ap.add_argument_group("run folder, checkpoints, evaluation")
    r.add_argument("--out", default=None, help="run folder (default: runs/<data>-<preset>)")
    r.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    r.add_argument("--save-every", type=int, help="checkpoint every N steps (0: by time only)")
    r.add_argument("--save-every-minutes", type=float, help="checkpoint every N minutes (0: by steps only)")
    r.add_argument("--keep-last", type=int, default=5, help="checkpoints kept")
    r.add_argument("--average-last", type=int, default=5, help="checkpoints averaged at the end (1: none)")
    r.add_argument("--eval-every", type=int, help="validate every N steps")
    r.add_argument("--eval-sentences", type=int, default=200, help="validation sentences decoded for BLEU")
    r.add_argument("--log-every", type=int, default=10, help="write a metrics line every N steps")
    r.add_argument("--beam", type=int, default=4, help="beam size for the final test translation")
    r.add_argument("--alpha", type=float, default=0.6, help="length penalty for the final test translation")
    r.add_argument("--no-test", action="store_true", help="skip translating the test set at the end")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    if sum(x is not None for x in (args.corpus, args.data, args.task)) != 1:
        ap.error("give exactly one of --corpus NAME, --data DIR or --task copy|reverse")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    with one_line_errors("train.py"):
        device = resolve_device(args.device)
        xp = xp_for(device)  # fails now, in one line, if cuda is asked for but missing
        preset = args.preset or ("small" if device == "cpu" else "base")
        name = args.corpus or args.task or Path(args.data).name
        out = Path(args.out or f"runs/{name}-{preset}")
        run_file = out / "run.json"
        if out.exists() and any(out.iterdir()) and not args.resume and (out / "checkpoints").exists():
            raise ValueError(f"{out} already holds a run: pass --resume to continue it or choose another --out")
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write_test"
        probe.write_text("ok")  # an unwritable folder fails now, not after an hour
        probe.unlink()

        tdef = dict(TRAIN_PRESETS[preset])
        for key in ("max_steps", "max_minutes", "max_tokens", "accum", "warmup", "lr_factor", "save_every",
                    "save_every_minutes", "eval_every"):
            if getattr(args, key) is not None:
                tdef[key] = getattr(args, key)
        if args.max_steps is not None and args.max_minutes is None:
            tdef["max_minutes"] = None
        if args.max_minutes is not None and args.max_steps is None:
            tdef["max_steps"] = None
        tcfg = TrainConfig(clip_norm=args.clip_norm, max_len=args.max_len, keep_last=args.keep_last,
                           average_last=max(1, args.average_last), eval_sentences=args.eval_sentences,
                           log_every=args.log_every, seed=args.seed, **tdef)
        tcfg.validate()

        t0 = time.perf_counter()
        data = prepare(out, args.corpus, args.data, args.task, args.vocab_size, seed=args.seed)
        n_train = len(data.ids["train"][0])
        print(f"data: {data.source}: {n_train} training pairs, vocabulary {data.vocab.size} "
              f"({time.perf_counter() - t0:.1f} s)")
        overrides = dict(vocab_size=data.vocab.size, pad_id=data.vocab.pad_id, pre_norm=args.pre_norm,
                         tie_embeddings=not args.untied)
        if args.dropout is not None:
            overrides["dropout"] = args.dropout
        if args.label_smoothing is not None:
            overrides["label_smoothing"] = args.label_smoothing
        mcfg = get_preset(preset, **overrides)
        model = Transformer(mcfg, seed=args.seed)
        model.to(xp)
        run_file.write_text(json.dumps({"preset": preset, "device": device, "data": data.source,
                                        "model_config": mcfg.to_dict(), "train_config": asdict(tcfg)}, indent=2))
        print(f"model: preset {preset}, {model.num_parameters() / 1e6:.1f}M parameters, device {device}; "
              f"training: {tcfg.max_tokens} tokens x {tcfg.accum} per step, warmup {tcfg.warmup}, "
              f"lr factor {tcfg.lr_factor}, " + (f"{tcfg.max_minutes} min" if tcfg.max_minutes else f"{tcfg.max_steps} steps"))
        trainer = Trainer(model, data, tcfg, out, progress=not args.no_progress)
        if args.resume and not trainer.resume():
            print("no checkpoint to resume from: starting fresh")
        trainer.train()
        if trainer._interrupted:
            return 130
        final = trainer.evaluate("valid", 0)
        print(f"trained {trainer.optimizer.step_count} steps in {trainer.elapsed / 60:.1f} min; "
              f"valid loss {final.get('valid_loss', float('nan')):.3f}, ppl {final.get('valid_ppl', float('nan')):.2f}")
        averaged = trainer.average()
        if averaged is not None:
            from numformer.checkpoint import load_checkpoint  # noqa: PLC0415

            last_state = model.state_dict()
            model.load_state_dict(load_checkpoint(averaged, with_optimizer=False).model)
            avg_valid = trainer.evaluate("valid", 0)
            print(f"averaged the last {min(tcfg.average_last, len(trainer.checkpoints()))} checkpoints: "
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
            (out / "test.hyp").write_text("".join(h + "\n" for h in hyps))
            scores = score_translations(hyps, ref)
            scores.update(sentences=len(src), decode_seconds=round(secs, 1), beam=args.beam, alpha=args.alpha,
                          steps=trainer.optimizer.step_count, train_minutes=round(trainer.elapsed / 60, 2))
            (out / "test_scores.json").write_text(json.dumps(scores, indent=2) + "\n")
            print(f"test: BLEU {scores['bleu']:.2f}  chrF {scores['chrf']:.2f}  ({len(src)} sentences, beam "
                  f"{args.beam}, {secs:.0f} s)\n{scores['bleu_signature']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
