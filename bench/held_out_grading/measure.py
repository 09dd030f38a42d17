"""Measures `python3 -m grad_checks check` on the held-out answers of manifest.json.

For every entry it runs the grader (cwd --repo, PYTHONPATH=--repo, a time limit per file) and classifies
the report:

  right answers:  exact         the grade is EXACT
                  blamed        any other grade (a failure of the grader)
  wrong answers:  located       the report names a wrong line (as "line N" in a blaming sentence) or quotes
                                a wrong term, and names no line outside wrong_lines as wrong
                  misdiagnosed  it names as wrong a line that is not in wrong_lines
                  vague         it says the answer is wrong but gives no location (a hedged list of candidate
                                lines that includes a right line counts as no location)
                  missed        it grades the wrong answer EXACT

The parser is deliberately tolerant of the report's wording. Per line of the report, split at "; ":
  * "uses `X` (line N) where ..." names where a value came from: evidence for a location when N is a wrong
    line, never a blame of a right line;
  * "lines A, B or C" (numbers joined by "or"), or any mention in a segment saying "no step ... proven" /
    "not proven", is a hedged candidate list: a location only if every listed line is a wrong line;
  * "raised ... at FILE.py:N" is where it raised, not a blame;
  * "numformer's line N" is numformer's, ignored;
  * every other "line N" / "lines N and M" is a blame when its segment holds a blame word ("first wrong
    step", "computes it differently", "times numformer's", "in its place", "every gradient is right",
    "belongs", "should", "is wrong", "mistake", "instead of", "where numformer's"), else neutral.
  * a backticked span that contains a wrong term (and is not the text of a right line) quotes the term;
    "your NAME" with NAME assigned only on wrong lines is evidence too.
Entries the parser is unsure of (neutral line mentions only, location only from soft evidence, no
result line) are marked "?" in the table; --verbose prints their raw reports.

    python3 bench/held_out_grading/measure.py [--repo CHECKOUT] [--timeout 60] [--verbose] [--only 07]
"""
import json
import os
import pathlib
import re
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from numformer.cli.arguments import OneLineParser, positive_float  # noqa: E402  (one-line usage errors)
from numformer.cli.front import command_line  # noqa: E402  (a bug says so; see numformer/cli/front.py)

PROG = "bench/held_out_grading/measure.py"  # the name its one-line errors start with

HERE = pathlib.Path(__file__).resolve().parent

BLAME_WORDS = ("first wrong step", "computes it differently", "computes what numformer", "times numformer",
               "in its place", "every gradient is right", "belongs", "should", "is wrong", "are wrong",
               "mistake", "instead of", "where numformer's", "used where", "wrong step")
HEDGE_WORDS = ("no step", "not proven", "cannot tell", "can't tell", "one of lines", "either line")
NUMS = r"(\d+(?:(?:,\s*|\s*,?\s*(?:or|and)\s+)\d+)*)"
LINE_MENTION = re.compile(r"(numformer's\s+)?\blines?\s+" + NUMS)
PROVENANCE = re.compile(r"uses\s+`[^`]*`\s+\(lines?\s+" + NUMS + r"\)")
RAISED_AT = re.compile(r"\.py:(\d+)")


def norm(s):
    return re.sub(r"\s+", "", s)


def numbers(text):
    return [int(n) for n in re.findall(r"\d+", text)]


def parse_report(text, entry, file_lines):
    """-> dict: hard (blamed lines), soft (location evidence lines), hedged (list of sets), neutral (lines),
    terms (quoted wrong terms), grade."""
    m = re.search(r"^result:\s*([A-Z]+)", text, re.M)
    grade = m.group(1) if m else None
    hard, soft, neutral, hedged, terms = set(), set(), set(), [], []
    wrong = set(entry["wrong_lines"])
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("grading ", "train with", "tensor ")) or re.match(r"case \d+ of", line):
            continue
        for seg in re.split(r";\s+", line):
            low = seg.lower()
            prov_spans = []
            for pm in PROVENANCE.finditer(seg):
                ns = numbers(pm.group(1))
                soft.update(n for n in ns if n in wrong)
                prov_spans.append(pm.span())
            hedge_seg = any(w in low for w in HEDGE_WORDS)
            blame_seg = any(w in low for w in BLAME_WORDS)
            for lm in LINE_MENTION.finditer(seg):
                if any(a <= lm.start() < b for a, b in prov_spans):
                    continue
                if lm.group(1):  # numformer's line N
                    continue
                ns = numbers(lm.group(2))
                joined_by_or = len(ns) > 1 and re.search(r"\bor\b", lm.group(2))
                single_mistake = len(ns) == 1 and re.search(r"mistake is on line\s+%d\b" % ns[0], seg)
                if joined_by_or:
                    hedged.append(set(ns))
                elif hedge_seg:
                    if single_mistake:  # "no step ... proven wrong: the mistake is on line N": a location
                        hard.update(ns)
                    elif len(ns) > 1:
                        hedged.append(set(ns))
                    else:
                        neutral.update(ns)
                elif blame_seg:
                    hard.update(ns)
                else:
                    neutral.update(ns)
    # quoted wrong terms
    wrong_text = [file_lines[n - 1] for n in wrong if 0 < n <= len(file_lines)]
    right_text = [norm(l) for i, l in enumerate(file_lines, 1) if i not in wrong and l.strip()]
    spans = [norm(s) for s in re.findall(r"`([^`\n]+)`", text)]
    for t in entry["wrong_terms"]:
        nt = norm(t)
        if len(nt) < 2:
            continue
        for sp in spans:
            if nt in sp and (any(sp in norm(w) for w in wrong_text) or not any(sp in r for r in right_text)) \
                    and sp not in right_text:
                terms.append(t)
                break
    # "your NAME" where NAME is assigned only on wrong lines
    assigned = {}
    for i, l in enumerate(file_lines, 1):
        am = re.match(r"\s*([A-Za-z_]\w*)\s*(?:[-+*/]?=)(?!=)", l)
        if am:
            assigned.setdefault(am.group(1), set()).add(i)
    for name in re.findall(r"\byour\s+([A-Za-z_]\w*)\b", text):
        if name in assigned and assigned[name] <= wrong and name not in ("line", "lines", "code", "gradient"):
            soft.update(assigned[name])
    return dict(grade=grade, hard=sorted(hard), soft=sorted(soft), neutral=sorted(neutral - hard),
                hedged=[sorted(h) for h in hedged], terms=terms)


def classify(entry, parsed):
    """-> (class, confident, detail)."""
    grade = parsed["grade"]
    if grade is None:
        return ("blamed" if entry["right"] else "vague"), False, "no result line (timeout or crash?)"
    if entry["right"]:
        return ("exact", True, "") if grade == "EXACT" else ("blamed", True, f"graded {grade}")
    if grade == "EXACT":
        return "missed", True, "graded EXACT"
    wrong = set(entry["wrong_lines"])
    hard = set(parsed["hard"])
    outside = sorted(hard - wrong)
    if outside:
        return "misdiagnosed", True, f"blames line(s) {outside} (wrong: {sorted(wrong)})"
    reasons = []
    if hard & wrong:
        reasons.append(f"line(s) {sorted(hard & wrong)}")
    for h in parsed["hedged"]:
        if set(h) <= wrong:
            reasons.append(f"candidate lines {h}, all wrong")
    if parsed["terms"]:
        reasons.append("term " + ", ".join(f"`{t}`" for t in parsed["terms"]))
    soft_only = not reasons and parsed["soft"]
    if soft_only:
        reasons.append(f"soft: line(s) {parsed['soft']}")
    if reasons:
        return "located", not soft_only, "; ".join(reasons)
    detail = []
    if parsed["hedged"]:
        detail.append("hedged " + " | ".join(",".join(map(str, h)) for h in parsed["hedged"]))
    if grade == "APPROXIMATE":
        detail.append("graded APPROXIMATE")
    confident = not parsed["neutral"]
    if parsed["neutral"]:
        detail.append(f"neutral mention of line(s) {parsed['neutral']}")
    return "vague", confident, "; ".join(detail)


def run_check(repo, path, timeout):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(repo) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    t0 = time.time()
    try:
        p = subprocess.run([sys.executable, "-m", "grad_checks", "check", str(path)], cwd=repo, env=env,
                           capture_output=True, text=True, timeout=timeout)
        out, rc = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        out, rc = out + f"\n[measure.py: timed out after {timeout} s]", None
    return out, rc, time.time() - t0


@command_line(PROG)
def main(argv=None) -> int:
    ap = OneLineParser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("--repo", default=str(ROOT), help="the checkout whose grad_checks is measured (default: this one)")
    ap.add_argument("--manifest", default=str(HERE / "manifest.json"))
    ap.add_argument("--out", default=None, help="also write every entry's class as JSON to this file")
    ap.add_argument("--timeout", type=positive_float, default=60.0, help="seconds per file")
    ap.add_argument("--only", default=None, help="only files whose name starts with this (e.g. 07)")
    ap.add_argument("--verbose", "-v", action="store_true", help="print raw reports of unsure entries")
    args = ap.parse_args(argv)
    repo = pathlib.Path(args.repo).resolve()
    manifest = json.loads(pathlib.Path(args.manifest).read_text())
    results = []
    t_start = time.time()
    print(f"grader: {repo}   answers: {len(manifest)}   timeout {args.timeout:g} s per file")
    print(f"{'file':<46} {'kind':<18} {'grade':<11} {'class':<13}   detail")
    for e in manifest:
        if args.only and not pathlib.Path(e["file"]).name.startswith(args.only):
            continue
        path = (pathlib.Path(args.manifest).resolve().parent / e["file"]).resolve()
        file_lines = path.read_text().split("\n")
        report, rc, secs = run_check(repo, path, args.timeout)
        parsed = parse_report(report, e, file_lines)
        cls, confident, detail = classify(e, parsed)
        results.append(dict(file=e["file"], exercise=e["exercise"], kind=e["kind"], right=e["right"],
                            wrong_lines=e["wrong_lines"], grade=parsed["grade"], rc=rc, seconds=round(secs, 2),
                            cls=cls, confident=confident, detail=detail, parsed=parsed, report=report))
        print(f"{pathlib.Path(e['file']).name[:46]:<46} {e['kind']:<18} {str(parsed['grade']):<11} "
              f"{cls:<13}{' ' if confident else '?'}  {detail}")
        if args.verbose and not confident:
            print("    ---- raw report ----")
            for l in report.rstrip().splitlines():
                print("    | " + l)
    wrong = [r for r in results if not r["right"]]
    right = [r for r in results if r["right"]]
    count = lambda rs, c: sum(r["cls"] == c for r in rs)
    located = count(wrong, "located")
    summary = dict(
        repo=str(repo), wrong=len(wrong), located=located,
        located_share=round(located / len(wrong), 4) if wrong else None,
        misdiagnosed=count(wrong, "misdiagnosed"), vague=count(wrong, "vague"), missed=count(wrong, "missed"),
        right=len(right), exact=count(right, "exact"), blamed_right=count(right, "blamed"),
        unsure=sum(not r["confident"] for r in results), seconds=round(time.time() - t_start, 1))
    line = (f"SUMMARY: located {located}/{len(wrong)} wrong answers "
            f"({100 * summary['located_share']:.0f}%), misdiagnosed {summary['misdiagnosed']}, "
            f"vague {summary['vague']}, missed {summary['missed']}; right answers blamed "
            f"{summary['blamed_right']}/{len(right)}; unsure {summary['unsure']}; {summary['seconds']} s"
            if wrong else "SUMMARY: no wrong answers selected")
    print(line)
    summary["line"] = line
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(dict(summary=summary, entries=results), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
