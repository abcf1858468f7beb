"""Checkpoints under failure: a write that fails (full disk) leaves the previous ``checkpoint_last.pt``
usable and the next start resumes from it; a damaged checkpoint, one of another architecture or one trained
with other dictionaries is one clear line naming the file (fairseq-train, -generate, -eval-lm, hub)."""
import os
import shutil
import sys

import pytest
import torch

from tests.helpers import cli

K, N = 3, 6
TRAIN = ["--task", "translation", "--arch", "transformer", *cli.TINY_TRANSLATION_ARGS, "--optimizer", "adam",
         "--lr", "1e-3", "--batch-size", 16, "--max-update", N, "--save-interval-updates", K, "--cpu",
         "--num-workers", 0, "--seed", 1, "--no-epoch-checkpoints", "--no-progress-bar", "--log-format", "simple"]


def updates_of(path):
    state = torch.load(path, map_location="cpu", weights_only=False)
    return state["optimizer_history"][-1]["num_updates"]


def failing_train(data, save_dir, mode, at=2):
    return cli.run([sys.executable, os.path.join(cli.ROOT, "tests/helpers/train_failing_writes.py"), data, *TRAIN,
                    "--save-dir", save_dir, "--user-dir", cli.USER_DIR],
                   check=False, env={"FAIL_MODE": mode, "FAIL_AT": str(at)})


def assert_one_line_error(proc, *words):
    """The command failed with one line on stderr's end that holds ``words``, and no traceback."""
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert "error:" in last and all(str(w) in last for w in words), last


@pytest.mark.parametrize("mode", ["copy_last", "save_always"])
def test_failed_save_keeps_the_last_checkpoint_and_the_next_start_resumes(toy_translation_bin, tmp_path, mode):
    """The save at update N fails part-way (full disk): in the copy to checkpoint_last.pt (fairseq copies in
    place: a truncated checkpoint_last.pt before the fix) or in writing the checkpoint itself."""
    save = tmp_path / "ck"
    proc = failing_train(toy_translation_bin, save, mode)
    failed = "checkpoint_last.pt" if mode == "copy_last" else f"checkpoint_1_{N}.pt"
    assert_one_line_error(proc, "could not write checkpoint", failed, "No space left on device")
    assert updates_of(save / "checkpoint_last.pt") == K  # the previous one, whole
    assert not [p for p in os.listdir(save) if p.endswith(".tmp")]
    resumed = cli.fairseq("train", toy_translation_bin, *TRAIN, "--save-dir", save)
    assert f"@ {K} updates" in resumed.stdout + resumed.stderr
    assert updates_of(save / "checkpoint_last.pt") == N


def test_failed_save_attempt_that_is_retried_writes_a_whole_checkpoint(toy_translation_bin, tmp_path):
    """fairseq retries a failed torch.save on the same file; the retry must not write after the failed bytes."""
    save = tmp_path / "ck"
    proc = failing_train(toy_translation_bin, save, "save_once")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "trying again" in proc.stdout + proc.stderr
    assert updates_of(save / f"checkpoint_1_{N}.pt") == N
    assert updates_of(save / "checkpoint_last.pt") == N


# ------------------------------------------------------------------ damaged checkpoints
def damage(path, kind, dest):
    data = open(path, "rb").read()
    if kind == "truncated":
        data = data[: len(data) // 2]
    elif kind == "corrupted":  # bytes flipped inside the parameters: loads as wrong numbers without a check
        mid = len(data) // 2
        data = data[:mid] + bytes(b ^ 0xFF for b in data[mid: mid + 64]) + data[mid + 64:]
    elif kind == "empty":
        data = b""
    elif kind == "not_a_checkpoint":
        data = b"this is a text file\n"
    with open(dest, "wb") as f:
        f.write(data)
    return dest


@pytest.fixture(scope="module")
def translation_ckpt(toy_translation_bin, tmp_path_factory):
    save = tmp_path_factory.mktemp("damage_mt")
    return cli.train_translation(toy_translation_bin, save, "transformer", *cli.TINY_TRANSLATION_ARGS, max_update=2)


@pytest.fixture(scope="module")
def lm_ckpt(toy_lm_bin, tmp_path_factory):
    save = tmp_path_factory.mktemp("damage_lm")
    cli.fairseq("train", toy_lm_bin, "--task", "bptt_lm", "--tokens-per-sample", 16, "--batch-size", 4,
                "--arch", "transformer_xl_lm", "--n-layer", 1, "--d-model", 16, "--n-head", 2, "--d-head", 8,
                "--d-inner", 32, "--mem-len", 16, "--optimizer", "adam", "--lr", "1e-3", "--max-update", 2,
                "--save-dir", save, "--no-epoch-checkpoints", "--cpu", "--num-workers", 0, "--no-progress-bar")
    return os.path.join(save, "checkpoint_last.pt")


KINDS = ["truncated", "corrupted", "empty", "not_a_checkpoint"]


@pytest.mark.parametrize("kind", KINDS)
def test_damaged_checkpoint_generate(toy_translation_bin, translation_ckpt, tmp_path, kind):
    bad = damage(translation_ckpt, kind, tmp_path / "bad.pt")
    proc = cli.fairseq("generate", toy_translation_bin, "--path", bad, "--beam", 2, "--cpu", check=False)
    assert_one_line_error(proc, bad, "is damaged")
    assert not [line for line in proc.stdout.splitlines() if line.startswith("H-")]


def test_damaged_checkpoint_train_restore_file(toy_translation_bin, translation_ckpt, tmp_path):
    bad = damage(translation_ckpt, "truncated", tmp_path / "bad.pt")
    save = tmp_path / "ck"
    proc = cli.fairseq("train", toy_translation_bin, *TRAIN, "--restore-file", bad, "--save-dir", save, check=False)
    assert_one_line_error(proc, bad, "is damaged", "truncated")
    assert not save.exists() or not os.listdir(save)  # nothing written


def test_damaged_checkpoint_last_on_resume(toy_translation_bin, translation_ckpt, tmp_path):
    save = tmp_path / "ck"
    save.mkdir()
    damage(translation_ckpt, "corrupted", save / "checkpoint_last.pt")
    before = open(save / "checkpoint_last.pt", "rb").read()
    proc = cli.fairseq("train", toy_translation_bin, *TRAIN, "--save-dir", save, check=False)
    assert_one_line_error(proc, save / "checkpoint_last.pt", "is damaged", "corrupted")
    assert os.listdir(save) == ["checkpoint_last.pt"] and open(save / "checkpoint_last.pt", "rb").read() == before


def test_damaged_checkpoint_eval_lm(toy_lm_bin, lm_ckpt, tmp_path):
    bad = damage(lm_ckpt, "truncated", tmp_path / "bad.pt")
    proc = cli.fairseq("eval-lm", toy_lm_bin, "--task", "bptt_lm", "--path", bad, "--tokens-per-sample", 16,
                       "--batch-size", 2, "--cpu", "--num-workers", 0, check=False)
    assert_one_line_error(proc, bad, "is damaged")
    assert "Perplexity" not in proc.stdout + proc.stderr


def test_damaged_checkpoint_hub_from_pretrained(toy_translation_bin, translation_ckpt, tmp_path):
    from fairseq.models.transformer import TransformerModel

    from user_dir.checkpoint_safety import DamagedCheckpointError

    damage(translation_ckpt, "corrupted", tmp_path / "bad.pt")
    with pytest.raises(DamagedCheckpointError, match=r"bad\.pt is damaged: the archive is corrupted"):
        TransformerModel.from_pretrained(str(tmp_path), checkpoint_file="bad.pt", data_name_or_path=toy_translation_bin)


def test_damaged_check_passes_sound_checkpoints(translation_ckpt):
    from user_dir.checkpoint_safety import archive_problem

    assert archive_problem(translation_ckpt) is None


# ------------------------------------------------------------------ checkpoints of something else
def test_restore_file_of_another_arch_is_named(toy_translation_bin, translation_ckpt, tmp_path):
    proc = cli.fairseq("train", toy_translation_bin, *TRAIN, "--arch", "fasttrees_transformer", "--chunk-size", 8,
                       "--restore-file", translation_ckpt, "--save-dir", tmp_path / "ck", check=False)
    assert_one_line_error(proc, translation_ckpt, "trained with --arch transformer",
                          "this run builds --arch fasttrees_transformer")


def test_checkpoint_with_another_dictionary_is_named(toy_translation_bin, translation_ckpt, tmp_path):
    other = tmp_path / "bin"
    shutil.copytree(toy_translation_bin, other)
    for lang in ("en", "de"):
        with open(other / f"dict.{lang}.txt", "a") as f:
            f.write("".join(f"extra{i} 1\n" for i in range(12)))
    generate = cli.fairseq("generate", other, "--path", translation_ckpt, "--beam", 2, "--cpu", check=False)
    assert_one_line_error(generate, translation_ckpt, "trained with another dictionary", other)
    train = cli.fairseq("train", other, *TRAIN, "--restore-file", translation_ckpt, "--save-dir", tmp_path / "ck",
                        check=False)
    assert_one_line_error(train, translation_ckpt, "trained with another dictionary", other)


def test_restore_file_that_does_not_exist_is_an_error(toy_translation_bin, tmp_path):
    """fairseq would silently train from scratch."""
    proc = cli.fairseq("train", toy_translation_bin, *TRAIN, "--restore-file", tmp_path / "missing.pt",
                       "--save-dir", tmp_path / "ck", check=False)
    assert_one_line_error(proc, "--restore-file", tmp_path / "missing.pt", "no such checkpoint")
