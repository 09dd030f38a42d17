"""Every test whose outcome depends on float32 or int8 arithmetic, under several CPU configurations of one
machine, as one table.

    python3 tests/cpu_matrix.py                        # every configuration, the suites it can change (hours)
    python3 tests/cpu_matrix.py --configs native,avx2-only --suites parity,interop
    python3 tests/cpu_matrix.py --ci                   # what CI runs: the 'oldest' configuration, float32 parity
    eval "$(python3 tests/cpu_matrix.py --export avx2-only)"   # a shell set to one row (CI's test command runs so)

A result of numformer's must not depend on which x86 kernels compute it. Every library the tests meet picks
its kernels by the CPU's instruction set at run time, and each can be told to pick another, so one machine
can play the others:

* OpenBLAS (numpy's GEMMs): ``OPENBLAS_CORETYPE`` SkylakeX (AVX-512, where the CPU has it), Haswell and Zen
  (AVX2 + FMA), Sandybridge (AVX without FMA: every product rounded before it is added);
* numpy's own loops (sums, exp, the elementwise kernels): ``NPY_DISABLE_CPU_FEATURES``, its AVX-512 targets
  off (``numpy-no-avx512``) or every dispatch target off (``numpy-baseline``);
* PyTorch (the reference): ``ATEN_CPU_CAPABILITY`` avx2 or default (no vector kernels);
* CTranslate2: ``CT2_FORCE_CPU_ISA`` GENERIC, AVX, AVX2, AVX512 (its own kernels), its int8 and float32 GEMMs
  from MKL (``CT2_USE_MKL=1``, Intel's default) or oneDNN (``CT2_USE_MKL=0``, AMD's default) capped by
  ``ONEDNN_MAX_CPU_ISA`` and ``MKL_ENABLE_INSTRUCTIONS``;
* the thread count of numformer's host threads and of OpenBLAS (``NUMFORMER_NUM_THREADS``,
  ``OPENBLAS_NUM_THREADS``): another split of every threaded sum and GEMM.

``avx2-only`` sets all of them to what a CPU without AVX-512 runs (OpenBLAS Haswell, numpy without its
AVX-512 targets, PyTorch avx2, CTranslate2 AVX2 on oneDNN capped at AVX2): CI runs the README's test command
under it. ``oldest`` sets them to the oldest each can run. Kernels the CPU cannot run are left out.

Suites (each a fresh process per configuration):

* ``parity``: tests/checks/test_torch_parity.py (numformer against the PyTorch mirror, float64 and float32);
* ``kernels``: tests/kernels/test_kernels.py (every fast kernel against the plain math);
* ``decoding``: tests/decoding/test_decode_vs_torch.py (the searches against a PyTorch decoder);
* ``numerics``: the other tests with floating-point bounds (precision modes, gradient statistics,
  the checker's own tests, cached decoding, checkpoint averaging);
* ``interop``: tests/interop (CTranslate2 float32 and int8 against numformer, transformers' Marian against
  numformer's import and export, generate against numformer's greedy);
* ``studies``: tests/studies (each study's small run and its planted changes);
* ``grad_checks``: ``python -m grad_checks --json`` (float64 finite differences, fast kernels);
* ``outcomes``: tests/training/test_train_e2e.py's training outcomes (the reverse task's exact match and loss
  ratio, the bible slice's loss drop and hypotheses), each with its margin to its bound.

A row runs the suites its variables can change (``SUITES_OF_PREFIX``: a CTranslate2 row the interop suite,
a PyTorch row the suites computing with PyTorch; numpy, OpenBLAS and thread rows every suite);
``--every-suite`` runs all of them under every row.

The table has one row per configuration: the OpenBLAS kernel the process really loaded, numpy's
dispatch targets, the threads, passed and failed tests per suite, and the worst error each suite
measured (tests/worst_error.py). The exit status is 1 when any test failed. docs/guarantees.md holds the
last full run.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTEST_SUITES = {
    "parity": ["tests/checks/test_torch_parity.py"],
    "kernels": ["tests/kernels/test_kernels.py"],
    "decoding": ["tests/decoding/test_decode_vs_torch.py"],
    "numerics": ["tests/device/test_precision.py", "tests/training/test_grad_stats.py", "tests/checks/test_gradcheck.py",
                 "tests/layers/test_model.py", "tests/training/test_checkpoint.py"],
    "interop": ["tests/interop"],
    "studies": ["tests/studies"],
    # training outcomes (the reverse task's exact match and loss, the bible slice's loss and hypotheses): its own
    # process with its own -k (the training tests, not the whole file)
    "outcomes": ["tests/training/test_train_e2e.py"],
}
OUTCOMES_SELECT = "reverse_reaches or reverse_learning or bible_slice"
ALL_SUITES = [*PYTEST_SUITES, "grad_checks"]
# The suites a library's variables can change: CTranslate2's (and the oneDNN and MKL it calls) only what runs
# CTranslate2; PyTorch's only what computes with PyTorch (the parity and decoding references, transformers'
# Marian, the layer-placement study's PyTorch row). numpy's, OpenBLAS's and the thread counts change every
# number numformer computes: a row that sets any of them, or nothing (native), runs every suite asked for.
SUITES_OF_PREFIX = {"CT2_": {"interop"}, "ONEDNN_": {"interop"}, "MKL_": {"interop"},
                    "ATEN_": {"parity", "decoding", "interop", "studies"}}


def suites_for(env: dict, asked: list) -> list:
    """The suites of ``asked`` whose outcome the row's variables can change (see SUITES_OF_PREFIX)."""
    affected = set()
    for key in env or {"": None}:
        prefix = next((p for p in SUITES_OF_PREFIX if key.startswith(p)), None)
        affected |= SUITES_OF_PREFIX[prefix] if prefix else set(ALL_SUITES)
    return [s for s in asked if s in affected]
# The worst errors shown, in this order: (column title, key recorded by the tests).
WORST_COLUMNS = [("parity f32", "parity-float32"), ("parity f64", "parity-float64"),
                 ("kernels f32", "kernels-float32"), ("kernels f64", "kernels-float64"),
                 ("decode gap", "decode-vs-torch-score-float64"),
                 # outcomes: each must stay below its bound (0.25, 0.5, 0, 0.25)
                 ("reverse missed", "e2e-reverse-missed"), ("reverse loss ratio", "e2e-reverse-loss-ratio"),
                 ("bible drop short", "e2e-bible-loss-drop-short"), ("bible empty", "e2e-bible-empty")]

# Asks a child process what it really runs on (the variables are read when the libraries load).
PROBE = r"""
import ctypes, json, os
import numpy as np
from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__
core = "?"
for line in open("/proc/self/maps"):
    if "openblas" in line and ".so" in line:
        path = line.split()[-1]
        lib = ctypes.CDLL(path)
        for name in ("scipy_openblas_get_corename64_", "scipy_openblas_get_corename", "openblas_get_corename64_",
                     "openblas_get_corename"):
            if hasattr(lib, name):
                fn = getattr(lib, name); fn.restype = ctypes.c_char_p; core = fn().decode(); break
        break
from numformer.kernels.host.threads import get_num_threads
print(json.dumps({"openblas": core, "numpy": [d for d in __cpu_dispatch__ if __cpu_features__.get(d)],
                  "threads": get_num_threads()}))
"""


def cpu_flags() -> set:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def numpy_dispatch_found() -> list:
    """numpy's runtime dispatch targets that this CPU supports (what NPY_DISABLE_CPU_FEATURES can switch off)."""
    from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__  # noqa: PLC0415
    return [d for d in __cpu_dispatch__ if __cpu_features__.get(d)]


def avx512_dispatch(found: list) -> list:
    """numpy's AVX-512 dispatch targets among ``found`` (X86_V4, AVX512_*; older numpy: AVX512F, AVX512_SKX...)."""
    return [d for d in found if "512" in d or d == "X86_V4"]


def configurations() -> dict:
    """name -> environment variables, for this CPU (a kernel the CPU cannot run is left out)."""
    flags = cpu_flags()
    avx2 = "avx2" in flags and "fma" in flags
    avx512 = "avx512f" in flags
    older = "Sandybridge" if "avx" in flags else "Nehalem"
    found = numpy_dispatch_found()
    baseline = " ".join(found)
    no512 = " ".join(avx512_dispatch(found))
    configs = {"native": {}}
    if avx512:
        configs["openblas-SkylakeX"] = {"OPENBLAS_CORETYPE": "SkylakeX"}
    if avx2:
        configs["openblas-Haswell"] = {"OPENBLAS_CORETYPE": "Haswell"}
        configs["openblas-Zen"] = {"OPENBLAS_CORETYPE": "Zen"}
    configs[f"openblas-{older}"] = {"OPENBLAS_CORETYPE": older}
    if no512:
        configs["numpy-no-avx512"] = {"NPY_DISABLE_CPU_FEATURES": no512}
    if baseline:
        configs["numpy-baseline"] = {"NPY_DISABLE_CPU_FEATURES": baseline}
    if avx2:
        configs["torch-avx2"] = {"ATEN_CPU_CAPABILITY": "avx2"}
    configs["torch-default"] = {"ATEN_CPU_CAPABILITY": "default"}
    isas = ["GENERIC", "AVX"] + (["AVX2"] if avx2 else []) + (["AVX512"] if avx512 else [])
    for isa in isas:
        configs[f"ct2-{isa}"] = {"CT2_FORCE_CPU_ISA": isa}
    configs["ct2-mkl"] = {"CT2_USE_MKL": "1"}
    configs["ct2-onednn"] = {"CT2_USE_MKL": "0"}
    configs["threads-1"] = {"NUMFORMER_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    configs["threads-3"] = {"NUMFORMER_NUM_THREADS": "3", "OPENBLAS_NUM_THREADS": "3"}
    if avx2:
        # a machine that sets OPENBLAS_CORETYPE itself (older OpenBLAS builds crash on some CPUs) keeps its own
        coretype = {} if os.environ.get("OPENBLAS_CORETYPE") else {"OPENBLAS_CORETYPE": "Haswell"}
        configs["avx2-only"] = {**coretype, **({"NPY_DISABLE_CPU_FEATURES": no512} if no512 else {}),
                                "ATEN_CPU_CAPABILITY": "avx2", "CT2_FORCE_CPU_ISA": "AVX2", "CT2_USE_MKL": "0",
                                "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
    configs["oldest"] = {"OPENBLAS_CORETYPE": older, "NUMFORMER_NUM_THREADS": "3", "OPENBLAS_NUM_THREADS": "3",
                         "ATEN_CPU_CAPABILITY": "default", "CT2_FORCE_CPU_ISA": "GENERIC", "CT2_USE_MKL": "0",
                         "ONEDNN_MAX_CPU_ISA": "SSE41",
                         **({"NPY_DISABLE_CPU_FEATURES": baseline} if baseline else {})}
    return configs


def probe(env: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        return {"openblas": "?", "numpy": ["?"], "threads": "?", "error": out.stderr.strip().splitlines()[-1:]}
    return json.loads(out.stdout)


def run_pytest(suites: list, env: dict, select: str | None, work: Path) -> tuple[dict, dict, str]:
    """One pytest process over the suites' files: ({suite: (passed, failed)}, {worst key: value}, tail)."""
    files = [f for s in suites for f in PYTEST_SUITES[s]]
    work.mkdir(parents=True, exist_ok=True)
    junit, cache = work / "junit.xml", work / "cache"
    # addopts emptied: one process (not pyproject.toml's two xdist workers), so that a row's thread variables mean
    # what they say (under -n 2 each worker gets one BLAS thread)
    cmd = [sys.executable, "-m", "pytest", "-q", "-o", "addopts=", "-o", f"cache_dir={cache}", f"--junitxml={junit}",
           *files]
    if select:
        cmd += ["-k", select]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    counts = {s: [0, 0] for s in suites}
    owner = {f: s for s in suites for f in PYTEST_SUITES[s]}
    if junit.exists():
        for case in ET.parse(junit).getroot().iter("testcase"):
            path = case.get("classname", "").replace(".", "/")  # tests.kernels.test_kernels -> tests/kernels/test_kernels
            suite = next((s for f, s in owner.items() if path.startswith(f.removesuffix(".py"))), None)
            if suite is None or case.find("skipped") is not None:
                continue
            failed = case.find("failure") is not None or case.find("error") is not None
            counts[suite][1 if failed else 0] += 1
    if proc.returncode not in (0, 1) and not any(sum(c) for c in counts.values()):  # collection broke
        for s in suites:
            counts[s][1] += 1
    worst_file = cache / "v" / "numformer" / "worst_error"
    worst = {k: v["value"] for k, v in json.loads(worst_file.read_text()).items()} if worst_file.exists() else {}
    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
    return {s: tuple(c) for s, c in counts.items()}, worst, tail


def run_grad_checks(env: dict) -> tuple[tuple, float, str]:
    proc = subprocess.run([sys.executable, "-m", "grad_checks", "--json"], env=env, cwd=ROOT, capture_output=True,
                          text=True)
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return (0, 1), float("nan"), (proc.stdout + proc.stderr)[-2000:]
    return (report["checks"] - report["failed"], report["failed"]), report["max_rel_error"], ""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python3 tests/cpu_matrix.py", description=__doc__.splitlines()[0])
    ap.add_argument("--configs", help="comma-separated configuration names (default: all); --list shows them")
    ap.add_argument("--suites", default=",".join(ALL_SUITES),
                    help=f"comma-separated, of {', '.join(ALL_SUITES)} (default: all)")
    ap.add_argument("-k", dest="select", help="pytest -k expression for the pytest suites (e.g. float32)")
    ap.add_argument("--ci", action="store_true",
                    help="CI's run: the 'oldest' configuration, parity and kernels, float32 cases only")
    ap.add_argument("--list", action="store_true", help="print the configurations and their variables")
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    ap.add_argument("--every-suite", action="store_true",
                    help="run every suite asked for under every row (default: a row runs the suites its variables "
                         "can change: a CTranslate2 row the interop suite, a PyTorch row the suites that use PyTorch)")
    ap.add_argument("--export", metavar="NAME", help="print the configuration's variables as shell export lines "
                    "(for eval) and exit")
    args = ap.parse_args(argv)

    configs = configurations()
    if args.list:
        for name, env in configs.items():
            print(f"{name:20s} {' '.join(f'{k}={v}' for k, v in env.items()) or '(nothing set)'}")
        return 0
    if args.export:
        if args.export not in configs:
            print(f"cpu_matrix: configuration {args.export!r} cannot run on this CPU (see --list)", file=sys.stderr)
            return 2
        for key, value in configs[args.export].items():
            print(f"export {key}={shlex.quote(value)}")
        return 0
    if args.ci:
        args.configs, args.suites, args.select = "oldest", "parity,kernels", "float32"
    names = args.configs.split(",") if args.configs else list(configs)
    suites = args.suites.split(",")
    unknown = [n for n in names if n not in configs] + [s for s in suites if s not in ALL_SUITES]
    if unknown:
        print(f"cpu_matrix: unknown configuration or suite {', '.join(unknown)} (see --list and --help)",
              file=sys.stderr)
        return 2

    rows, tails = [], {}
    asked = suites
    for i, name in enumerate(names, 1):
        suites = asked if args.every_suite else suites_for(configs[name], asked)
        pytest_suites = [s for s in suites if s in PYTEST_SUITES and s != "outcomes"]
        env = {**os.environ, **configs[name], "PYTHONUNBUFFERED": "1"}
        start = time.monotonic()
        print(f"[{i}/{len(names)}] {name}: {' '.join(f'{k}={v}' for k, v in configs[name].items()) or 'as is'}",
              flush=True)
        info = probe(env)
        row = {"config": name, "env": configs[name], **info, "suites": {}, "worst": {}}
        with tempfile.TemporaryDirectory() as tmp:
            if pytest_suites:
                counts, worst, tail = run_pytest(pytest_suites, env, args.select, Path(tmp))
                row["suites"].update(counts)
                row["worst"].update(worst)
                if any(f for _, f in counts.values()):
                    tails[name] = tail
            if "outcomes" in suites:  # its own process: its own -k (the training tests, not the whole file)
                counts, worst, tail = run_pytest(["outcomes"], env, OUTCOMES_SELECT, Path(tmp) / "outcomes")
                row["suites"].update(counts)
                row["worst"].update(worst)
                if any(f for _, f in counts.values()):
                    tails[f"{name} outcomes"] = tail
        if "grad_checks" in suites:
            counts, worst, tail = run_grad_checks(env)
            row["suites"]["grad_checks"] = counts
            row["worst"]["grad_checks"] = worst
            if counts[1]:
                tails[f"{name} grad_checks"] = tail
        row["seconds"] = round(time.monotonic() - start)
        rows.append(row)
        print(f"    {row['seconds']} s: " + ", ".join(f"{s} {p} passed {f} failed" for s, (p, f) in
                                                      row["suites"].items()), flush=True)

    print_table(rows, asked)
    for name, tail in tails.items():
        print(f"\n--- {name}: the end of its output\n{tail}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    passed = sum(p for r in rows for p, _ in r["suites"].values())
    failed = sum(f for r in rows for _, f in r["suites"].values())
    print(f"cpu_matrix: {passed} passed, {failed} failed")
    return 1 if failed else 0


def print_table(rows: list, suites: list) -> None:
    columns = [(title, key) for title, key in WORST_COLUMNS if any(key in r["worst"] for r in rows)]
    if "grad_checks" in suites:
        columns.append(("grad checks", "grad_checks"))
    head = ["configuration", "OpenBLAS", "numpy dispatch", "threads", *[f"{s} pass/fail" for s in suites],
            *[f"worst {t}" for t, _ in columns], "s"]
    print("\n| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        cells = [r["config"], str(r["openblas"]), " ".join(r["numpy"]) or "baseline", str(r["threads"])]
        cells += [f"{r['suites'][s][0]}/{r['suites'][s][1]}" if s in r["suites"] else "-" for s in suites]
        cells += [f"{r['worst'][k]:.2e}" if k in r["worst"] else "-" for _, k in columns]
        cells.append(str(r["seconds"]))
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.exit(main())
