"""Result rows of the FastTrees experiment scripts: one JSON list per experiment, a row per run."""
import argparse
import json
import os


def upsert(path, row, key):
    """Replaces the row of ``path``'s JSON list (created if absent) whose ``key(row)`` equals ``row``'s,
    keeping the list sorted by ``key``; written through a temporary file, so a kill leaves the old list."""
    rows = []
    if os.path.exists(path):
        with open(path) as f:
            rows = json.load(f)
    rows = sorted([r for r in rows if key(r) != key(row)] + [row], key=key)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(rows, f, indent=1)
        f.write("\n")
    os.replace(path + ".tmp", path)


def train_seconds(work):
    """Seconds of training recorded by the script in ``work/train_seconds`` (one line per start), or None."""
    path = os.path.join(work, "train_seconds")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return sum(int(x) for x in f.read().split())


def record(work, row, results, key):
    """Writes ``work/result.json``, upserts ``row`` into ``results`` (if given) and prints it."""
    with open(os.path.join(work, "result.json"), "w") as f:
        json.dump(row, f, indent=1)
    if results:
        upsert(results, row, key)
    print(json.dumps(row))


def run_arguments(description, budget_flag, argv=None):
    """The arguments every experiment's row script takes: the run's directory, arch, seed, size flags and
    command, its training budget (``budget_flag``: ``--max-epoch`` or ``--max-update``), the results list."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--work", required=True)
    p.add_argument("--arch", required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument(budget_flag, type=int, required=True)
    p.add_argument("--size-flags", default="")
    p.add_argument("--command", required=True)
    p.add_argument("--results", default=None)
    return p.parse_args(argv)
