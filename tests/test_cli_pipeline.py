"""The whole fairseq pipeline runs through the plugin: preprocess → train → generate /
interactive / eval-lm, with ``--user-dir user_dir``."""
import numpy as np
import pytest

from tests.helpers.cli import TINY_TRANSLATION_ARGS, fairseq, script, train_translation
from user_dir import fairseq_fixes


def test_batch_by_size_keeps_the_last_partial_batch():
    from fairseq.data import data_utils

    assert getattr(data_utils.batch_by_size, "_fairseq_struct_fixed", False)
    sizes = np.random.RandomState(0).randint(5, 30, size=301)
    indices = np.argsort(sizes, kind="mergesort")
    for max_tokens, max_sentences in ((2048, None), (None, 64), (100000, None)):
        batches = data_utils.batch_by_size(indices, lambda i: sizes[i], max_tokens=max_tokens,
                                           max_sentences=max_sentences, required_batch_size_multiple=8)
        assert sorted(np.concatenate(batches).tolist()) == list(range(301))
    fairseq_fixes.install()  # idempotent
    assert not hasattr(data_utils.batch_by_size.__wrapped__, "__wrapped__")


@pytest.fixture(scope="module")
def mt_checkpoint(toy_translation_bin, tmp_path_factory):
    return train_translation(toy_translation_bin, tmp_path_factory.mktemp("mt"), "transformer",
                             *TINY_TRANSLATION_ARGS, "--share-all-embeddings", max_update=4)


def test_generate_then_sacrebleu_scoring(toy_translation_bin, mt_checkpoint, tmp_path):
    out = fairseq("generate", toy_translation_bin, "--path", mt_checkpoint, "--beam", 5, "--max-len-b", 8,
                  "--remove-bpe", "subword_nmt", "--cpu").stdout
    gen = tmp_path / "gen.txt"
    gen.write_text(out)
    score = script("preprocess/score_generate.py", gen, f"{toy_translation_bin}/test.raw.de").stdout
    assert score.strip().splitlines()[-1].startswith("BLEU = ")


def test_score_generate_refuses_missing_hypotheses(tmp_path):
    (tmp_path / "gen.txt").write_text("D-0\t-1.0\tein hund\n")
    (tmp_path / "ref.txt").write_text("ein hund\neine katze\n")
    proc = script("preprocess/score_generate.py", tmp_path / "gen.txt", tmp_path / "ref.txt", check=False)
    assert proc.returncode != 0 and "no hypothesis for 1 of 2" in proc.stderr


def test_interactive_translates_stdin(toy_translation_bin, mt_checkpoint):
    out = fairseq("interactive", toy_translation_bin, "--path", mt_checkpoint, "--beam", 2, "--max-len-b", 6,
                  "--bpe", "subword_nmt", "--bpe-codes", f"{toy_translation_bin}/bpe.codes", "--cpu",
                  input="the dog sees a cat .\nsome birds like the tree .\n").stdout
    assert len([line for line in out.splitlines() if line.startswith("H-")]) == 2


def test_language_model_train_and_eval_lm(toy_lm_bin, tmp_path):
    fairseq("train", toy_lm_bin, "--task", "language_modeling", "--arch", "transformer_lm",
            "--decoder-layers", 1, "--decoder-embed-dim", 32, "--decoder-ffn-embed-dim", 64,
            "--decoder-attention-heads", 2, "--tokens-per-sample", 32, "--optimizer", "adam", "--lr", "1e-3",
            "--max-tokens", 512, "--max-update", 4, "--save-dir", tmp_path, "--cpu", "--no-progress-bar")
    out = fairseq("eval-lm", toy_lm_bin, "--path", tmp_path / "checkpoint_last.pt", "--tokens-per-sample", 32,
                  "--cpu")
    log = out.stdout + out.stderr
    assert "Loss (base 2)" in log and "Perplexity" in log
