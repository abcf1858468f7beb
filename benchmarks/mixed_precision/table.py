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
    print("| test | dtype | max error vs float32 | fairseq baseline's error | ratio |")
    print("|---|---|---|---|---|")
    for r in rows:
        name = r["test"].replace("tests/", "")
        ratio = r["error"] / r["baseline_error"] if r["baseline_error"] else float("nan")
        print(f"| `{name}` | {r['dtype']} | {r['error']:.3g} | {r['baseline_error']:.3g} | {ratio:.2f} |")
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
