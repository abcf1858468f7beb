#!/usr/bin/env python
"""Draw the PNGs of docs/figures/ from the committed results in benchmarks/figures/results/.

    python benchmarks/figures/make_figures.py [--results DIR] [--out DIR] [--only NAME ...]

Every figure is drawn only from its results file (CSV with ``#`` comment lines naming the command that
produced the figures, or JSON written by ``capsule_routing_data.py`` / ``fasttrees_tree_data.py``), so
rerunning a benchmark and updating its file regenerates the plot.
"""
import argparse
import csv
import json
import logging
import math
import os
import statistics
import sys
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CAPSULE_SPEED = os.path.join(ROOT, "benchmarks", "capsule_transformer", "results")  # speed.py --out files
FASTTREES_DIR = os.path.join(ROOT, "benchmarks", "fasttrees")  # logic_lstm.sh rows and summarize_lstm.py
STAR_RESULTS = os.path.join(ROOT, "benchmarks", "star_transformer", "results")  # rows of converged.sh


def read_csv(path):
    with open(path, encoding="utf-8") as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def num(x):
    return float(x) if x not in ("", None) else math.nan


def load_script(path):
    """A benchmark's summary script as a module (they are scripts, not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def grid_and_legend(*axes, legend=None, **grid):
    """The figures' common finish: a light grid (``grid`` as for ``Axes.grid``) and a small legend (``legend``:
    more ``Axes.legend`` arguments, e.g. a place outside the axes)."""
    for ax in axes:
        ax.grid(True, alpha=0.3, **grid)
        ax.legend(fontsize=8, **(legend or {}))


def star_scaling(results, plt):
    rows = read_csv(os.path.join(results, "star_scaling.csv"))
    n = [int(r["n"]) for r in rows]
    timed = [r for r in rows if r["star_s"]]
    tn = [int(r["n"]) for r in timed]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.loglog(tn, [num(r["transformer_s"]) for r in timed], "s-", label="fairseq TransformerEncoder")
    ax1.loglog(tn, [num(r["star_s"]) for r in timed], "o-", label="Star-Transformer")
    ax1.loglog(tn, [num(r["transformer_s"]) / num(r["flop_bound"]) for r in timed], "k--",
               label="FLOP bound (Transformer time / FLOP ratio)")
    ax1.set(xlabel="sequence length n", ylabel="forward+backward time (s)", title="time, batch 1, d 300, 2 layers")
    ax2.loglog(n, [num(r["transformer_mb"]) for r in rows], "s-", label="fairseq TransformerEncoder")
    ax2.loglog(n, [num(r["star_mb"]) for r in rows], "o-", label="Star-Transformer")
    ax2.loglog(n, [num(r["star_ckpt_mb"]) for r in rows], "^-", label="Star, --checkpoint-activations")
    ax2.set(xlabel="sequence length n", ylabel="activation memory kept for backward (MB)", title="activation memory")
    grid_and_legend(ax1, ax2, which="both")
    return fig


# Dai et al. 2019, evaluation speed-up over Al-Rfou et al.'s vanilla model (character level), by attention length
TXL_PAPER_SPEEDUP = {800: 363, 1800: 773, 2800: 1409, 3800: 1874}


def txl_eval_speedup(results, plt):
    """From ``benchmarks/transformer_xl/results/eval_speedup_enwik8_base_t*.json`` (``bench_speed.py eval --size
    enwik8_base --tgt-len T --out ...``)."""
    txl_results = os.path.join(ROOT, "benchmarks", "transformer_xl", "results")
    fig, ax = plt.subplots(figsize=(6, 4))
    for tgt_len, marker in ((128, "o-"), (256, "s-")):
        with open(os.path.join(txl_results, f"eval_speedup_enwik8_base_t{tgt_len}.json")) as f:
            rows = json.load(f)["results"]
        x = [r["attention_length"] for r in rows]
        y = [r["speedup_of_medians"] for r in rows]
        err = [[yy - min(r["paired_speedups"]) for yy, r in zip(y, rows)],
               [max(r["paired_speedups"]) - yy for yy, r in zip(y, rows)]]
        ax.errorbar(x, y, yerr=err, fmt=marker, capsize=3, label=f"measured, segments of {tgt_len} tokens")
    ax.plot(list(TXL_PAPER_SPEEDUP), list(TXL_PAPER_SPEEDUP.values()), "k*", ms=10, label="paper")
    ax.set(xscale="log", yscale="log", xlabel="attention length L",
           ylabel="evaluation speed-up over a sliding window",
           title="Transformer-XL evaluation with memory, enwik8 base size\n(median, repeat range; one CPU thread)")
    grid_and_legend(ax, which="both")
    return fig


TXL_LABELS = {"txl_mem70": "transformer_xl_lm, memory 70", "txl_mem70_eval_mem0": "same checkpoint, evaluated without memory",
              "txl_mem0": "transformer_xl_lm, trained without memory", "transformer_lm": "fairseq transformer_lm"}


def txl_ptb(results, plt):
    rows = read_csv(os.path.join(results, "txl_ptb.csv"))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for model, label in TXL_LABELS.items():
        for ax, kind, f in ((ax1, "valid_ppl", lambda v: v), (ax2, "train_bits", lambda v: 2 ** v)):
            sel = sorted((int(r["updates"]), f(num(r["value"]))) for r in rows if r["model"] == model and r["kind"] == kind)
            if sel:
                ax.plot(*zip(*sel), "o-", label=label)
    ax1.set(xlabel="updates (end of a run of that budget)", ylabel="valid perplexity",
            title="PTB valid perplexity (runs of 500 and 1,200 updates)")
    ax2.set(xlabel="update", ylabel="training perplexity (2^loss bits)", title="training curve of the 1,200-update runs")
    grid_and_legend(ax1, ax2)
    return fig


def bleu_per_seed(ax, series, title, min_span=2.0):
    """BLEU per seed of each configuration (``series``: (label, marker, {seed: BLEU})), points side by side, and
    each configuration's mean ± s.e. to the right of the seeds.  The BLEU axis spans at least ``min_span`` points,
    so that a difference of a fraction of a point does not fill the plot."""
    seeds = sorted({s for _, _, by_seed in series for s in by_seed})
    mean_x = max(seeds) + 1.2
    for i, (label, marker, by_seed) in enumerate(series):
        offset = (i - (len(series) - 1) / 2) * 0.15
        y = [by_seed[s] for s in sorted(by_seed)]
        mean = statistics.mean(y)
        se = statistics.stdev(y) / math.sqrt(len(y)) if len(y) > 1 else None
        spread = f" ± {se:.2f}" if se is not None else " (one seed)"
        line, = ax.plot([s + offset for s in sorted(by_seed)], y, marker, label=f"{label}: {mean:.2f}{spread}")
        ax.errorbar([mean_x + offset], [mean], yerr=None if se is None else [se], fmt=marker,
                    color=line.get_color(), capsize=3)
    ax.set_xticks(seeds + [mean_x], [str(s) for s in seeds] + ["mean ± s.e."])
    low, high = ax.get_ylim()
    if high - low < min_span:
        middle = (low + high) / 2
        ax.set_ylim(middle - min_span / 2, middle + min_span / 2)
    ax.set(xlabel="seed", ylabel="test_2016_flickr BLEU", title=title)
    grid_and_legend(ax, axis="y")


def capsule_bleu_seeds(results, plt):
    rows = read_csv(os.path.join(results, "capsule_bleu_seeds.csv"))
    fig, ax = plt.subplots(figsize=(7, 4))
    cols = (("transformer", "fairseq transformer", "s"), ("capsule_default", "capsule, enc + dec self-attn (default)", "o"),
            ("capsule_enc_self", "capsule, --routed-attention enc_self", "^"))
    bleu_per_seed(ax, [(label, marker, {int(r["seed"]): num(r[col]) for r in rows}) for col, label, marker in cols],
                  "Multi30k En→De, 428 updates × 4,096 tokens")
    return fig


def multi30k_converged(results, plt):
    """Test BLEU per seed of the Multi30k runs trained to convergence (``multi30k_converged.sh`` rows, the
    configurations of ``summarize_converged.py``'s table)."""
    path = os.path.join(ROOT, "benchmarks", "translation", "results", "multi30k_converged.json")
    summary = load_script(os.path.join(ROOT, "benchmarks", "translation", "summarize_converged.py"))
    with open(path, encoding="utf-8") as f:
        configs = summary.summarize(json.load(f))["configs"]
    markers = {"transformer": "s", "capsule_transformer (enc_self)": "^", "capsule_transformer (default)": "o",
               "fasttrees_transformer": "D"}
    fig, ax = plt.subplots(figsize=(7, 4))
    bleu_per_seed(ax, [(config, markers[config], dict(zip(e["seeds"], e["test_bleu"]))) for config, e in configs.items()],
                  "Multi30k En→De, trained until validation loss stopped improving")
    return fig


def capsule_speed(results, plt):
    """Capsule / vanilla ratios against source length, from ``benchmarks/capsule_transformer/speed.py --out``."""
    runs = (("base", "base (paper size), default routing", "o-"), ("multi30k", "multi30k, default routing", "s-"),
            ("base_enc_self", "base, --routed-attention enc_self", "D--"),
            ("multi30k_enc_self", "multi30k, --routed-attention enc_self", "^-"),
            ("base_vocab1004", "base, default routing", "o:"), ("multi30k_vocab1004", "multi30k, default routing", "s:"))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
    for name, label, style in runs:
        with open(os.path.join(CAPSULE_SPEED, f"speed_{name}.json"), encoding="utf-8") as f:
            r = json.load(f)
        label = f"{label}, vocab {r.get('vocab', 1004):,}"  # runs before --vocab existed used 1,004 symbols
        lengths = sorted(r["train"], key=int)
        x = [int(n) for n in lengths]
        ax1.plot(x, [r["train"][n]["ratio"] for n in lengths], style, label=label)
        ax2.plot(x, [r["generate"][n]["ratio"] for n in lengths], style, label=label)
    ax1.axhline(1.3, color="k", ls="--", lw=1, label="target ≤ 1.3")
    ax2.axhline(0.75, color="k", ls="--", lw=1, label="target ≥ 0.75")
    ax1.set(xlabel="source length (tokens)", ylabel="training step time, capsule / vanilla", title="training step")
    ax2.set(xlabel="source length (tokens)", ylabel="sentences/s, capsule / vanilla", title="beam-5 generation")
    grid_and_legend(ax1, ax2)
    return fig


def capsule_routing(results, plt):
    """The panels that ``examples/capsule_transformer/plot_routing.py --json`` wrote."""
    with open(os.path.join(results, "capsule_routing.json"), encoding="utf-8") as f:
        cap = json.load(f)
    panels = cap["panels"]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.6))
    for ax, panel in zip(axes, panels):
        im = ax.imshow(panel["matrix"], cmap=panel["cmap"], aspect="auto")
        ax.set_title(panel["title"], fontsize=9)
        ax.set_xticks(range(len(panel["x"])), panel["x"], rotation=90, fontsize=7)
        ax.set_yticks(range(len(panel["y"])), panel["y"], fontsize=7)
        fig.colorbar(im, ax=ax, fraction=0.046)
    fig.suptitle(textwrap.fill(cap["caption"], 160), fontsize=9)
    return fig


def _tree_layout(tree, depth, leaves, edges):
    """Lay out a tree of nested lists of words: a leaf's x is its index, a node's the mean of its children's,
    y is minus the depth.  Returns the node's (x, y); fills ``leaves`` with (x, y, word) and ``edges``."""
    if isinstance(tree, str):
        leaves.append((len(leaves), -depth, tree))
        return leaves[-1][:2]
    kids = [_tree_layout(child, depth + 1, leaves, edges) for child in tree]
    here = (sum(k[0] for k in kids) / len(kids), -depth)
    edges.extend((here, k) for k in kids)
    return here


def _draw_tree(ax, tree, title):
    leaves, edges = [], []
    _tree_layout(tree, 0, leaves, edges)
    for (x0, y0), (x1, y1) in edges:
        ax.plot([x0, x1], [y0, y1], "k-", lw=0.8)
    for x, y, word in leaves:
        ax.text(x, y - 0.2, word, rotation=90, ha="center", va="top", fontsize=8)
    ax.set_ylim(min(y for _, y, _ in leaves) - 3, 0.5)
    ax.set_title(title, fontsize=9)
    ax.axis("off")


def fasttrees_tree(results, plt):
    with open(os.path.join(results, "fasttrees_tree.json"), encoding="utf-8") as f:
        data = json.load(f)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    _draw_tree(ax1, data["gold"], "gold tree (PTB sample, punctuation removed)")
    _draw_tree(ax2, data["induced"], f"induced by FastTrees layer {data['layer']}")
    fig.suptitle(textwrap.fill(data["caption"], 140), fontsize=9)
    return fig


def fasttrees_logic(results, plt):
    rows = read_csv(os.path.join(results, "fasttrees_logic.csv"))
    ops = [int(r["operators"]) for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(ops, [num(r["fasttrees"]) for r in rows], "o-", label="FastTrees (fasttrees_roberta_conv_logic)")
    ax.plot(ops, [num(r["roberta"]) for r in rows], "s-", label="transformer encoder (roberta), equal size")
    ax.plot(ops, [num(r["majority"]) for r in rows], "k:", label="majority class")
    ax.axvspan(6.5, 12.5, color="grey", alpha=0.12, label="longer than any training formula")
    ax.set(xlabel="number of operators", ylabel="test accuracy (%)",
           title="Logical inference, d 128, 4 layers, 11,436 updates, one seed")
    grid_and_legend(ax)
    return fig


def fasttrees_lstm_logic(results, plt):
    """Test accuracy per operator count of the recurrent cells (``logic_lstm.sh`` rows; a line per seed), the
    runs of one embedding initialisation and each model at its learning rate, chosen as the table and the claim
    of ``summarize_lstm.py`` choose them."""
    summary = load_script(os.path.join(FASTTREES_DIR, "summarize_lstm.py"))
    rows = summary.load(os.path.join(FASTTREES_DIR, "results", "logic_lstm.json"))
    if not rows:
        raise FileNotFoundError(2, "no rows", os.path.join(FASTTREES_DIR, "results", "logic_lstm.json"))
    init, rows = next(iter(summary.by_init(summary.at_chosen_lr(rows)[1]).items()))
    styles = {"onlstm_classifier_logic": "s-", "fasttrees_lstm_classifier_logic": "o-",
              "fasttrees_lstm_classifier_conv_logic": "^-", "lstm_classifier_logic": "d--"}
    ops = list(range(1, 13))
    fig, ax = plt.subplots(figsize=(9.5, 4))
    for color, (arch, style) in enumerate(styles.items()):
        for i, r in enumerate(sorted((r for r in rows if r["arch"] == arch), key=lambda r: r["seed"])):
            ax.plot(ops, [r["accuracy_by_ops"][str(k)] for k in ops], style, color=f"C{color}",
                    alpha=1.0 if i == 0 else 0.55, label=f"{summary.NAMES[arch]}, seed {r['seed']}")
    majority = read_csv(os.path.join(results, "fasttrees_logic.csv"))  # the same test sets
    ax.plot(ops, [num(r["majority"]) for r in majority], "k:", label="majority class")
    ax.axvspan(6.5, 12.5, color="grey", alpha=0.12, label="longer than any training formula")
    size = rows[0]["size_flags"].replace("--hidden-size", "hidden").replace("--", "")
    ax.set(xlabel="number of operators", ylabel="test accuracy (%)",
           title=f"Logical inference, siamese recurrent encoders,\nembedding 128 "
                 f"{summary.INIT_NAMES.get(init, init)}, {size}".strip(", "))
    grid_and_legend(ax, legend={"loc": "center left", "bbox_to_anchor": (1.01, 0.5)})  # seed-2 lines run low
    fig.tight_layout()
    return fig


def star_masked_sum(results, plt):
    """Test MSE of the masked-summation task by sequence length n (``converged.sh masked_sum`` rows; each model
    at its learning rate chosen on dev MSE): each seed a dot, the mean a line; runs capped by ``--max-epoch``
    drawn hollow; the LSTM trained for a fixed 50 epochs without early stopping
    (``masked_sum_no_early_stop.json``) dashed."""
    from user_dir.result_rows import chosen_on_dev
    from user_dir.tasks.masked_summation import mean_predictor_mse

    with open(os.path.join(STAR_RESULTS, "converged.json"), encoding="utf-8") as f:
        rows = [r for r in json.load(f) if r["task"] == "masked_sum"]
    _, rows = chosen_on_dev(rows, group=lambda r: (r["n"], r["model"]), setting=lambda r: r["lr"],
                            dev=lambda r: r["best_dev"], higher_is_better=False)
    fig, ax = plt.subplots(figsize=(10, 4))
    for model, (label, color) in {"star": ("Star-Transformer", "C0"), "transformer": ("Transformer", "C1"),
                                  "lstm": ("LSTM", "C2"), "bilstm": ("BiLSTM", "C3")}.items():
        runs = [r for r in rows if r["model"] == model]
        if not runs:
            continue
        ns = sorted({r["n"] for r in runs})
        means = [statistics.mean(r["test"] for r in runs if r["n"] == n) for n in ns]
        ax.plot(ns, means, "-", color=color, label=f"{label} (mean over seeds)")
        for r in runs:
            ax.plot(r["n"], r["test"], "o", color=color, mfc=color if r["converged"] else "none")
    no_stop, runs = os.path.join(STAR_RESULTS, "masked_sum_no_early_stop.json"), []
    if os.path.exists(no_stop):
        with open(no_stop, encoding="utf-8") as f:
            runs = [r for r in json.load(f) if (r["model"], r["seed"]) == ("lstm", 1)]
        runs.sort(key=lambda r: r["n"])
        ax.plot([r["n"] for r in runs], [r["test"] for r in runs], "--", color="C2", marker="o", mfc="none",
                label="LSTM, 50 epochs without early stopping (seed 1)")
    ax.axhline(mean_predictor_mse(10), color="grey", ls=":", label="predicting the mean (variance of a sum of 10 U(0, 1))")
    ax.set_xscale("log")
    lengths = sorted({r["n"] for r in rows} | {r["n"] for r in runs})
    ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.minorticks_off()
    ax.set(xlabel="sequence length n", ylabel="test MSE", title="Masked summation (k = 10), d 100, 2 layers")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1))
    return fig


def mtn_metrics(results, plt):
    rows = read_csv(os.path.join(results, "mtn_metrics.csv"))
    runs = list(dict.fromkeys(r["run"] for r in rows))
    metrics = (("bleu", "BLEU"), ("em1", "EM@1"), ("em5", "EM@5"), ("mrr", "MRR@5"))
    fig, axes = plt.subplots(1, len(metrics), figsize=(14, 3.8))
    for ax, (key, name) in zip(axes, metrics):
        for i, model in enumerate(("mtn", "transformer")):
            vals = [num(next(r[key] for r in rows if r["run"] == run and r["model"] == model)) for run in runs]
            ax.bar([j + (i - 0.5) * 0.4 for j in range(len(runs))], vals, 0.4, label=model)
        ax.set_xticks(range(len(runs)), runs, rotation=30, ha="right", fontsize=7)
        ax.set_title(name)
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("MTN vs the flat transformer, synthetic sessions, equal parameters and updates (%)", fontsize=10)
    return fig


FIGURES = {"star_scaling": star_scaling, "txl_eval_speedup": txl_eval_speedup, "txl_ptb": txl_ptb,
           "capsule_bleu_seeds": capsule_bleu_seeds, "multi30k_converged": multi30k_converged,
           "capsule_routing": capsule_routing, "capsule_speed": capsule_speed,
           "fasttrees_logic": fasttrees_logic, "fasttrees_tree": fasttrees_tree, "mtn_metrics": mtn_metrics,
           "star_masked_sum": star_masked_sum, "fasttrees_lstm_logic": fasttrees_lstm_logic}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", default=os.path.join(HERE, "results"))
    p.add_argument("--out", default=os.path.join(ROOT, "docs", "figures"))
    p.add_argument("--only", nargs="+", choices=sorted(FIGURES), help="draw only these figures")
    a = p.parse_args(argv)
    import matplotlib

    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # importing fairseq may leave the root at DEBUG
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(a.out, exist_ok=True)
    for name in a.only or FIGURES:
        try:
            fig = FIGURES[name](a.results, plt)
        except FileNotFoundError as e:
            sys.exit(f"make_figures: {name}: results file not found: {e.filename}")
        fig.tight_layout()
        path = os.path.join(a.out, name + ".png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
