#!/usr/bin/env python3
"""The GPU acceptance run: one command that proves the CuPy path and measures it.

    bash bench/gpu_run.sh OUT                                                 # on the GPU machine: the one command
    python3 bench/gpu_acceptance.py OUT --corpus-dir .gpu_carry/bible-en-es   # what it runs: one GPU, 500 s
    python3 bench/gpu_acceptance.py OUT --parts proofs,train_step ...         # a rerun of the named parts only
    python3 bench/gpu_acceptance.py OUT --device cpu --quick                  # the dry run (seconds a part; CI)

Parts, each in its own child process with its own time box (a part that fails or runs
out of time is recorded as such and the others still run), in the order that matters:

    env           nvidia-smi, driver/CUDA/cupy/torch versions, the device's name
    proofs        each fused kernel's GPU tests alone, one child each (tests/device/test_cuda_*.py), then
                  numformer's cuBLAS handle and the captured step; each recorded as it ends with its source's
                  hash and verdict (summary.json's cuda_proofs: the entries numformer/kernels/cuda_proofs.json takes)
    train_step    bench/gpu_train_step.py: base, 25,000 target tokens, fp32/tf32/fp16, numformer eager, numformer
                  as CUDA graphs and PyTorch eager, each a child printing as it ends
    breakdown     bench/step_breakdown.py: where base's fp32 step goes, layer by layer, Adam and the norm included
    launches      bench/gpu_launches.py: base's kernel launches by kernel, counted on the CuPy stand-in
    gpu_tests     python -m pytest -m gpu tests/ (the proofs' files and tests/device/test_gpu_parity.py apart)
    grad_checks   every grad_checks case on the device in float64 (bench/gpu_grad_checks.py)
    torch_parity  python -m pytest -m gpu tests/device/test_gpu_parity.py (whole model on cupy vs the torch mirror)
    kernels       NUMFORMER_TEST_DEVICE=<device> python -m pytest tests/kernels/test_kernels.py ('missing' if absent)
    train         train.py --preset base --device cuda --max-minutes 1.25 on the corpus: validation loss curve
    decode        greedy and beam 4 on 100 test sentences: a fresh small model and the base model of the train part

One device call is 10 minutes, so the whole run is cut to fit 500 s (``--budget-s``: no part starts after it, a
running part's box is cut to it), most important first: the proofs alone, then the step's figures alone on the
device (clean timings), then the rest as time allows (the other correctness parts side by side with the short
base run, then decode). summary.json is rewritten after every part (and after every proof), so a run cut short
still says what passed. ``--parts`` reruns only the named parts (decode without train reads no trained model: it
decodes a fresh base one).

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
from numformer.cli.arguments import OneLineParser, positive_float, positive_int  # noqa: E402  (one-line usage errors)
from numformer.cli.front import command_line  # noqa: E402  (a bug says so; see numformer/cli/front.py)

PROG = "bench/gpu_acceptance.py"  # the name its one-line errors start with
FORMAT = "numformer-gpu-acceptance/1"
PARTS = ("env", "proofs", "train_step", "breakdown", "launches", "gpu_tests", "grad_checks", "torch_parity", "kernels",
         "train", "decode")
# Each fused kernel's proof (numformer/kernels/cuda_sources.py: the source whose SHA-256 cuda_proofs.json records)
# and the capture route's: (name, pytest targets and selection). Run first, one child each, each recorded as it ends.
PROOFS = (
    ("adam", ["tests/device/test_cuda_kernels.py"]),
    ("layernorm", ["tests/device/test_cuda_layers.py", "-k", "layernorm or switch"]),
    ("linear", ["tests/device/test_cuda_layers.py", "-k", "bias_gradient or linear"]),
    ("loss", ["tests/device/test_cuda_layers.py", "-k", "loss"]),
    ("dropout", ["tests/device/test_cuda_dropout_attention.py", "-k", "cuda_words or dropout and not attention"]),
    ("attention", ["tests/device/test_cuda_dropout_attention.py", "-k", "attention"]),
    ("gemm handle", ["tests/device/test_gemm_on_gpu.py"]),          # the capture route: no CUDA source of its own
    ("step graphs", ["tests/device/test_step_graphs_on_gpu.py"]),
)
PROOF_FILES = sorted({targets[0] for _, targets in PROOFS})
OUT_OF_TIME = {"status": "out of time", "seconds": 0.0}  # a part the budget left no time to start
PYTEST_COUNTS = re.compile(r"(\d+) (passed|failed|skipped|errors?|deselected|xfailed|xpassed)")


def parse_args(argv=None):
    ap = OneLineParser(prog=PROG, description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="output folder (created; at most 8 files are written there)")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (the dry run)")
    ap.add_argument("--quick", action="store_true", help="tiny shapes and a few steps per part")
    ap.add_argument("--corpus-dir", help="folder with {train,valid,test}.{src,tgt} (default: the bible-en-es cache)")
    ap.add_argument("--work", help="scratch folder for the run folder and vocabulary (default: a temporary one)")
    ap.add_argument("--budget-s", type=positive_float, default=None,
                    help="stop starting parts after this, and cut a running part's box to it (default 500: the device "
                         "call's 10 minutes with a minute to spare)")
    ap.add_argument("--box-scale", type=positive_float, default=1.0,
                    help="multiply every part's time box (the CPU dry run's test uses 10: a slow machine is no failure)")
    ap.add_argument("--train-minutes", type=positive_float, default=1.25, help="training budget of the train part (default 1.25)")
    ap.add_argument("--sentences", type=positive_int, default=None, help="test sentences decoded (default 100; quick 8)")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    ap.add_argument("--part", help=argparse.SUPPRESS)  # worker mode: run one in-process part, print JSON
    ap.add_argument("--vocab", help=argparse.SUPPRESS)
    ap.add_argument("--run-dir", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.budget_s = args.budget_s or 500.0
    args.sentences = args.sentences or (8 if args.quick else 100)
    unknown = set(args.parts.split(",")) - set(PARTS)
    if unknown:
        ap.error(f"unknown part(s) {', '.join(sorted(unknown))}: choose from {', '.join(PARTS)}")
    return args


# -- child processes, time-boxed -------------------------------------------------------------
class Runner:
    """Runs commands with a time box each and a global deadline; appends everything to OUT/log.txt.

    Each child writes to its own file in the scratch folder (not a pipe), so that several can run at
    once without one blocking on a full pipe while another is waited for."""

    def __init__(self, out: Path, work: Path, deadline: float, box_scale: float = 1.0):
        self.log = open(out / "log.txt", "a", encoding="utf-8")
        self.work = work
        self.deadline = deadline
        self.box_scale = box_scale

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def start(self, name, cmd, box, env=None):
        """-> a running child: its process, output file, start time and the moment its box ends."""
        full_env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        path = self.work / f"{name}.out"
        sink = open(path, "w", encoding="utf-8")
        proc = subprocess.Popen([str(c) for c in cmd], cwd=ROOT, env=full_env, stdout=sink,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        sink.close()
        t0 = time.monotonic()
        box = max(min(box * self.box_scale, self.left()), 1.0)
        return {"name": name, "cmd": cmd, "proc": proc, "path": path, "t0": t0, "box": box, "ends": t0 + box}

    def finish(self, child, timed_out=False):
        """Kill a child out of time (with its whole process group: pytest's children too), log its output.
        -> (returncode or None on timeout, output, seconds)."""
        proc = child["proc"]
        if timed_out:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        output = child["path"].read_text(encoding="utf-8", errors="replace")
        self.log.write(f"\n===== {child['name']}: {' '.join(map(str, child['cmd']))}\n{output}")
        self.log.write(f"===== {child['name']}: "
                       f"{'timed out after %.0f s' % child['box'] if timed_out else f'exit {proc.returncode}'}\n")
        self.log.flush()
        return (None if timed_out else proc.returncode), output, round(time.monotonic() - child["t0"], 1)

    def wait(self, child):
        try:
            child["proc"].wait(timeout=max(child["ends"] - time.monotonic(), 0.1))
            return self.finish(child)
        except subprocess.TimeoutExpired:
            return self.finish(child, timed_out=True)

    def wait_each(self, children):
        """Yield (child, result) for each child as it ends (or runs out of its box), in the order they end."""
        running = list(children)
        while running:
            for child in list(running):
                over = time.monotonic() >= child["ends"]
                if child["proc"].poll() is not None or over:
                    running.remove(child)
                    yield child, self.finish(child, timed_out=child["proc"].poll() is None and over)
            if running:
                time.sleep(0.2)

    def run(self, name, cmd, box, env=None):
        return self.wait(self.start(name, cmd, box, env))


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


class Part:
    """One part's child process: its command, time box and environment, and how its output becomes a result."""

    def __init__(self, name, cmd, box, parse, env=None):
        self.name, self.cmd, self.box, self.parse, self.env = name, cmd, box, parse, env


def _pytest_part(name, targets, box, extra=(), env=None) -> Part:
    # addopts emptied: one pytest process on the device (pyproject.toml's two xdist workers are for 2-core CPUs)
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfEs", "-o", "addopts=", "-p", "no:cacheprovider", *extra, *targets]
    env = {"NUMFORMER_DEBUG": "", **(env or {})}  # the tests check one-line errors; bench/gpu_run.sh sets it for the rest

    def parse(rc, output, secs):
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
        return {"status": status, "seconds": secs, "counts": counts, "command": " ".join(map(str, cmd[1:])),
                **({"failures": failed} if failed else {}), **({"tail": _tail(output)} if status != "ok" else {})}

    return Part(name, cmd, box, parse, env)


def _json_part(name, cmd, box, ok=lambda res: True, env=None) -> Part:
    """A part whose child prints one JSON line last: the result, ok when the child exits 0 and ``ok(result)``."""
    def parse(rc, output, secs):
        res = _last_json(output)
        if res is None:
            return {"status": _status(rc, False), "seconds": secs, "tail": _tail(output)}
        return {"status": _status(rc, ok(res)), "seconds": secs, **res}

    return Part(name, cmd, box, parse, env)


def gpu_tests_part(args):
    # the layer, model, decoding and precision tests on the device; the proofs ran first (the proofs part)
    ignored = [f"--ignore={path}" for path in ["tests/device/test_gpu_parity.py", *PROOF_FILES]]
    return _pytest_part("gpu_tests", ["tests/"], 150, ["-m", "gpu", *ignored])


def proof_part(args, name, targets):
    """One kernel's proof (or the capture route's): its GPU tests, named as they pass (-v)."""
    return _pytest_part(f"proof {name}", targets, 40 if name != "step graphs" else 60, ["-m", "gpu", "-v"],
                        env=KERNELS_ON)


# The timing parts run the fused CUDA kernels whether or not cuda_proofs.json proves them yet: this same run's
# gpu_tests part is their proof (summary.json says whether it passed), and the goals are about the step with them
KERNELS_ON = {"NUMFORMER_CUDA_UNPROVEN": "1"}


def torch_parity_part(args):
    return _pytest_part("torch_parity", ["tests/device/test_gpu_parity.py"], 90, ["-m", "gpu"])


def kernels_part(args):
    if not (ROOT / "tests" / "kernels" / "test_kernels.py").exists():
        return None  # recorded as 'missing' (a tree without the kernels' tests)
    # the dry run checks the plumbing: the batch-of-one comparisons and the planted bugs (the main suite runs all).
    # On a GPU the planted bugs are left out: they are planted in the host kernels' threading, which cupy arrays
    # never reach (the kernels hand them to the plain math), so there they could not fail (the first GPU run)
    extra = ["-k", "batch-of-one or planted"] if args.quick else (["-k", "not planted"] if args.device != "cpu" else [])
    return _pytest_part("kernels", ["tests/kernels/test_kernels.py"], 90, extra,
                        env={"NUMFORMER_TEST_DEVICE": args.device})


def grad_checks_part(args):
    cmd = [sys.executable, "bench/gpu_grad_checks.py", "--device", args.device, "--json"]
    if args.quick:
        cmd += ["--layer", "LayerNorm", "--layer", "MultiHeadAttention", "--layer", "Transformer"]
    return _json_part("grad_checks", cmd, 120, ok=lambda res: res.get("failed") == 0)


def train_step_part(args):
    cmd = [sys.executable, "bench/gpu_train_step.py", "--device", args.device, "--json", "--graphs"]
    # 2 warm-up and 5 counted steps a side: the medians of base steps of a few hundred ms settle after the first
    # two (cupy compiles its kernels and the pools fill); six child processes of about 15 s each, numformer's
    # then also the step as CUDA graphs (a capture and 5 replays: about 5 s more)
    cmd += ["--quick", "--steps", "1", "--warmup", "1"] if args.quick else ["--steps", "5", "--warmup", "2",
                                                                             "--timeout", "60"]
    # each of the nine children prints as it ends: a box that ends (or a child that crashes) keeps every figure before
    return _json_part("train_step", cmd, 100 if args.quick else 200, ok=lambda res: all(
        r["numformer"].get("status") in ("ok", "not on cpu") for r in res["rows"]), env=KERNELS_ON)


def breakdown_part(args):
    """Where the fp32 base step's time goes, layer by layer (the Adam and gradient-norm rows are what the one
    parameter buffer, issue 58, was for; docs/gpu.md holds the first run's table to compare with)."""
    cmd = [sys.executable, "bench/step_breakdown.py", "--device", args.device, "--json"]
    cmd += ["--quick", "--steps", "1", "--warmup", "1"] if args.quick else ["--steps", "3", "--warmup", "2"]
    return _json_part("breakdown", cmd, 40 if args.quick else 60, ok=lambda res: bool(res.get("rows")), env=KERNELS_ON)


def launches_part(args):
    """Kernel launches of one base step by kernel, counted on the CuPy stand-in (bench/gpu_launches.py: CPU work,
    needs g++ for the host emulator): the host's share of the step, launch by launch."""
    cmd = [sys.executable, "bench/gpu_launches.py", "--json", "--top", "60"] + (["--shape", "quick"] if args.quick
                                                                               else [])
    return _json_part("launches", cmd, 60 if args.quick else 90,
                      ok=lambda res: "eager" in res or res.get("status") == "skipped")  # skipped: no cupy


def decode_part(args, vocab: Path, run_dir: Path, corpus: Path):
    cmd = [sys.executable, __file__, args.out, "--part", "decode", "--device", args.device, "--vocab", vocab,
           "--run-dir", run_dir, "--corpus-dir", corpus, "--sentences", str(args.sentences)]
    return _json_part("decode", cmd, 60)


def train_part(args, corpus: Path, run_dir: Path, out: Path):
    cmd = [sys.executable, "train.py", "--data", corpus, "--out", run_dir, "--device", args.device, "--no-test",
           "--no-progress", "--eval-sentences", "0", "--tune-seconds", "0", "--keep-last", "1", "--average-last", "1"]
    if args.quick:
        cmd += ["--preset", "tiny", "--max-steps", "6", "--eval-every", "2", "--log-every", "2", "--max-tokens", "400"]
    else:
        cmd += ["--preset", "base", "--max-minutes", str(args.train_minutes), "--eval-every", "50", "--log-every", "10"]
    # start-up (cupy's first kernels), the last validation and the checkpoint of a 65M-parameter model
    box = 120 if args.quick else 45 + 60 * args.train_minutes * 1.3
    return Part("train", cmd, box, lambda rc, output, secs: train_result(rc, output, secs, run_dir, out))


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
    run = Runner(out, work, t_start + args.budget_s, args.box_scale)
    wanted = args.parts.split(",")
    summary = {"format": FORMAT, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "device": args.device,
               "quick": args.quick, "budget_s": args.budget_s, "commit": _commit(),
               "cuda_sources": cuda_source_hashes(), "parts": {}}
    parts = {}  # as they end; summary.json lists them in the documented order (PARTS)

    def save():
        """Written after every part, so that a run cut short (the device call's own limit) still says what passed."""
        summary["parts"] = {name: parts[name] for name in PARTS if name in parts}
        summary["wall_s"] = round(time.monotonic() - t_start, 1)
        done = list(parts.values())
        summary["ok"] = bool(done) and all(p["status"] in ("ok", "skipped", "missing") for p in done)
        (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")

    def record(name, result):
        parts[name] = result
        save()

    def record_from(name, result, seconds=0.0):
        """``result()`` recorded as part ``name``; one that breaks is recorded as failed, and loses no other part."""
        try:
            record(name, result())
        except Exception as exc:  # noqa: BLE001
            record(name, {"status": "failed", "seconds": seconds, "error": f"{type(exc).__name__}: {exc}"})

    def record_parsed(part, ended):
        """A part's result from its child's (returncode, output, seconds)."""
        record_from(part.name, lambda: part.parse(*ended), ended[2])

    def alone(part):
        """One part with the device to itself (timings), if the budget still allows one."""
        if run.left() < 5:
            return record(part.name, dict(OUT_OF_TIME))
        record_parsed(part, run.wait(run.start(part.name, part.cmd, part.box, part.env)))

    corpus, how = find_corpus(args, work)
    summary["corpus"] = {"path": str(corpus) if corpus else None, "source": how}
    run_dir = work / "run"
    vocab = run_dir / "spm.model"
    if corpus is not None and ({"train", "decode"} & set(wanted)):
        run_dir.mkdir(parents=True, exist_ok=True)
        rc, output, secs = run.run("vocabulary", [sys.executable, "-c",
                                                  "import sys; from numformer.data.prepared_dataset import prepare; "
                                                  "d = prepare(sys.argv[1], data_dir=sys.argv[2]); "
                                                  "print('vocabulary', d.vocab.size)", run_dir, corpus], 120)
        summary["corpus"].update(vocabulary=_tail(output, 1), vocabulary_seconds=secs)
    no_corpus = {"status": "failed", "seconds": 0.0, "error": f"no corpus or vocabulary ({how})"}
    # 1. what the machine is
    if "env" in wanted:
        record_from("env", lambda: part_env(run, args, out) if run.left() >= 5 else dict(OUT_OF_TIME))
    # 2. the proofs first and alone: each kernel's tests, its source's hash and verdict recorded as it ends (the
    #    entries numformer/kernels/cuda_proofs.json takes, in summary["cuda_proofs"])
    if "proofs" in wanted:
        run_proofs(args, run, summary, record)
    # 3. one training step against PyTorch's, alone on the device (clean timings): eager, captured, PyTorch, each
    #    its own child printing as it ends; then where the step goes, and its launches by kernel
    if "train_step" in wanted:
        alone(train_step_part(args))
    if "breakdown" in wanted:
        alone(breakdown_part(args))
    if "launches" in wanted:
        alone(launches_part(args))
    # 4. the rest as time allows: the other correctness parts side by side, with the short base run in the
    #    background (the device's memory holds them all; their timings are not figures)
    side_by_side = [make(args) for name, make in (("gpu_tests", gpu_tests_part), ("torch_parity", torch_parity_part),
                                                   ("grad_checks", grad_checks_part), ("kernels", kernels_part))
                    if name in wanted]
    if "kernels" in wanted and None in side_by_side:
        side_by_side.remove(None)
        record("kernels", {"status": "missing", "seconds": 0.0,
                           "note": "tests/kernels/test_kernels.py does not exist in this tree"})
    if "train" in wanted:
        if corpus is None or not vocab.exists():
            record("train", dict(no_corpus))
        else:
            side_by_side.insert(0, train_part(args, corpus, run_dir, out))
    children, by_name = [], {part.name: part for part in side_by_side}
    for part in side_by_side:
        if run.left() < 5:
            record(part.name, dict(OUT_OF_TIME))
        else:
            children.append(run.start(part.name, part.cmd, part.box, part.env))
    for child, ended in run.wait_each(children):
        record_parsed(by_name[child["name"]], ended)
    # 5. decoding, alone again: a fresh small model and the base model the train part left
    if "decode" in wanted:
        if corpus is None or not vocab.exists():
            record("decode", dict(no_corpus))
        else:
            alone(decode_part(args, vocab, run_dir, corpus))
    save()
    print(report(summary))
    return 0 if summary["ok"] else 1


def run_proofs(args, run: Runner, summary: dict, record) -> None:
    """Each proof in its own child, one after another, alone on the device; after each, summary.json says its
    verdict (the tests passed, by name) and, for a kernel that passed, the entry cuda_proofs.json records."""
    verdicts, summary["cuda_proofs"] = {}, {}
    hashes, started = summary["cuda_sources"], time.monotonic()
    gpu = None
    for name, targets in PROOFS:
        if run.left() < 5:
            verdicts[name] = dict(OUT_OF_TIME)
            continue
        part = proof_part(args, name, targets)
        rc, output, secs = run.wait(run.start(part.name, part.cmd, part.box, part.env))
        result = part.parse(rc, output, secs)
        result["passed_tests"] = [ln.split(" PASSED")[0].split("::", 1)[-1] for ln in output.splitlines()
                                  if " PASSED" in ln][:80]
        if name in hashes:
            result["sha256"] = hashes[name]
            if result["status"] == "ok":
                gpu = gpu or (summary["parts"].get("env") or {}).get("device")
                summary["cuda_proofs"][name] = {"sha256": hashes[name], "date": time.strftime("%Y-%m-%d"),
                                                "gpu": gpu, "commit": summary["commit"]}
        verdicts[name] = result
        record("proofs", {"status": _proofs_status(verdicts), "seconds": round(time.monotonic() - started, 1),
                          "kernels": dict(verdicts)})
    record("proofs", {"status": _proofs_status(verdicts), "seconds": round(time.monotonic() - started, 1),
                      "kernels": dict(verdicts)})


def _proofs_status(verdicts: dict) -> str:
    statuses = {v["status"] for v in verdicts.values()}
    if statuses <= {"ok"}:
        return "ok"
    if statuses <= {"skipped"}:
        return "skipped"
    return "failed" if statuses & {"failed", "timeout", "no tests"} else "out of time"


def cuda_source_hashes() -> dict:
    """{kernel: SHA-256 of its CUDA C} (numformer/kernels/cuda_sources.py): when gpu_tests passes (it runs
    tests/device/test_cuda_*.py), these are the hashes numformer/kernels/cuda_proofs.json may record as
    proven, with the date, the GPU (the env part) and the commit."""
    from numformer.kernels import registered  # noqa: PLC0415
    from numformer.kernels.cuda_sources import SOURCES, source_hash  # noqa: PLC0415

    registered()  # every kernel file imported: each registers its CUDA C

    return {name: source_hash(name) for name in sorted(SOURCES)}


def _commit() -> str | None:
    """The commit the run is of: bench/gpu_prepare.sh's (the GPU machine's copy of the tree has no git history)."""
    if os.environ.get("NUMFORMER_COMMIT"):
        return os.environ["NUMFORMER_COMMIT"]
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
        if name == "proofs" and "kernels" in p:
            extra = ", ".join(f"{k} {v['status']}" for k, v in p["kernels"].items())
        elif name == "launches" and "eager" in p:
            extra = (f"eager {p['eager']['total']} a step" +
                     (f", graph body {p['graph body']['total']}" if "graph body" in p else ""))
        elif "counts" in p:
            extra = ", ".join(f"{v} {k}" for k, v in p["counts"].items())
        elif name == "grad_checks" and "checks" in p:
            extra = f"{p['checks']} tensors, {p['failed']} failed, worst {p['max_rel_error']:.1e}"
        elif name == "train" and "steps" in p:
            extra = f"{p['steps']} steps, valid loss {p['valid_loss_curve'][:1]} -> {p['valid_loss_curve'][-1:]}"
        elif name == "train_step" and "rows" in p:
            extra = "; ".join(f"{r['precision']} {r['numformer'].get('median_step_ms', r['numformer'].get('status'))} ms"
                              f" vs {r['torch'].get('median_step_ms', r['torch'].get('status'))} ms" for r in p["rows"])
        elif name == "breakdown" and "rows" in p:
            ms = {r["layer"]: r["ms_per_step"] for r in p["rows"] if r["pass"] == "step"}
            extra = (f"step {p['plain_step_ms']} ms; Adam {ms.get('Adam')} ms, "
                     f"norm {ms.get('gradient norm and read-back')} ms")
        elif name == "decode" and "rows" in p:
            extra = "; ".join(f"{r['model'].split()[0]} {r['search']} {r['sentences_per_s']}/s" for r in p["rows"])
        lines.append(f"  {name:12s} {p['status']:11s} {p.get('seconds', 0):7.1f} s  {extra}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
