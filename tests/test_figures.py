"""benchmarks/figures/make_figures.py: every figure drawn from the committed results; the results agree with
BENCHMARKS.md."""
import math
import os
import re
import statistics

import pytest

from tests.helpers.cli import ROOT

RESULTS = os.path.join(ROOT, "benchmarks", "figures", "results")


def _make_figures():
    from tests.helpers.cli import load_script

    return load_script("benchmarks/figures/make_figures.py")


def test_every_figure_is_drawn_from_the_results(tmp_path):
    mf = _make_figures()
    mf.main(["--out", str(tmp_path)])
    for name in mf.FIGURES:
        with open(tmp_path / f"{name}.png", "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n", name
    # every figure the script draws is committed
    committed = {p[:-4] for p in os.listdir(os.path.join(ROOT, "docs", "figures")) if p.endswith(".png")}
    assert set(mf.FIGURES) <= committed


def test_missing_results_file_is_one_clear_line(tmp_path, capsys):
    mf = _make_figures()
    with pytest.raises(SystemExit) as e:
        mf.main(["--results", str(tmp_path), "--out", str(tmp_path / "out"), "--only", "star_scaling"])
    assert "star_scaling: results file not found" in str(e.value) and "star_scaling.csv" in str(e.value)


def _benchmarks():
    with open(os.path.join(ROOT, "BENCHMARKS.md"), encoding="utf-8") as f:
        return f.read()


def _assert_page_shows(lines):
    """Every line of a summary script's table is a line of BENCHMARKS.md."""
    assert lines
    text = _benchmarks().splitlines()
    for line in lines:
        assert line in text, line


def _table_rows(markdown, header):
    """The body rows of a markdown table (``header``: how its header row starts)."""
    return [line for line in markdown.splitlines() if line.startswith("| ") and not line.startswith(header)]


def test_capsule_seed_results_match_benchmarks():
    rows = _make_figures().read_csv(os.path.join(RESULTS, "capsule_bleu_seeds.csv"))
    lines = _benchmarks().splitlines()
    table = lines[next(i for i, line in enumerate(lines) if line.startswith("| test_2016_flickr BLEU | seed 1")) + 2:]
    for line, col in zip(table, ("transformer", "capsule_default", "capsule_enc_self")):
        y = [float(r[col]) for r in rows]
        mean, se = statistics.mean(y), statistics.stdev(y) / math.sqrt(len(y))
        cells = [c.strip().strip("*") for c in line.strip("|").split("|")]
        assert [float(c) for c in cells[1:7]] == y, col
        assert cells[7] == f"{mean:.2f} ± {se:.2f}", col


def test_logic_results_match_benchmarks():
    rows = _make_figures().read_csv(os.path.join(RESULTS, "fasttrees_logic.csv"))
    text = _benchmarks()
    for label, col in (("| majority class |", "majority"), ("| `roberta` |", "roberta"), ("| **FastTrees** |", "fasttrees")):
        line = next(line for line in text.splitlines() if line.startswith(label))
        table = [float(x) for x in re.findall(r"\d+\.\d", line)][:12]
        assert table == [float(r[col]) for r in rows], col


def test_recurrent_logic_table_matches_benchmarks():
    """BENCHMARKS.md shows the recurrent cells' logic table as summarize_lstm.py prints it from the committed rows."""
    from tests.helpers.cli import load_script

    path = os.path.join(ROOT, "benchmarks", "fasttrees", "results", "logic_lstm.json")
    summary = load_script("benchmarks/fasttrees/summarize_lstm.py")
    _assert_page_shows(summary.logic_table(summary.load(path)).splitlines())


@pytest.mark.parametrize("script, results, section", [
    ("benchmarks/fasttrees/summarize_mlu.py", "benchmarks/fasttrees/results/mlu.json", None),
    ("benchmarks/star_transformer/summarize_converged.py", "benchmarks/star_transformer/results/converged.json",
     "masked summation")])
def test_converged_tables_match_benchmarks(script, results, section):
    """BENCHMARKS.md shows the MLU and masked-summation tables as their summary scripts print them from the
    committed rows (a row added to the results without updating the page fails here)."""
    import json

    from tests.helpers.cli import load_script

    with open(os.path.join(ROOT, results), encoding="utf-8") as f:
        out = load_script(script).markdown(json.load(f))
    if section:  # only that experiment's tables: "title:", then its table
        blocks = out.split("\n\n")
        out = "\n".join(table for title, table in zip(blocks, blocks[1:]) if title.startswith(section))
    _assert_page_shows(_table_rows(out, "| model"))


def test_multi30k_convergence_table_matches_benchmarks():
    """BENCHMARKS.md shows the Multi30k convergence tables as summarize_converged.py prints them from the committed
    rows (a row added to the results without updating the page fails here)."""
    import json

    from tests.helpers.cli import load_script

    with open(os.path.join(ROOT, "benchmarks", "translation", "results", "multi30k_converged.json"), encoding="utf-8") as f:
        rows = json.load(f)
    summary = load_script("benchmarks/translation/summarize_converged.py")
    _assert_page_shows(_table_rows(summary.markdown(summary.summarize(rows)), "| configuration"))


def test_bleu_axis_spans_at_least_two_points():
    """A BLEU difference of a fraction of a point must not fill the per-seed plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mf = _make_figures()
    fig, ax = plt.subplots()
    mf.bleu_per_seed(ax, [("a", "s", {1: 39.77}), ("b", "^", {1: 39.55})], "t")
    low, high = ax.get_ylim()
    assert high - low >= 2.0 and low < 39.55 and high > 39.77
    fig, ax = plt.subplots()
    mf.bleu_per_seed(ax, [("a", "s", {1: 23.0, 2: 27.0})], "t")  # a wide spread keeps matplotlib's own range
    low, high = ax.get_ylim()
    assert high - low < 5.0 and low < 23.0 and high > 27.0
    plt.close("all")
