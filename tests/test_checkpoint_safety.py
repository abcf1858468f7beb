"""Checkpoints written by fairseq-train load under torch ≥ 2.6; malicious ones are refused."""
import os

import pytest
import torch
from fairseq import checkpoint_utils

from user_dir.checkpoint_safety import UnsafeCheckpointError
from tests.helpers.cli import TINY_TRANSLATION_ARGS, fairseq, num_lines, train_translation


class _RunsShellOnLoad:
    """Unpickling this calls os.system — what a weights-only loader must never do."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(scope="module")
def trained(toy_translation_bin, tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("ckpt")
    ckpt = train_translation(toy_translation_bin, save_dir, "transformer", *TINY_TRANSLATION_ARGS, max_update=3)
    return toy_translation_bin, ckpt


def test_fairseq_checkpoint_needs_only_allow_listed_globals(trained):
    _, ckpt = trained
    # plain torch.load with weights_only=True (torch's default) works once the plugin is imported
    state = torch.load(ckpt, weights_only=True)
    assert "model" in state and state["model"]


def test_generate_loads_a_trained_checkpoint(trained):
    data, ckpt = trained
    out = fairseq("generate", data, "--path", ckpt, "--beam", 2, "--max-len-b", 5, "--cpu").stdout
    # 43 test sentences: not a multiple of 8, so fairseq issue #5036 would drop 3 of them
    assert len([l for l in out.splitlines() if l.startswith("H-")]) == num_lines(os.path.join(data, "test.raw.de")) == 43


def test_without_plugin_generate_fails_on_the_same_checkpoint(trained):
    """The failure the plugin fixes is real (guards against the fix being a no-op)."""
    data, ckpt = trained
    proc = fairseq("generate", data, "--path", ckpt, "--cpu", user_dir=False, check=False)
    assert proc.returncode != 0 and "argparse.Namespace" in proc.stderr


def test_restore_file_continues_training(trained, tmp_path):
    data, ckpt = trained
    proc = fairseq("train", data, "--task", "translation", "--arch", "transformer", *TINY_TRANSLATION_ARGS,
                   "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", 1000, "--max-update", 5,
                   "--restore-file", ckpt, "--save-dir", tmp_path, "--cpu", "--no-progress-bar",
                   "--log-format", "simple")
    out = proc.stdout + proc.stderr
    assert "Loaded checkpoint" in out and "@ 3 updates" in out and "num_updates 5" in out


def test_hub_from_pretrained_translates(trained):
    from fairseq.models.transformer import TransformerModel

    data, ckpt = trained
    hub = TransformerModel.from_pretrained(os.path.dirname(ckpt), checkpoint_file=os.path.basename(ckpt),
                                           data_name_or_path=data)
    assert isinstance(hub.translate("the dog sees a cat .", beam=2, max_len_b=5), str)


def _malicious_checkpoint(path, marker):
    torch.save({"model": {}, "args": None, "extra": _RunsShellOnLoad(marker)}, path)


def test_malicious_checkpoint_is_refused_in_process(tmp_path):
    ckpt, marker = tmp_path / "evil.pt", tmp_path / "pwned"
    _malicious_checkpoint(ckpt, marker)
    with pytest.raises(UnsafeCheckpointError, match=r"refusing to load checkpoint .*evil\.pt"):
        checkpoint_utils.load_checkpoint_to_cpu(str(ckpt))
    assert not marker.exists(), "the checkpoint's payload ran"


def test_malicious_checkpoint_is_refused_by_generate(trained, tmp_path):
    data, _ = trained
    ckpt, marker = tmp_path / "evil.pt", tmp_path / "pwned"
    _malicious_checkpoint(ckpt, marker)
    proc = fairseq("generate", data, "--path", ckpt, "--cpu", check=False)
    assert proc.returncode != 0
    assert "refusing to load checkpoint" in proc.stderr and "evil.pt" in proc.stderr
    assert "os.system" in proc.stderr or "posix.system" in proc.stderr
    assert not marker.exists(), "the checkpoint's payload ran"
