"""The Transformer-XL evaluation speed-up benchmark (the paper's Table 9): a tiny run of ``bench_speed.py eval``
writes its JSON, and ``summarize_eval.py`` turns the runs into the table and the ``txl_eval_speedup_3800`` claim."""
import json

from tests.helpers.cli import load_script


def test_bench_speed_eval_writes_its_results(tmp_path, monkeypatch):
    bench = load_script("benchmarks/transformer_xl/bench_speed.py")
    out = tmp_path / "eval.json"
    monkeypatch.setattr("sys.argv", ["bench_speed.py", "eval", "--vocab", "24", "--lengths", "12", "--tgt-len", "4",
                                     "--repeats", "2", "--vanilla-tokens", "1", "--txl-segments", "1", "--out", str(out)])
    bench.main()
    result = json.loads(out.read_text())
    (row,) = result["results"]
    assert row["attention_length"] == 12 and row["tgt_len"] == 4 and len(row["paired_speedups"]) == 2
    assert row["speedup_of_medians"] > 0 and result["setting"]["size"] == "ptb_small"
    assert "--tgt-len 4" in result["command"]


def test_summary_table_and_claim_take_the_best_segment_length(tmp_path, capsys):
    def run(tgt_len, speedups):
        rows = [{"attention_length": length, "tgt_len": tgt_len, "speedup_of_medians": s, "paired_speedups": [s - 10, s, s + 5]}
                for length, s in speedups.items()]
        setting = dict(layers=12, dim=512, heads=8, head_dim=64, ffn=2048, size="enwik8_base", vocab=204, repeats=3)
        (tmp_path / f"eval_speedup_enwik8_base_t{tgt_len}.json").write_text(
            json.dumps({"setting": setting, "command": f"bench_speed.py eval --tgt-len {tgt_len}", "results": rows}))

    run(128, {800: 400.0, 3800: 1500.0})
    run(256, {800: 450.0, 3800: 1900.0})
    claims = tmp_path / "claims.json"
    load_script("benchmarks/transformer_xl/summarize_eval.py").main(["--results", str(tmp_path), "--claims", str(claims)])
    out = capsys.readouterr().out
    assert "| 3,800 | 1874x | 1500x (1490–1505) | 1900x (1890–1905) |" in out
    (claim,) = json.loads(claims.read_text())
    assert claim["id"] == "txl_eval_speedup_3800" and claim["ours"] == 1900.0 and claim["paper_value"] == 1874
    assert claim["by_segment_length"] == {"128": 1500.0, "256": 1900.0} and "--tgt-len 256" in claim["command"]
