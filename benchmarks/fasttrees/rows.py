"""Result rows of the FastTrees experiment scripts: one JSON list per experiment, a row per run."""
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
