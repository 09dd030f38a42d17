#!/usr/bin/env python3
"""The GPU acceptance run: one command that proves the CuPy path and measures it.

    python3 bench/gpu_acceptance.py OUT --corpus-dir .gpu_carry/bible-en-es   # on one GPU, under 9 minutes
    python3 bench/gpu_acceptance.py OUT --device cpu --quick                  # the dry run (seconds a part; CI)

Parts, each in its own child process with its own time box (a part that fails or runs
out of time is recorded as such and the others still run):

    env           nvidia-smi, driver/CUDA/cupy/torch versions, the device's name
    gpu_tests     python -m pytest -m gpu tests/ (tests/device/test_gpu_parity.py apart, see torch_parity)
    grad_checks   every grad_checks case on the device in float64 (bench/gpu_grad_checks.py)
    torch_parity  python -m pytest -m gpu tests/device/test_gpu_parity.py (whole model on cupy vs the torch mirror)
    kernels       NUMFORMER_TEST_DEVICE=<device> python -m pytest tests/kernels/test_kernels.py ('missing' if absent)
    train         train.py --preset base --device cuda --max-minutes 4 on the corpus: validation loss curve
    train_step    bench/gpu_train_step.py: base, 25,000 target tokens, fp32/tf32/fp16, numformer vs PyTorch
    decode        greedy and beam 4 on the test set: a fresh small model and the base model of the train part

The train part runs in the background while the correctness parts (env to kernels) run;
train_step and decode run after it, alone on the device, so their timings are clean.
Everything stops at ``--budget-s`` (default 530 s): parts not started by then are
recorded as 'out of time'.

Output (at most 8 files, no sub-folders; the format is described in docs/gpu.md ("The acceptance run")):

    OUT/summary.json        one JSON object: versions, every part's status, seconds and figures
    OUT/log.txt             each part's command and its whole output, in order
    OUT/nvidia-smi.txt      nvidia-smi's report (GPU runs)
    OUT/train_metrics.jsonl the train part's metrics.jsonl (train loss, and the validation loss curve)

Installs nothing and reaches no network. The corpus must travel with the tree (the GPU
machine has no SWORD modules): ``--corpus-dir DIR`` names a folder of
``{train,valid,test}.{src,tgt}``; without it, the bible-en-es cache is used if built
(``python -m numformer.data.bible``), and in ``--quick`` mode a small synthetic corpus is
written instead.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from numformer.cli.arguments import OneLineParser  # noqa: E402  (one-line usage errors)
from numformer.cli.front import command_line  # noqa: E402  (a bug says so; see numformer/cli/front.py)

PROG = "bench/gpu_acceptance.py"  # the name its one-line errors start with
FORMAT = "numformer-gpu-acceptance/1"
PARTS = ("env", "gpu_tests", "grad_checks", "torch_parity", "kernels", "train", "train_step", "decode")
PYTEST_COUNTS = re.compile(r"(\d+) (passed|failed|skipped|errors?|deselected|xfailed|xpassed)")


def parse_args(argv=None):
    ap = OneLineParser(prog=PROG, description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="output folder (created; at most 8 files are written there)")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (the dry run)")
    ap.add_argument("--quick", action="store_true", help="tiny shapes and a few steps per part")
    ap.add_argument("--corpus-dir", help="folder with {train,valid,test}.{src,tgt} (default: the bible-en-es cache)")
    ap.add_argument("--work", help="scratch folder for the run folder and vocabulary (default: a temporary one)")
    ap.add_argument("--budget-s", type=float, default=None, help="stop starting parts after this (default 530; quick 300)")
    ap.add_argument("--box-scale", type=float, default=1.0,
                    help="multiply every part's time box (the CPU dry run's test uses 10: a slow machine is no failure)")
    ap.add_argument("--train-minutes", type=float, default=4.0, help="training budget of the train part (default 4)")
    ap.add_argument("--sentences", type=int, default=None, help="test sentences decoded (default 300; quick 8)")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    ap.add_argument("--part", help=argparse.SUPPRESS)  # worker mode: run one in-process part, print JSON
    ap.add_argument("--vocab", help=argparse.SUPPRESS)
    ap.add_argument("--run-dir", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.budget_s = args.budget_s or (300.0 if args.quick else 530.0)
    args.sentences = args.sentences or (8 if args.quick else 300)
    unknown = set(args.parts.split(",")) - set(PARTS)
    if unknown:
        ap.error(f"unknown part(s) {', '.join(sorted(unknown))}: choose from {', '.join(PARTS)}")
    return args


# -- child processes, time-boxed -------------------------------------------------------------
class Runner:
    """Runs commands with a time box each and a global deadline; appends everything to OUT/log.txt."""

    def __init__(self, out: Path, deadline: float, box_scale: float = 1.0):
        self.log = open(out / "log.txt", "a", encoding="utf-8")
        self.deadline = deadline
        self.box_scale = box_scale

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def start(self, name, cmd, env=None):
        self.log.write(f"\n===== {name}: {' '.join(map(str, cmd))}\n")
        self.log.flush()
        full_env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        return subprocess.Popen([str(c) for c in cmd], cwd=ROOT, env=full_env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)

    def wait(self, name, proc, box):
        """-> (returncode or None on timeout, output, seconds)."""
        t0 = time.monotonic()
        timeout = max(min(box * self.box_scale, self.left()), 1.0)
        try:
            output, _ = proc.communicate(timeout=timeout)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the part's whole process group (pytest's children too)
            output, _ = proc.communicate()
            rc = None
        self.log.write(output or "")
        self.log.write(f"===== {name}: {'timed out after %.0f s' % timeout if rc is None else f'exit {rc}'}\n")
        self.log.flush()
        return rc, output or "", round(time.monotonic() - t0, 1)

    def run(self, name, cmd, box, env=None):
        return self.wait(name, self.start(name, cmd, env), box)


def _last_json(output: str):
    for line in reversed(output.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


def _status(rc, ok=True):
    return "timeout" if rc is None else ("ok" if rc == 0 and ok else "failed")


def _tail(output: str, n=5):
    return [ln for ln in output.strip().splitlines()[-n:]]


# -- the parts ----------------------------------------------------------------------------
def part_env(run: Runner, args, out: Path) -> dict:
    info = {}
    smi = shutil.which("nvidia-smi")
    if smi:
        rc, output, _ = run.run("nvidia-smi", [smi], 30)
        (out / "nvidia-smi.txt").write_text(output)
        rc2, q, _ = run.run("nvidia-smi query", [smi, "--query-gpu=name,driver_version,memory.total",
                                                 "--format=csv,noheader"], 30)
        info["nvidia_smi"] = q.strip() if rc2 == 0 else f"failed (exit {rc2})"
    else:
        info["nvidia_smi"] = "absent"
    rc, output, secs = run.run("env", [sys.executable, __file__, args.out, "--part", "env", "--device", args.device], 60)
    info.update(_last_json(output) or {"error": _tail(output)})
    return {"status": _status(rc, "error" not in info), "seconds": secs, **info}


def env_worker(args) -> dict:
    import platform  # noqa: PLC0415

    import numpy as np  # noqa: PLC0415

    info = {"python": platform.python_version(), "numpy": np.__version__, "cpus": os.cpu_count()}
    try:
        import torch  # noqa: PLC0415

        info["torch"] = torch.__version__
        info["torch_cuda"] = torch.version.cuda
        info["torch_sees_gpu"] = torch.cuda.is_available()
    except ImportError:
        info["torch"] = "absent"
    try:
        import cupy  # noqa: PLC0415

        info["cupy"] = cupy.__version__
    except ImportError:
        info["cupy"] = "absent"
    if args.device != "cpu":
        sys.path.insert(0, str(ROOT))
        from numformer.backend import describe, xp_for  # noqa: PLC0415

        xp = xp_for(args.device)
        rt = xp.cuda.runtime
        props = rt.getDeviceProperties(xp.cuda.Device().id)
        name = props["name"]
        info.update(device=name.decode() if isinstance(name, bytes) else name, backend=describe(xp),
                    cuda_runtime=rt.runtimeGetVersion(), cuda_driver=rt.driverGetVersion(),
                    compute_capability=f"{props['major']}.{props['minor']}",
                    memory_gib=round(props["totalGlobalMem"] / 2 ** 30, 1))
    else:
        info["device"] = platform.processor() or platform.machine()
    return info


def _pytest(run, name, targets, box, extra=(), env=None) -> dict:
    # addopts emptied: one pytest process on the device (pyproject.toml's two xdist workers are for 2-core CPUs)
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfEs", "-o", "addopts=", "-p", "no:cacheprovider", *extra, *targets]
    rc, output, secs = run.run(name, cmd, box, env)
    counts = {}
    for line in reversed(output.strip().splitlines()):
        found = PYTEST_COUNTS.findall(line)
        if found and (" in " in line):
            counts = {k.rstrip("s") if k.startswith("error") else k: int(n) for n, k in found}
            break
    if rc is None:
        status = "timeout"
    elif rc == 0 and counts.get("passed", 0) == 0:
        status = "skipped"  # everything skipped: no GPU, or no cupy
    elif rc == 0:
        status = "ok"
    elif rc == 5:
        status = "no tests"
    else:
        status = "failed"
    failed = [ln for ln in output.splitlines() if ln.startswith(("FAILED", "ERROR"))][:20]
    return {"status": status, "seconds": secs, "counts": counts, "command": " ".join(cmd[1:]),
            **({"failures": failed} if failed else {}), **({"tail": _tail(output)} if status != "ok" else {})}


def part_gpu_tests(run, args, out):
    return _pytest(run, "gpu_tests", ["tests/"], 150 if not args.quick else 120,
                   ["-m", "gpu", "--ignore=tests/device/test_gpu_parity.py"])


def part_torch_parity(run, args, out):
    return _pytest(run, "torch_parity", ["tests/device/test_gpu_parity.py"], 90, ["-m", "gpu"])


def part_kernels(run, args, out):
    if not (ROOT / "tests" / "kernels" / "test_kernels.py").exists():
        return {"status": "missing", "seconds": 0.0, "note": "tests/kernels/test_kernels.py does not exist in this tree"}
    # the dry run checks the plumbing: the batch-of-one comparisons and the planted bugs (the main suite runs all)
    extra = ["-k", "batch-of-one or planted"] if args.quick else []
    return _pytest(run, "kernels", ["tests/kernels/test_kernels.py"], 90, extra,
                   env={"NUMFORMER_TEST_DEVICE": args.device})


def part_grad_checks(run, args, out):
    cmd = [sys.executable, "bench/gpu_grad_checks.py", "--device", args.device, "--json"]
    if args.quick:
        cmd += ["--layer", "LayerNorm", "--layer", "MultiHeadAttention", "--layer", "Transformer"]
    rc, output, secs = run.run("grad_checks", cmd, 120)
    res = _last_json(output)
    if res is None:
        return {"status": _status(rc, False), "seconds": secs, "tail": _tail(output)}
    return {"status": "ok" if rc == 0 else "failed", "seconds": secs, **res}


def train_command(args, corpus: Path, run_dir: Path) -> list:
    cmd = [sys.executable, "train.py", "--data", corpus, "--out", run_dir, "--device", args.device, "--no-test",
           "--no-progress", "--eval-sentences", "0"]
    if args.quick:
        return cmd + ["--preset", "tiny", "--max-steps", "6", "--eval-every", "2", "--log-every", "2",
                      "--max-tokens", "400", "--keep-last", "1", "--average-last", "1"]
    return cmd + ["--preset", "base", "--max-minutes", str(args.train_minutes), "--eval-every", "100",
                  "--log-every", "10", "--keep-last", "1", "--average-last", "1"]


def train_result(rc, output, secs, run_dir: Path, out: Path) -> dict:
    metrics = run_dir / "metrics.jsonl"
    records = []
    if metrics.exists():
        shutil.copyfile(metrics, out / "train_metrics.jsonl")
        for line in metrics.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
    curve = [[r["step"], round(r["valid_loss"], 4)] for r in records if "valid_loss" in r]
    train = [r for r in records if "train_loss" in r]
    res = {"status": _status(rc, bool(train)), "seconds": secs}
    plan = [ln for ln in output.splitlines() if ln.startswith(("model:", "data:", "trained", "epoch 0"))]
    res.update(plan=plan, steps=train[-1]["step"] if train else 0,
               first_train_loss=round(train[0]["train_loss"], 4) if train else None,
               last_train_loss=round(train[-1]["train_loss"], 4) if train else None,
               tokens_per_s=round(train[-1].get("tokens_per_s", 0.0), 1) if train else None,
               valid_loss_curve=curve,
               learned=bool(len(curve) >= 2 and curve[-1][1] < curve[0][1]))
    if res["status"] != "ok":
        res["tail"] = _tail(output)
    return res


def part_train_step(run, args, out):
    cmd = [sys.executable, "bench/gpu_train_step.py", "--device", args.device, "--json"]
    cmd += ["--quick", "--steps", "1", "--warmup", "1"] if args.quick else ["--timeout", "75"]
    rc, output, secs = run.run("train_step", cmd, 100 if args.quick else 330)
    res = _last_json(output)
    if res is None:
        return {"status": _status(rc, False), "seconds": secs, "tail": _tail(output)}
    ok = all(r["numformer"].get("status") in ("ok", "not on cpu") for r in res["rows"])
    return {"status": "ok" if rc == 0 and ok else "failed", "seconds": secs, **res}


def part_decode(run, args, out, vocab: Path, run_dir: Path, corpus: Path):
    cmd = [sys.executable, __file__, args.out, "--part", "decode", "--device", args.device, "--vocab", vocab,
           "--run-dir", run_dir, "--corpus-dir", corpus, "--sentences", str(args.sentences)]
    rc, output, secs = run.run("decode", cmd, 60 if args.quick else 150)
    res = _last_json(output)
    if res is None:
        return {"status": _status(rc, False), "seconds": secs, "tail": _tail(output)}
    return {"status": "ok" if rc == 0 else "failed", "seconds": secs, **res}


def decode_worker(args) -> dict:
    sys.path.insert(0, str(ROOT))
    from numformer.backend import xp_for  # noqa: PLC0415
    from numformer.run_file_names import run_checkpoints  # noqa: PLC0415
    from numformer.checkpoint.trained_model import load_model  # noqa: PLC0415
    from numformer.data import SubwordVocab, load_parallel_dir  # noqa: PLC0415
    from numformer.model import Transformer  # noqa: PLC0415
    from numformer.presets import get_preset  # noqa: PLC0415
    from numformer.decoding.translation import DecodeOptions, score_translations, translate_lines  # noqa: PLC0415

    xp = xp_for(args.device)
    vocab = SubwordVocab.load(args.vocab)
    src, ref = load_parallel_dir(args.corpus_dir)["test"]
    src, ref = src[: args.sentences], ref[: args.sentences]
    models = [("small (fresh)", Transformer(get_preset("tiny" if args.quick else "small", vocab_size=vocab.size,
                                                          pad_id=vocab.pad_id), seed=1).to(xp).eval())]
    run_dir = Path(args.run_dir)
    if run_checkpoints(run_dir):
        model, _, path = load_model(run_dir, args.vocab, args.device)
        models.append((f"trained ({path.name})", model))
    else:
        models.append(("base (fresh; the train part left no checkpoint)",
                       Transformer(get_preset("tiny" if args.quick else "base", vocab_size=vocab.size,
                                              pad_id=vocab.pad_id), seed=1).to(xp).eval()))
    # the quick run caps outputs (a fresh model writes to the length limit); the real run uses the paper's + 50
    extra = 8 if args.quick else 50
    translate_lines(models[0][1], vocab, src[:2], DecodeOptions(beam=1, max_len_b=extra))  # warm-up
    rows = []
    for name, model in models:
        for beam in (4, 1):
            t0 = time.perf_counter()
            hyps = translate_lines(model, vocab, src, DecodeOptions(beam=beam, max_len_b=extra))  # host strings: synced
            secs = time.perf_counter() - t0
            row = {"model": name, "search": f"beam {beam}" if beam > 1 else "greedy", "sentences": len(src),
                   "seconds": round(secs, 2), "sentences_per_s": round(len(src) / secs, 2)}
            if name.startswith("trained"):
                row["bleu"] = round(score_translations(hyps, ref)["bleu"], 2)
            rows.append(row)
    return {"rows": rows, "torch": {"status": "not implemented",
                                    "note": "no PyTorch beam search over tests/reference/torch_reference.py's model yet"}}


# -- orchestration -----------------------------------------------------------------------------
def find_corpus(args, work: Path) -> tuple[Path | None, str]:
    if args.corpus_dir:
        return Path(args.corpus_dir).resolve(), "given"
    if args.quick:
        sys.path.insert(0, str(ROOT))
        from numformer.data import make_synthetic, write_parallel_dir  # noqa: PLC0415

        return write_parallel_dir(work / "corpus", make_synthetic("reverse", 600, 40, 40, seed=0)), "synthetic reverse task"
    sys.path.insert(0, str(ROOT))
    from numformer.data.bible import default_cache_dir  # noqa: PLC0415

    cache = default_cache_dir()
    if (cache / "meta.json").exists():
        return cache, "bible-en-es cache"
    return None, f"none: pass --corpus-dir (no bible-en-es cache at {cache})"


@command_line(PROG)
def main(argv=None) -> int:
    args = parse_args(argv)
    if args.part == "env":
        print(json.dumps(env_worker(args)))
        return 0
    if args.part == "decode":
        print(json.dumps(decode_worker(args)))
        return 0
    t_start = time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="numformer-acceptance-"))
    work.mkdir(parents=True, exist_ok=True)
    run = Runner(out, t_start + args.budget_s, args.box_scale)
    wanted = args.parts.split(",")
    summary = {"format": FORMAT, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "device": args.device,
               "quick": args.quick, "budget_s": args.budget_s, "commit": _commit(), "parts": {}}
    parts = summary["parts"]

    def save():
        summary["wall_s"] = round(time.monotonic() - t_start, 1)
        done = [p for p in parts.values() if isinstance(p, dict)]
        summary["ok"] = bool(done) and all(p["status"] in ("ok", "skipped", "missing", "not wanted") for p in done)
        (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")

    corpus, how = find_corpus(args, work)
    summary["corpus"] = {"path": str(corpus) if corpus else None, "source": how}
    run_dir = work / "run"
    vocab = run_dir / "spm.model"
    train_proc = None
    if corpus is not None and ({"train", "decode"} & set(wanted)):
        run_dir.mkdir(parents=True, exist_ok=True)
        rc, output, secs = run.run("vocabulary", [sys.executable, "-c",
                                                  "import sys; from numformer.data.prepared_dataset import prepare; "
                                                  "d = prepare(sys.argv[1], data_dir=sys.argv[2]); "
                                                  "print('vocabulary', d.vocab.size)", run_dir, corpus], 120)
        summary["corpus"].update(vocabulary=_tail(output, 1), vocabulary_seconds=secs)
    if "train" in wanted:
        if corpus is None or not vocab.exists():
            parts["train"] = {"status": "failed", "seconds": 0.0, "error": f"no corpus or vocabulary ({how})"}
        else:  # in the background, while the correctness parts run
            train_t0 = time.monotonic()
            train_proc = run.start("train", train_command(args, corpus, run_dir))
    for name, fn in (("env", part_env), ("gpu_tests", part_gpu_tests), ("grad_checks", part_grad_checks),
                     ("torch_parity", part_torch_parity), ("kernels", part_kernels)):
        if name not in wanted:
            continue
        if run.left() < 5:
            parts[name] = {"status": "out of time", "seconds": 0.0}
            continue
        try:
            parts[name] = fn(run, args, out)
        except Exception as exc:  # noqa: BLE001  (a broken part must not lose the others)
            parts[name] = {"status": "failed", "seconds": 0.0, "error": f"{type(exc).__name__}: {exc}"}
        save()
    if train_proc is not None:
        box = 60 + 60 * args.train_minutes * 1.35 if not args.quick else 120
        rc, output, _ = run.wait("train", train_proc, box - (time.monotonic() - train_t0))
        parts["train"] = train_result(rc, output, round(time.monotonic() - train_t0, 1), run_dir, out)
        save()
    if "train_step" in wanted:
        parts["train_step"] = part_train_step(run, args, out) if run.left() >= 5 else {"status": "out of time",
                                                                                         "seconds": 0.0}
        save()
    if "decode" in wanted:
        if corpus is None or not vocab.exists():
            parts["decode"] = {"status": "failed", "seconds": 0.0, "error": f"no corpus or vocabulary ({how})"}
        elif run.left() < 5:
            parts["decode"] = {"status": "out of time", "seconds": 0.0}
        else:
            parts["decode"] = part_decode(run, args, out, vocab, run_dir, corpus)
    save()
    print(report(summary))
    return 0 if summary["ok"] else 1


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def report(summary) -> str:
    lines = [f"acceptance on {summary['device']}{' (quick)' if summary['quick'] else ''}: "
             f"{'OK' if summary['ok'] else 'NOT OK'} in {summary['wall_s']} s"]
    for name, p in summary["parts"].items():
        extra = ""
        if "counts" in p:
            extra = ", ".join(f"{v} {k}" for k, v in p["counts"].items())
        elif name == "grad_checks" and "checks" in p:
            extra = f"{p['checks']} tensors, {p['failed']} failed, worst {p['max_rel_error']:.1e}"
        elif name == "train" and "steps" in p:
            extra = f"{p['steps']} steps, valid loss {p['valid_loss_curve'][:1]} -> {p['valid_loss_curve'][-1:]}"
        elif name == "train_step" and "rows" in p:
            extra = "; ".join(f"{r['precision']} {r['numformer'].get('median_step_ms', r['numformer'].get('status'))} ms"
                              f" vs {r['torch'].get('median_step_ms', r['torch'].get('status'))} ms" for r in p["rows"])
        elif name == "decode" and "rows" in p:
            extra = "; ".join(f"{r['model'].split()[0]} {r['search']} {r['sentences_per_s']}/s" for r in p["rows"])
        lines.append(f"  {name:12s} {p['status']:11s} {p.get('seconds', 0):7.1f} s  {extra}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
