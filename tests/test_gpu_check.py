"""The GPU mixed-precision check's commands parse and run (on CPU, tiny models, 3 updates, then beam search)."""
import json

from tests.helpers.cli import script


def test_gpu_check_smoke_runs_every_arch_and_mode(tmp_path):
    out = tmp_path / "results.json"
    proc = script("benchmarks/gpu/check.py", "--smoke", "--rotate-modes", "--work", tmp_path / "work",
                  "--out", out, check=False, timeout=1200)
    results = json.loads(out.read_text())["runs"]
    table = proc.stdout + proc.stderr[-3000:]
    assert {r["arch"] for r in results} == {"transformer", "capsule_transformer", "star_transformer_nmt",
                                           "fasttrees_transformer", "star_transformer", "transformer_xl_lm",
                                           "mtn"}, table
    assert {r["mode"] for r in results} == {"fp16", "amp", "bf16"}, table
    translation = {"transformer", "capsule_transformer", "star_transformer_nmt", "fasttrees_transformer"}
    for r in results:
        assert r["ok"] and not r["nan_or_inf_loss"], (r, table)
        assert r["final_loss"] is not None and r["final_loss"] > 0, (r, table)
        if r["arch"] in translation:  # then decoded by fairseq-generate --beam 5 from the saved checkpoint
            assert r["gen_ok"] and r["gen_sentences_per_s"] > 0, (r, table)
    assert proc.returncode == 0, table


def test_gpu_check_names_a_bad_arch(tmp_path):
    proc = script("benchmarks/gpu/check.py", "--smoke", "--archs", "nonesuch", "--work", tmp_path, check=False)
    assert proc.returncode == 2 and "--archs: unknown architecture 'nonesuch'" in proc.stderr
