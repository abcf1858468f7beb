"""Training resumed after an interruption equals an uninterrupted run, for every architecture and its task,
through the real ``fairseq-train``.

Run A trains ``N`` updates in one go.  Run B is killed with SIGKILL right after the mid-epoch checkpoint of
update ``K`` (``--save-interval-updates K``: no cleanup, no final save; ``tests/helpers/train_then_kill.py``)
and is then started again with the same command.  After ``K`` the per-update training losses, the final
parameters, the counters fairseq logs (epoch, update) and the checkpoint chosen as best must equal run A's.
Dropout is on in every model, so the random stream has to come back too (fairseq seeds each update with
``--seed`` + update number).  ``transformer_xl_lm`` keeps its training memory between batches: ``bptt_lm``
saves it with the checkpoint, and its test fails if it is not restored.
"""
import json
import os
import re
import sys

import pytest
import torch

from tests.helpers import cli

K, N = 3, 6  # interrupted after update K, trained to update N; each epoch is longer than N batches
COMMON = ["--max-update", N, "--save-interval-updates", K, "--log-format", "json", "--log-interval", 1,
          "--no-progress-bar", "--cpu", "--num-workers", 0, "--seed", 1, "--no-epoch-checkpoints",
          "--optimizer", "adam", "--lr", "3e-3"]
TRANSLATION = ["--task", "translation", "--batch-size", 16, "--dropout", 0.2, *cli.TINY_TRANSLATION_ARGS]
BPTT = ["--task", "bptt_lm", "--tokens-per-sample", 16, "--batch-size", 4]
STAR = ["--encoder-embed-dim", 16, "--encoder-attention-heads", 2, "--encoder-layers", 1]
# dropout, locked dropout and weight drop all on: their masks come from the restored random stream
ORDERED_NEURONS = ["--embed-dim", 16, "--hidden-size", 20, "--num-layers", 2, "--chunk-size", 4, "--dropout", 0.2,
                   "--hidden-dropout", 0.2, "--input-dropout", 0.2, "--embed-dropout", 0.1, "--weight-drop", 0.2]


@pytest.fixture(scope="module")
def sst_bin(tmp_path_factory):
    """SST-format sentences (LABEL words) through preprocess/sst_prepare.py."""
    return cli.make_toy_sst_data(tmp_path_factory.mktemp("resume_sst"))


@pytest.fixture(scope="module")
def sessions_bin(tmp_path_factory):
    """Synthetic query sessions through preprocess/query_suggestion_prepare.py."""
    work = tmp_path_factory.mktemp("resume_mtn")
    cli.script("preprocess/synthetic_sessions.py", "--out", work / "ses", "--train", 200, "--valid", 15,
               "--test", 15)
    cli.script("preprocess/query_suggestion_prepare.py", "--ses-dir", work / "ses", "--dest", work / "bin",
               "--max-query-length", 12)
    return work / "bin"


# name -> (data fixture, fairseq-train flags)
CASES = {
    "capsule_transformer": ("toy_translation_bin", [*TRANSLATION, "--arch", "capsule_transformer",
                                                    "--routing-iters", 2]),
    "fasttrees_transformer": ("toy_translation_bin", [*TRANSLATION, "--arch", "fasttrees_transformer",
                                                      "--chunk-size", 8]),
    "star_transformer_nmt": ("toy_translation_bin", [*TRANSLATION, "--arch", "star_transformer_nmt"]),
    "star_transformer": ("sst_bin", ["--task", "sentence_prediction", "--criterion", "sentence_prediction",
                                     "--num-classes", 5, "--batch-size", 8, "--arch", "star_transformer", *STAR,
                                     "--dropout", 0.2]),
    "transformer_xl_lm": ("toy_lm_bin", [*BPTT, "--arch", "transformer_xl_lm", "--n-layer", 1, "--d-model", 16,
                                         "--n-head", 2, "--d-head", 8, "--d-inner", 32, "--mem-len", 16,
                                         "--dropout", 0.2, "--init-std", 0.5]),
    "fasttrees_transformer_lm": ("toy_lm_bin", [*BPTT, "--arch", "fasttrees_transformer_lm", "--decoder-layers", 1,
                                                "--decoder-embed-dim", 16, "--decoder-ffn-embed-dim", 32,
                                                "--decoder-attention-heads", 2, "--chunk-size", 4, "--dropout", 0.2]),
    "fasttrees_lstm_lm": ("toy_lm_bin", [*BPTT, "--arch", "fasttrees_lstm_lm", *ORDERED_NEURONS, "--master", "conv"]),
    "onlstm_classifier": ("sst_bin", ["--task", "sentence_prediction", "--criterion", "sentence_prediction",
                                      "--num-classes", 5, "--batch-size", 8, "--arch", "onlstm_classifier",
                                      *ORDERED_NEURONS]),
    "mtn": ("sessions_bin", ["--task", "query_suggestion", "--arch", "mtn_tiny", "--batch-size", 8,
                             "--max-query-length", 12, "--dropout", 0.2]),
}


def train(data, save_dir, flags, kill_at=None, max_update=None):
    """fairseq-train (killed after the checkpoint of update ``kill_at``); returns its log."""
    args = [data, *flags, *COMMON, "--save-dir", save_dir, "--user-dir", cli.USER_DIR]
    if max_update is not None:
        args += ["--max-update", max_update]
    if kill_at is None:
        proc = cli.run([cli.tool("fairseq-train"), *args])
    else:
        proc = cli.run([sys.executable, os.path.join(cli.ROOT, "tests/helpers/train_then_kill.py"), *args],
                       check=False, env={"KILL_AT_UPDATE": str(kill_at)})
        assert proc.returncode == -9, f"expected SIGKILL after update {kill_at}:\n{proc.stderr[-3000:]}"
    return proc.stdout + proc.stderr


def updates(log):
    """{update: (epoch, training loss)} from fairseq's per-update json log."""
    out = {}
    for line in re.findall(r"train_inner(?: \| |:)(\{.*\})", log):
        entry = json.loads(line)
        out[int(entry["num_updates"])] = (int(entry["epoch"]), float(entry["loss"]))
    return out


def load(path):
    return torch.load(path, map_location="cpu", weights_only=False)


def assert_resume_equals_uninterrupted(data, tmp_path, flags, interrupt):
    whole = updates(train(data, tmp_path / "a", flags))
    assert sorted(whole) == list(range(1, N + 1))
    first = interrupt(tmp_path / "b")
    assert os.path.exists(tmp_path / "b" / "checkpoint_last.pt")
    resumed_log = train(data, tmp_path / "b", flags)
    assert re.search(rf"Loaded checkpoint \S+checkpoint_last\.pt \(epoch \d+ @ {K} updates\)", resumed_log), \
        resumed_log[-3000:]
    resumed = updates(resumed_log)
    # the counters continue: updates K+1..N, with the uninterrupted run's epoch numbers
    assert sorted(resumed) == list(range(K + 1, N + 1)), resumed_log[-3000:]
    assert {u: first[u] for u in range(1, K + 1)} == {u: whole[u] for u in range(1, K + 1)}
    for u in range(K + 1, N + 1):
        assert resumed[u][0] == whole[u][0], f"epoch at update {u}"
        assert resumed[u][1] == pytest.approx(whole[u][1], abs=2e-3), f"training loss at update {u}"
    a, b = load(tmp_path / "a" / "checkpoint_last.pt"), load(tmp_path / "b" / "checkpoint_last.pt")
    assert a["model"].keys() == b["model"].keys()
    for name in a["model"]:
        torch.testing.assert_close(b["model"][name], a["model"][name], rtol=1e-5, atol=1e-6, msg=name)
    assert b["extra_state"]["best"] == pytest.approx(a["extra_state"]["best"])
    best_a, best_b = load(tmp_path / "a" / "checkpoint_best.pt"), load(tmp_path / "b" / "checkpoint_best.pt")
    assert best_b["optimizer_history"][-1]["num_updates"] == best_a["optimizer_history"][-1]["num_updates"]


@pytest.mark.parametrize("arch", sorted(CASES))
def test_resume_after_hard_kill_equals_uninterrupted(arch, request, tmp_path):
    fixture, flags = CASES[arch]
    data = request.getfixturevalue(fixture)
    assert_resume_equals_uninterrupted(data, tmp_path, flags, lambda save: updates(train(data, save, flags,
                                                                                        kill_at=K)))


def test_resume_after_a_run_that_stopped_at_max_update(toy_translation_bin, tmp_path):
    """A run that ended at ``--max-update K`` mid-epoch and is continued with a larger ``--max-update``."""
    _, flags = CASES["capsule_transformer"]
    assert_resume_equals_uninterrupted(toy_translation_bin, tmp_path, flags,
                                       lambda save: updates(train(toy_translation_bin, save, flags, max_update=K)))


def test_resume_bptt_lm_scores_every_token_once(toy_lm_bin):
    """bptt_lm's iterator restored mid-epoch yields the remaining batches: no segment skipped or repeated."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    parser = options.get_training_parser()
    argv = [toy_lm_bin, *BPTT, "--arch", "transformer_xl_lm", "--user-dir", cli.USER_DIR]
    args = options.parse_args_and_arch(parser, [str(a) for a in argv])
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    task.load_dataset("train")
    dataset = task.dataset("train")

    def iterator():
        return task.get_batch_iterator(dataset, max_sentences=4)

    itr = iterator()
    epoch = itr.next_epoch_itr(shuffle=False)
    seen = [next(epoch)["net_input"]["stream_pos"] for _ in range(K)]
    state = itr.state_dict()
    resumed = iterator()
    resumed.load_state_dict(state)
    seen += [batch["net_input"]["stream_pos"] for batch in resumed.next_epoch_itr(shuffle=False)]
    assert seen == list(range(len(dataset)))
    targets = sum(int(dataset[i]["target"].ne(task.dictionary.pad()).sum()) for i in seen)
    assert targets == dataset.tokens.numel() - 1  # every token of the split a target exactly once


def test_patience_counts_on_across_a_restart(toy_translation_bin, tmp_path):
    """``--patience`` counts the validations before an interruption too: a run stopped after epoch 2 and
    started again stops by patience at the same epoch as an uninterrupted run (fairseq alone starts counting
    again, and stops ``2`` epochs later).  Valid loss is the metric maximised, so it does not improve after
    epoch 1 while training lowers it."""
    _, flags = CASES["capsule_transformer"]
    flags = [*flags, "--patience", 3, "--maximize-best-checkpoint-metric", "--log-format", "json",
             "--no-progress-bar", "--cpu", "--num-workers", 0, "--seed", 1, "--no-epoch-checkpoints",
             "--optimizer", "adam", "--lr", "3e-4", "--user-dir", cli.USER_DIR]

    def run(save_dir, max_epoch):
        proc = cli.run([cli.tool("fairseq-train"), toy_translation_bin, *flags, "--max-epoch", max_epoch,
                        "--save-dir", save_dir])
        log = proc.stdout + proc.stderr
        return log, [int(json.loads(entry)["epoch"]) for entry in re.findall(r"\| valid \| (\{.*\})", log)]

    whole, whole_epochs = run(tmp_path / "a", 12)
    assert "early stop since valid performance hasn't improved for last 3 runs" in whole, whole[-3000:]
    assert whole_epochs[-1] < 12
    _, first_epochs = run(tmp_path / "b", 2)
    assert first_epochs == [1, 2]
    resumed, resumed_epochs = run(tmp_path / "b", 12)
    assert "early stop since valid performance hasn't improved for last 3 runs" in resumed, resumed[-3000:]
    assert first_epochs + resumed_epochs == whole_epochs
