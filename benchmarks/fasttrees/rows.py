"""Result rows of the FastTrees experiment scripts: one JSON list per experiment, a row per run."""
import argparse
import json
import os

from user_dir.result_rows import upsert


def record(work, row, results, key):
    """Writes ``work/result.json``, upserts ``row`` into ``results`` (if given) and prints it."""
    with open(os.path.join(work, "result.json"), "w") as f:
        json.dump(row, f, indent=1)
    if results:
        upsert(results, [row], key)
    print(json.dumps(row))


def run_arguments(description, budget_flag, argv=None, int_flags=()):
    """The arguments every experiment's row script takes: the run's directory, arch, seed, size flags and
    command, its training budget (``budget_flag``: ``--max-epoch`` or ``--max-update``), the results list; and
    the script's own integer flags ``int_flags`` (optional, default None)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--work", required=True)
    p.add_argument("--arch", required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument(budget_flag, type=int, required=True)
    p.add_argument("--size-flags", default="")
    p.add_argument("--command", required=True)
    p.add_argument("--results", default=None)
    for flag in int_flags:
        p.add_argument(flag, type=int, default=None)
    return p.parse_args(argv)
