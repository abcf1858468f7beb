"""The Multi30k convergence recipe on tiny data: ``benchmarks/gpu/multi30k_converged.sh`` (run with
``DEVICE=cpu``) drives ``examples/translation/multi30k_converged.sh`` for two configurations at once, each
training to a tiny ``MAX_UPDATE``, averaging its last epoch checkpoints and scoring them with sacreBLEU; the
rows land in one JSON.  Also: the averaging script, and what makes a row (converged or not, interrupted)."""
import json
import os
import re
import subprocess

import pytest
import torch

from tests.helpers import cli

RUNS = {"transformer_s1": ("transformer", None), "capsule_transformer_enc_self_s1": ("capsule_transformer", "enc_self")}


@pytest.fixture(scope="module")
def converged(toy_translation_bin, tmp_path_factory):
    root = tmp_path_factory.mktemp("m30k_converged")
    results = root / "rows.json"
    env = {"DEVICE": "cpu", "CONFIGS": "transformer capsule_transformer:enc_self", "SEEDS": "1",
           "MAX_UPDATE": "8", "AVERAGE": "2", "MAX_TOKENS": "2500", "RESULTS": str(results),
           "PYTHON": cli.tool("python")}
    cmd = ["bash", os.path.join(cli.ROOT, "benchmarks/gpu/multi30k_converged.sh"), toy_translation_bin, root / "w"]
    proc = cli.run(cmd, env=env, check=False)
    outs = {name: open(root / "w" / f"{name}.out").read() for name in RUNS if (root / "w" / f"{name}.out").exists()}
    assert proc.returncode == 0, (proc.stderr[-2000:], {k: v[-3000:] for k, v in outs.items()})
    return root, results, cmd, env


def test_converged_recipe_writes_one_row_per_run(converged, toy_translation_bin):
    root, results, _, _ = converged
    rows = json.load(open(results))
    assert [(r["arch"], r["routing"], r["seed"], r["device"]) for r in rows] == [
        ("capsule_transformer", "enc_self", 1, "cpu"), ("transformer", None, 1, "cpu")]
    for row in rows:
        assert row["updates"] == 8 and row["converged"] is False  # stopped by the cap, not by --patience
        assert 0 <= row["test_bleu"] <= 100 and 0 <= row["valid_bleu"] <= 100
        assert row["command"].startswith(f"examples/translation/multi30k_converged.sh {row['arch']} 1")
    hyps = open(root / "w" / "transformer_s1" / "test.hyp").read().splitlines()
    assert len(hyps) == cli.num_lines(os.path.join(os.path.dirname(toy_translation_bin), "raw", "test.de"))


def test_converged_recipe_does_not_train_a_finished_run_again(converged):
    root, results, cmd, env = converged
    log = root / "w" / "transformer_s1" / "train.log"
    before = open(log).read()
    proc = cli.run(cmd, env=dict(env, CONFIGS="transformer"))
    assert open(log).read() == before
    assert len(json.load(open(results))) == 2, proc.stderr


def test_average_checkpoints_is_the_mean_of_the_last_epochs(converged):
    root, _, _, _ = converged
    ckpts = os.path.join(root, "w", "transformer_s1", "checkpoints")
    epochs = sorted(int(m.group(1)) for m in map(re.compile(r"checkpoint(\d+)\.pt").fullmatch, os.listdir(ckpts)) if m)
    assert len(epochs) == 2
    states = [torch.load(os.path.join(ckpts, f"checkpoint{e}.pt"), map_location="cpu", weights_only=False)
              for e in epochs]
    averaged = torch.load(os.path.join(root, "w", "transformer_s1", "averaged.pt"), map_location="cpu",
                          weights_only=False)
    assert averaged["optimizer_history"][-1]["num_updates"] == states[-1]["optimizer_history"][-1]["num_updates"]
    differs = 0
    for name, value in averaged["model"].items():
        a, b = states[0]["model"][name], states[1]["model"][name]
        torch.testing.assert_close(value, ((a.double() + b.double()) / 2).to(a.dtype), msg=name)
        differs += not torch.equal(a, b)
    assert differs > 0  # the two epochs' parameters differ, so the mean is not one of them


def test_average_checkpoints_refuses_different_models(converged, tmp_path):
    root, _, _, _ = converged
    a = os.path.join(root, "w", "transformer_s1", "averaged.pt")
    b = os.path.join(root, "w", "capsule_transformer_enc_self_s1", "averaged.pt")
    proc = cli.script("examples/translation/average_checkpoints.py", "--inputs", a, b, "--output",
                      tmp_path / "x.pt", check=False)
    assert proc.returncode != 0 and "hold different parameters" in proc.stderr, proc.stderr[-2000:]
    assert not os.path.exists(tmp_path / "x.pt")


LOG = """2026-01-01 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 8.661 | nll_loss 7.9 | num_updates 128
2026-01-01 | INFO | valid | epoch 002 | valid on 'valid' subset | loss 7.100 | nll_loss 6.2 | num_updates 256
2026-01-01 | INFO | valid | epoch 003 | valid on 'valid' subset | loss 7.300 | nll_loss 6.3 | num_updates 384
"""


def rows_script(work, results, max_update):
    return cli.script("benchmarks/translation/converged_rows.py", "--work", work, "--arch", "transformer",
                      "--seed", 1, "--valid-bleu", 30.5, "--test-bleu", 35.25, "--max-update", max_update,
                      "--command", "x", "--results", results, check=False)


def test_converged_row_says_whether_patience_stopped_it(tmp_path):
    with open(tmp_path / "train.log", "w") as f:
        f.write(LOG + "early stop since valid performance hasn't improved for last 5 runs\n")
    proc = rows_script(tmp_path, tmp_path / "rows.json", 8000)
    assert proc.returncode == 0, proc.stderr
    (row,) = json.load(open(tmp_path / "rows.json"))
    assert (row["updates"], row["epochs"], row["converged"], row["best_valid_loss"]) == (384, 3, True, 7.1)


def test_converged_row_refuses_an_interrupted_run(tmp_path):
    """A log that ends neither by --patience nor at --max-update is a run cut off: no row."""
    with open(tmp_path / "train.log", "w") as f:
        f.write(LOG)
    proc = rows_script(tmp_path, tmp_path / "rows.json", 8000)
    assert proc.returncode != 0 and "interrupted run" in proc.stderr
    assert not os.path.exists(tmp_path / "rows.json")


def _row(arch, routing, seed, bleu, converged=True):
    return {"arch": arch, "routing": routing, "seed": seed, "updates": 3000 + seed, "epochs": 30 + seed,
            "converged": converged, "best_valid_loss": 4.0 + seed / 100, "test_bleu": bleu, "valid_bleu": bleu + 0.5,
            "train_seconds": 3600 * seed, "device": "cpu"}


def test_summary_pairs_converged_seeds_and_leaves_capped_runs_out(tmp_path):
    rows = [_row("transformer", None, s, b) for s, b in ((1, 35.0), (2, 36.0), (3, 35.5))]
    rows += [_row("capsule_transformer", "enc_self", s, b) for s, b in ((1, 35.6), (2, 36.7), (3, 36.1))]
    rows += [_row("fasttrees_transformer", None, 1, 34.0), _row("fasttrees_transformer", None, 2, 37.0),
             _row("fasttrees_transformer", None, 3, 10.0, converged=False)]
    results, claims = tmp_path / "rows.json", tmp_path / "claims.json"
    results.write_text(json.dumps(rows))
    claims.write_text(json.dumps([{"id": "other_row"}]))
    out = cli.script("benchmarks/translation/summarize_converged.py", "--results", results, "--claims", claims).stdout
    summary_table, run_table = out.split("\n\n")[:2]
    table = {line.split(" | ")[0].strip("| "): line for line in summary_table.splitlines() if line.startswith("| ")}
    assert "35.50 ± 0.29" in table["transformer"]
    # capsule ahead by +0.63 in all three seeds, with little spread: the paired t-test says ahead (the exact
    # sign-flip p of 3 seeds cannot fall below 2/8)
    assert "+0.633 ± 0.033 (t-test p = 0.003, sign-flip p = 0.25, ahead in 3 of 3) | ahead |" in \
        table["capsule_transformer (enc_self)"]
    assert "1: 34.00, 2: 37.00 |" in table["fasttrees_transformer"]  # the capped seed 3 is not in the table
    assert "fasttrees_transformer seed 3 (10000" not in out and "fasttrees_transformer seed 3 (3003 updates)" in out
    # one row per converged run, in the summary's order; the capped run is not among them
    runs = [line for line in run_table.splitlines() if line.startswith("| ")][1:]
    assert len(runs) == 8 and runs[0] == "| transformer | 1 | 31 | 3001 | 4.010 | 35.50 | 35.00 | 1.0 |"
    assert runs[-1] == "| fasttrees_transformer | 2 | 32 | 3002 | 4.020 | 37.50 | 37.00 | 2.0 |"
    written = {r["id"]: r for r in json.load(open(claims))}
    assert set(written) == {"other_row", "capsule_multi30k", "fasttrees_multi30k"}
    assert written["fasttrees_multi30k"]["seeds"] == [1, 2] and written["fasttrees_multi30k"]["ours"] == [34.0, 37.0]
    assert written["capsule_multi30k"]["baseline"] == [35.0, 36.0, 35.5]


def test_gpu_table_stops_at_its_deadline_and_resumes(toy_translation_bin, tmp_path):
    """DEADLINE stops every run still training (exit status 3, no row, a message saying how to resume); the
    same command then resumes the run from its checkpoint_last.pt and finishes it."""
    results = tmp_path / "rows.json"
    env = {"DEVICE": "cpu", "CONFIGS": "transformer", "SEEDS": "1", "MAX_UPDATE": "100000", "AVERAGE": "1",
           "MAX_TOKENS": "2500", "RESULTS": str(results), "PYTHON": cli.tool("python"), "DEADLINE": "25"}
    cmd = ["bash", os.path.join(cli.ROOT, "benchmarks/gpu/multi30k_converged.sh"), toy_translation_bin, tmp_path / "w"]
    proc = cli.run(cmd, env=env, check=False)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "transformer_s1 stopped at the DEADLINE; run the same command to resume it" in proc.stderr
    assert not results.exists() and not (tmp_path / "w" / "transformer_s1" / "train.done").exists()
    left = subprocess.run(["pgrep", "-f", str(tmp_path / "w")], capture_output=True, text=True).stdout
    assert not left, f"processes of the stopped run still running: {left}"
    first = open(tmp_path / "w" / "transformer_s1" / "train.log").read()
    saved = [int(u) for u in re.findall(r"valid on 'valid' subset .*?\| num_updates (\d+)", first)]
    assert saved, first[-2000:]  # at least one epoch checkpoint to resume from
    cap = saved[-1] + 3
    proc = cli.run(cmd, env=dict(env, DEADLINE="", MAX_UPDATE=str(cap)), check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    log = open(tmp_path / "w" / "transformer_s1" / "train.log").read()
    assert re.search(r"Loaded checkpoint \S+checkpoint_last\.pt \(epoch \d+ @ \d+ updates\)", log[len(first):])
    (row,) = json.load(open(results))
    assert row["updates"] == cap
