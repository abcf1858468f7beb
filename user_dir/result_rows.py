"""Result rows of the experiment scripts under ``benchmarks/`` and ``examples/``: one JSON list per experiment,
one row per finished run, the reading of a ``fairseq-train`` log those rows are made from, and the statistics
over seeds the summaries report (mean ± s.e., paired differences)."""
import datetime
import fcntl
import itertools
import json
import math
import os
import re
import statistics


def upsert(path, new_rows, key):
    """Replaces the rows of the JSON list at ``path`` (created if absent) that have the ``key`` of one of
    ``new_rows`` by those, keeping the list sorted by ``key``.  Written through a temporary file (a kill leaves
    the old list), and runs finishing together take turns (an exclusive lock)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        rows = []
        if os.path.exists(path):
            with open(path) as f:
                rows = json.load(f)
        replaced = {key(r) for r in new_rows}
        rows = sorted([r for r in rows if key(r) not in replaced] + list(new_rows), key=key)
        with open(path + ".tmp", "w") as f:
            json.dump(rows, f, indent=1)
            f.write("\n")
        os.replace(path + ".tmp", path)


def read_rows(path, parser, script):
    """The rows of the JSON list at ``path`` (a summary's ``--results``); a clear ``parser`` error naming the
    experiment ``script`` to run when the file is not there."""
    if not os.path.exists(path):
        parser.error(f"--results {path}: no such file (run {script} first)")
    with open(path) as f:
        return json.load(f)


def parse_train_log(path, metric):
    """(updates, epochs, the validation ``metric`` after each epoch in order, stopped by ``--patience`` after
    the last validation) of a ``fairseq-train`` log written with ``--log-format simple``."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    lines = list(re.finditer(
        rf"epoch (\d+) \| valid on 'valid' subset \|(?:[^\n]*?\|)? {metric} ([\d.]+) \|[^\n]*?num_updates (\d+)", text))
    if not lines:
        raise SystemExit(f"{path} holds no validation line with {metric}; did training run?")
    valid = [(int(m.group(1)), float(m.group(2)), int(m.group(3))) for m in lines]
    # stopped by --patience after its last validation (a run stopped early once and then continued is not)
    early = "early stop since valid performance hasn't improved" in text[lines[-1].end():]
    return valid[-1][2], valid[-1][0], [v for _, v, _ in valid], early


TRAINING_LOGGERS = ("fairseq_cli.train", "fairseq.trainer", "fairseq.checkpoint_utils", "train_inner", "train", "valid")


def train_seconds(log):
    """Wall-clock seconds of training in the ``fairseq-train`` log at ``log``, every start of the run together
    (a resumed run appends to its log): a start counts from its configuration line to its last line from the
    training loop (``TRAINING_LOGGERS``), so a start that was killed counts up to its last logged step, and
    neither the idle time before a later start nor that start's import warnings count.  None when the log
    has no start."""
    if not os.path.exists(log):
        return None
    spans = []  # [first, last] timestamp of each start
    with open(log, encoding="utf-8", errors="replace") as f:
        for line in f:
            fields = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) \| \w+ \| ([\w.]+) \| (.)", line)
            if not fields or fields.group(2) not in TRAINING_LOGGERS:
                continue
            when = datetime.datetime.strptime(fields.group(1), "%Y-%m-%d %H:%M:%S")
            if fields.group(2) == "fairseq_cli.train" and fields.group(3) == "{":  # printed once per start
                spans.append([when, when])
            elif spans:
                spans[-1][1] = when
    return int(sum((last - first).total_seconds() for first, last in spans)) if spans else None


def mean_se(values):
    """(mean, standard error of the mean); the s.e. is None for a single value."""
    mean = statistics.mean(values)
    return mean, (statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None)


def paired(a, b, higher_is_better=True):
    """{"diff", "se", "ahead", "n", "t_p", "p"} of A − B over seeds given in the same order: the mean difference,
    its standard error, in how many seeds A is ahead (higher; lower with ``higher_is_better=False``), the two-sided
    paired t-test p-value (Student's t with n − 1 degrees of freedom) and the exact two-sided sign-flip permutation p-value (all 2^n sign patterns of the paired
    differences; it cannot fall below 2 / 2^n, so below 0.05 only from 6 seeds on)."""
    if len(a) != len(b) or len(a) < 2:
        raise ValueError(f"paired comparison needs the same number (>= 2) of seeds, got {len(a)} and {len(b)}")
    diffs = [x - y for x, y in zip(a, b)]
    mean, se = mean_se(diffs)
    observed = abs(sum(diffs))
    flips = list(itertools.product((1, -1), repeat=len(diffs)))
    extreme = sum(abs(sum(s * d for s, d in zip(signs, diffs))) >= observed - 1e-9 for signs in flips)
    if se > 0:
        import scipy.stats  # here, not at the top: the row writers run where only fairseq's needs are installed

        t_p = 2 * scipy.stats.t.sf(abs(mean) / se, len(diffs) - 1)
    else:  # every seed the same difference
        t_p = 1.0 if mean == 0 else 0.0
    ahead = sum((d > 0) if higher_is_better else (d < 0) for d in diffs)
    return {"diff": mean, "se": se, "ahead": ahead, "n": len(diffs), "t_p": float(t_p),
            "p": extreme / len(flips)}


def verdict(comparison, higher_is_better=True):
    """"ahead" / "behind" when the paired t-test's p (:func:`paired`) is below 0.05, else "within noise"."""
    if comparison["t_p"] >= 0.05:
        return "within noise"
    return "ahead" if (comparison["diff"] > 0) == higher_is_better else "behind"


def paired_text(comparison):
    """The paired difference as the summaries print it: ``+d ± se (t-test p, sign-flip p, ahead in k of n)``."""
    return (f"{comparison['diff']:+.3g} ± {comparison['se']:.2g} (t-test p = {comparison['t_p']:.3f}, sign-flip "
            f"p = {comparison['p']:.2f}, ahead in {comparison['ahead']} of {comparison['n']})")



def dev_choice(dev_by_setting, higher_is_better=True):
    """A setting chosen on dev (a learning rate, say): ``dev_by_setting`` {setting: {seed: best dev metric}} →
    (the setting with the best mean, {setting: its mean}), the means taken over the seeds that every setting
    has (over each one's own seeds if they share none), so that a seed run at one setting only cannot decide.
    With one setting there is nothing to choose: its mean is ``None``."""
    if len(dev_by_setting) == 1:
        return next(iter(dev_by_setting)), dict.fromkeys(dev_by_setting)
    common = set.intersection(*(set(dev) for dev in dev_by_setting.values()))
    means = {setting: statistics.mean(v for seed, v in dev.items() if seed in common or not common)
             for setting, dev in dev_by_setting.items()}
    return (max if higher_is_better else min)(means, key=means.get), means


def chosen_on_dev(rows, group, setting, dev, higher_is_better=True):
    """Each group's rows at its setting chosen on dev (:func:`dev_choice`): ``group(row)`` names a row's group (a
    model), ``setting(row)`` its setting (a learning rate), ``dev(row)`` its best dev metric.  Returns ({group:
    (chosen setting, {setting: mean dev})}, the rows at the chosen settings)."""
    runs = {}
    for r in rows:
        runs.setdefault(group(r), {}).setdefault(setting(r), {})[r["seed"]] = dev(r)
    choice = {g: dev_choice(by_setting, higher_is_better) for g, by_setting in runs.items()}
    return choice, [r for r in rows if setting(r) == choice[group(r)][0]]
