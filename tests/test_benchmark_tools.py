"""The benchmark scripts' own logic where a figure in BENCHMARKS.md depends on it."""
import argparse
import json
import os

import pytest
import torch
from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

from tests.helpers.cli import ROOT, load_script
from user_dir import timing


def test_flop_count_includes_the_fused_cpu_attention_of_fairseqs_transformer():
    """fairseq's self-attention runs torch's fused CPU attention, which FlopCounterMode leaves at 0: the
    capsule/vanilla matrix-product ratio of flops.py would be inflated without its own formula."""
    flops = load_script("benchmarks/capsule_transformer/flops.py")
    q = torch.randn(2, 4, 50, 16, requires_grad=True)

    def attention():
        torch.nn.functional.scaled_dot_product_attention(q, q, q).sum().backward()

    shape = (2, 4, 50, 16)
    expected = sdpa_flop_count(shape, shape, shape) + sdpa_backward_flop_count(shape, shape, shape, shape)
    assert flops.counted(attention) == expected > 0


def test_product_timer_times_only_matrix_products_fairseqs_fused_attention_included():
    """flops.py --time-products: the time inside products (mm, bmm, addmm, baddbmm and the fused CPU attention
    of fairseq's self-attention, forward and backward), not the element-wise work around them."""
    flops = load_script("benchmarks/capsule_transformer/flops.py")
    a = torch.randn(64, 64)
    q = torch.randn(1, 2, 20, 8, requires_grad=True)
    with flops.ProductTimer() as timer:
        x = torch.mm(a, a)
        for _ in range(50):  # element-wise work: not counted
            x = (x * 0.5).tanh()
        torch.nn.functional.scaled_dot_product_attention(q, q, q).sum().backward()
    assert timer.calls == 3  # the mm, the attention and its backward
    assert timer.seconds > 0


def test_product_timing_refuses_a_gpu_device(monkeypatch, capsys):
    """The product timer reads the CPU clock, which a GPU's asynchronous kernels would escape."""
    flops = load_script("benchmarks/capsule_transformer/flops.py")
    monkeypatch.setattr("sys.argv", ["flops.py", "--device", "cuda", "--time-products", "3"])
    with pytest.raises(SystemExit) as exit_info:
        flops.main()
    assert exit_info.value.code == 2
    assert "--time-products times products by the CPU clock: it needs --device cpu, not cuda" in capsys.readouterr().err


def test_long_decoding_counts_the_routing_state(monkeypatch):
    """long_decoding.py's state figure: past twice the head width a routed decoder module of the fast
    implementation keeps, per beam row, q and u rows, in-block logits, row counts, the vertical H×H sum and
    the M×M Gram."""
    from tests.helpers.models import build
    from tests.test_capsule_transformer import TINY  # D = 32, 4 heads

    long_decoding = load_script("benchmarks/capsule_transformer/long_decoding.py")
    model, d = build("capsule_transformer", TINY, seed=0)
    steps, width, heads = 100, 32, 4
    _, state = long_decoding.speed.decode_step_times(model, d, rows=10, beam=5, steps=steps)
    linear = 2 * steps * width + steps * heads * 16 + steps + heads * heads  # q, u, in-block logits, counts, vertical
    assert long_decoding.routing_state_floats(state) == linear + steps * steps  # + the Gram


SPEED_TINY = ["--preset", "demo", "--vocab", "60", "--lengths", "8", "--tokens", "40", "--gen-tokens", "16",
              "--repeats", "1", "--decode-steps", "5,12", "--decode-rows", "10"]


def test_capsule_speed_script_runs_in_half_precision_and_writes_every_figure(tmp_path, monkeypatch):
    """speed.py end to end on a tiny model with bfloat16 parameters (the --dtype a GPU run uses): every
    training, generation and decoding figure is written, with the device and type it was measured at."""
    speed = load_script("benchmarks/capsule_transformer/speed.py")
    out = tmp_path / "speed.json"
    monkeypatch.setattr("sys.argv", ["speed.py", *SPEED_TINY, "--dtype", "bfloat16", "--out", str(out)])
    threads = torch.get_num_threads()
    try:
        speed.main()
    finally:
        torch.set_num_threads(threads)  # main() sets the thread count for its benchmark
    result = json.loads(out.read_text())
    assert (result["device"], result["dtype"]) == ("cpu", "bfloat16")
    parser = argparse.ArgumentParser()
    speed.add_model_args(parser)
    _, _, models = speed.build_models(parser, parser.parse_args(["--preset", "demo", "--dtype", "bfloat16"]))
    assert {p.dtype for m in models.values() for p in m.parameters()} == {torch.bfloat16}
    for section, keys in (("train", ["8"]), ("generate", ["8"]), ("decode", ["12", "5"])):
        assert sorted(result[section]) == keys
        for row in result[section].values():
            assert row["transformer"] > 0 and row["capsule_transformer"] > 0
            assert row["ratio"] == pytest.approx(row["capsule_transformer"] / row["transformer"])


@pytest.mark.parametrize("device, message", [("tpu", "cpu, cuda or cuda:N"), ("cuda:x", "cpu, cuda or cuda:N")]
                         + ([] if torch.cuda.is_available() else [("cuda", "torch sees no GPU here")]))
def test_capsule_speed_script_names_a_bad_device(device, message, capsys, monkeypatch):
    speed = load_script("benchmarks/capsule_transformer/speed.py")
    monkeypatch.setattr("sys.argv", ["speed.py", *SPEED_TINY, "--device", device])
    with pytest.raises(SystemExit) as exit_info:
        speed.main()
    assert exit_info.value.code == 2
    assert f"--device {device}: {message}" in capsys.readouterr().err


def test_paper_claims_rows_follow_the_schema():
    """benchmarks/results/paper_claims.json: one row per id, each with the fields a reader compares; per-seed
    lists of the same length as ``seeds``."""
    with open(os.path.join(ROOT, "benchmarks", "results", "paper_claims.json")) as f:
        rows = json.load(f)
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)), ids
    for r in rows:
        missing = {"id", "paper", "claim", "ours", "baseline", "paper_value", "seeds", "command"} - r.keys()
        assert not missing, (r["id"], missing)
        if r["seeds"] is not None:  # a per-seed comparison
            assert len(r["ours"]) == len(r["baseline"]) == len(r["seeds"]) >= 1, r["id"]
        else:  # a speed row: ours is the ratio
            assert isinstance(r["ours"], (int, float)), r["id"]


def test_lstm_speed_claim_row_is_onlstm_time_over_fasttrees():
    speed = load_script("benchmarks/fasttrees/lstm_speed.py")
    result = {"runs_seconds": {"onlstm": [2.0, 3.0, 2.2], "fasttrees_ffn": [1.0, 2.0, 2.0]}, "repeats": 3,
              "speedup_vs_onlstm": {"onlstm": 1.0, "fasttrees_ffn": 1.1},
              "timing": timing.timing_name(torch.device("cpu"), 1)}
    row = speed.claim_row(result, "cmd")
    assert (row["id"], row["ours"], row["ours_runs"], row["paper_value"]) == ("fasttrees_lstm_speed", 1.1,
                                                                             [2.0, 1.5, 1.1], 1.29)
    with pytest.raises(SystemExit):
        speed.main(["--setting", "logic", "--claims", "x.json"])
    assert "CPU time, one thread" in row["setting"]
    on_gpu = {**result, "device": "cuda:0", "timing": timing.timing_name(torch.device("cuda:0"))}
    assert "wall time on cuda:0, synchronised" in speed.claim_row(on_gpu, "cmd")["setting"]
    assert "CPU time, 4 threads" == timing.timing_name(torch.device("cpu"), 4)


def test_speed_script_rejects_a_bad_device_with_one_clear_line(capsys):
    """user_dir.timing.device_from_flag, as lstm_speed.py and capsule_transformer/speed.py call it."""
    main = load_script("benchmarks/fasttrees/lstm_speed.py").main
    with pytest.raises(SystemExit):
        main(["--device", "gpu0"])
    assert "--device gpu0: cpu, cuda or cuda:N" in capsys.readouterr().err
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit):
            main(["--device", "cuda"])
        assert "torch sees no GPU here" in capsys.readouterr().err


def test_lstm_speed_times_each_model_on_the_device():
    speed = load_script("benchmarks/fasttrees/lstm_speed.py")
    result = speed.measure("logic", repeats=1, warmup=0)
    assert result["device"] == "cpu"
    assert result["timing"] == timing.timing_name(torch.device("cpu"), torch.get_num_threads())
    assert set(result["median_seconds"]) == {"onlstm", "fasttrees_ffn", "fasttrees_linear", "fasttrees_conv"}
    assert all(t > 0 for t in result["median_seconds"].values())


def test_paired_statistics_and_verdict():
    """result_rows.paired: mean difference, s.e., the paired t-test p (Student's t, n − 1 degrees of freedom) and
    the exact sign-flip p; the verdict follows the t-test."""
    from user_dir.result_rows import paired, verdict

    p = paired([2.0, 4.0, 6.0], [1.0, 2.0, 3.0])  # differences 1, 2, 3
    assert (p["diff"], p["n"], p["ahead"]) == (2.0, 3, 3)
    assert p["se"] == pytest.approx(1 / 3 ** 0.5)
    assert p["t_p"] == pytest.approx(0.0742, abs=1e-4)  # t = 3.46 on 2 degrees of freedom
    assert p["p"] == 0.25  # 2 of the 8 sign patterns reach |sum| 6
    assert verdict(p) == "within noise"
    q = paired([10.0, 20.0], [2.0, 12.3])  # differences 8.0, 7.7: t = 52.3 on 1 degree of freedom
    assert q["t_p"] == pytest.approx(0.0122, abs=1e-3) and verdict(q) == "ahead"
    assert verdict(q, higher_is_better=False) == "behind"
    assert paired([1.0, 5.0], [2.0, 3.0], higher_is_better=False)["ahead"] == 1  # an error: lower is ahead
    assert paired([1.0, 2.0], [2.0, 3.0], higher_is_better=False)["ahead"] == 2
    assert paired([1.0, 1.0], [1.0, 1.0])["t_p"] == 1.0


def test_train_seconds_counts_every_start_of_a_resumed_run_and_no_idle_time(tmp_path):
    """The result rows' training time comes from the fairseq-train log: a killed start counts up to its last
    logged step, a later start from its configuration line, and neither the idle gap between them nor the
    later start's import warnings count."""
    from user_dir.result_rows import train_seconds

    log = tmp_path / "train.log"
    log.write_text(
        "2026-01-01 10:00:00 | INFO | fairseq.tasks.text_to_speech | Please install tensorboardX\n"
        "/site-packages/hydra/compose.py:56: UserWarning:\n"
        "2026-01-01 10:00:02 | INFO | fairseq_cli.train | {'_name': None, 'common': {}}\n"
        "2026-01-01 10:00:10 | INFO | fairseq.trainer | begin training epoch 1\n"
        "2026-01-01 10:01:42 | INFO | train_inner | epoch 001:    100 / 954 loss=0.9\n"  # killed after this line
        "2026-01-01 11:00:00 | INFO | fairseq.tasks.text_to_speech | Please install tensorboardX\n"
        "2026-01-01 11:00:03 | INFO | fairseq_cli.train | {'_name': None, 'common': {}}\n"
        "2026-01-01 11:00:04 | INFO | fairseq_cli.train | Start iterating over samples\n"
        "2026-01-01 11:05:03 | INFO | valid | epoch 002 | valid on 'valid' subset | accuracy 80.1\n"
        "2026-01-01 11:05:05 | INFO | fairseq_cli.train | done training in 301.0 seconds\n")
    assert train_seconds(str(log)) == 100 + 302
    (tmp_path / "empty.log").write_text("Traceback (most recent call last):\n")
    assert train_seconds(str(tmp_path / "empty.log")) is None
    assert train_seconds(str(tmp_path / "absent.log")) is None


def test_train_log_stopped_by_patience_only_when_the_stop_follows_the_last_validation(tmp_path):
    """A run that --patience stopped and that was then continued (a larger budget, or a minimum number of
    epochs) is not "stopped by patience" unless its last validation was followed by the stop."""
    from user_dir.result_rows import parse_train_log

    def valid(epoch, acc, updates):
        return (f"2026-01-01 10:00:00 | INFO | valid | epoch {epoch:03d} | valid on 'valid' subset | loss 1.4 | "
                f"accuracy {acc} | wps 1 | num_updates {updates} | best_accuracy {acc}\n")

    stop = "2026-01-01 10:00:00 | INFO | fairseq_cli.train | early stop since valid performance hasn't improved for last 5 runs\n"
    log = tmp_path / "train.log"
    log.write_text(valid(1, 58.4, 10) + valid(2, 59.1, 20) + stop)
    assert parse_train_log(str(log), "accuracy") == (20, 2, [58.4, 59.1], True)
    log.write_text(valid(1, 58.4, 10) + valid(2, 59.1, 20) + stop + valid(3, 70.0, 30))
    assert parse_train_log(str(log), "accuracy") == (30, 3, [58.4, 59.1, 70.0], False)
    log.write_text(log.read_text() + stop)
    assert parse_train_log(str(log), "accuracy")[3] is True
