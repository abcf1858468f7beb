"""BENCHMARKS.md's mixed-precision table, from the test suite's own half-precision checks.

Runs ``pytest -k "fp16 or bf16"`` with ``PRECISION_REPORT`` set, so every
``assert_low_precision_close`` call records its model's max error against float32 next to
the fairseq baseline's error on the same input; writes them to ``errors.csv`` beside this
script and prints a markdown table (one row per test and dtype).

    python benchmarks/mixed_precision/table.py
"""
import csv
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def main():
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.jsonl")
        env = dict(os.environ, PRECISION_REPORT=report, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        proc = subprocess.run([sys.executable, "-m", "pytest", "tests", "-q", "-k", "fp16 or bf16", "-p",
                               "no:cacheprovider"], cwd=ROOT, env=env, capture_output=True, text=True)
        print(proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-2000:])
        if not os.path.exists(report):
            sys.exit("no half-precision check recorded a figure")
        with open(report) as f:
            rows = [json.loads(line) for line in f]
    out = os.path.join(HERE, "errors.csv")
    with open(out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["test", "dtype", "error", "baseline_error", "limit"])
        writer.writeheader()
        writer.writerows(rows)
    print(f"\n{len(rows)} figures -> {os.path.relpath(out, ROOT)}\n")
    print(summary_table(rows))
    sys.exit(proc.returncode)


def summary_table(rows):
    """One row per test file (architecture family); per dtype the number of checks, the median
    ratio error / baseline error and the worst check (largest ratio)."""
    groups = {}
    for r in rows:
        family = r["test"].split("::")[0].replace("tests/test_", "").rsplit("_", 1)[0].replace("_gpu", "")
        r["ratio"] = r["error"] / r["baseline_error"] if r["baseline_error"] else float("inf")
        groups.setdefault(family, {}).setdefault(r["dtype"], []).append(r)
    dtypes = ("float16", "bfloat16")
    lines = ["| tests | " + " | ".join(f"{d}: checks, median ratio; worst error vs baseline (ratio)" for d in dtypes)
             + " |", "|---|" + "---|" * len(dtypes)]
    for family, by_dtype in sorted(groups.items()):
        cells = []
        for dtype in dtypes:
            group = by_dtype.get(dtype, [])
            if not group:
                cells.append("—")
                continue
            worst = max(group, key=lambda r: r["ratio"])
            median = sorted(r["ratio"] for r in group)[len(group) // 2]
            cells.append(f"{len(group)}, {median:.2f}; {worst['error']:.3g} vs {worst['baseline_error']:.3g} "
                         f"({worst['ratio']:.2f})")
        lines.append(f"| {family} | " + " | ".join(cells) + " |")
    return "\n".join(lines)

if __name__ == "__main__":
    main()
