"""The whole fairseq pipeline runs through the plugin: preprocess → train → generate /
interactive / eval-lm, with ``--user-dir user_dir``."""
import numpy as np
import pytest

from tests.helpers.cli import TINY_TRANSLATION_ARGS, fairseq, num_lines, script, train_translation
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


def test_diverse_beam_search_indexes_its_overlaps_by_batch_row():
    """fairseq passes dataset ids to DiverseBeamSearch, which indexes per-row state with them: the
    patched search must translate a batch the same whatever its sentences' ids are (ids 0..n-1, the
    only ones fairseq's class gets right, give fairseq's result)."""
    import torch
    from fairseq import search
    from fairseq.data import data_utils as du
    from fairseq.sequence_generator import SequenceGenerator

    from tests.helpers.models import build, random_sentences

    assert search.DiverseBeamSearch is fairseq_fixes.DiverseBeamSearchByRow
    model, d = build("transformer", TINY_TRANSLATION_ARGS + ["--dropout", "0"], seed=3)
    src = random_sentences(d, [7, 4, 6], seed=2)
    tokens = du.collate_tokens(src, d.pad(), d.eos(), left_pad=True)
    net_input = dict(src_tokens=tokens, src_lengths=torch.tensor([len(s) for s in src]))

    def translate(search_cls, ids):
        strategy = search_cls(d, num_groups=2, diversity_strength=0.5)
        gen = SequenceGenerator([model], d, beam_size=4, max_len_a=0, max_len_b=8, search_strategy=strategy)
        hypos = gen.generate([model], dict(id=torch.tensor(ids), net_input=net_input))
        return [[(h["tokens"].tolist(), round(float(h["score"]), 5)) for h in sent] for sent in hypos]

    reference = translate(fairseq_fixes.DiverseBeamSearchByRow.__bases__[0], [0, 1, 2])  # fairseq's own class
    assert translate(search.DiverseBeamSearch, [0, 1, 2]) == reference
    assert translate(search.DiverseBeamSearch, [2, 0, 1]) == reference  # fairseq's: other rows' overlaps
    assert translate(search.DiverseBeamSearch, [41, 17, 9]) == reference  # fairseq's: IndexError


@pytest.mark.parametrize("arch, task, data, expected", [
    ("capsule_transformer", "language_modeling", "toy_lm_bin", "use --task translation"),
    ("transformer_xl_lm", "translation", "toy_translation_bin", "use --task language_modeling or bptt_lm"),
    ("star_transformer", "translation", "toy_translation_bin", "use --task sentence_prediction"),
])
def test_arch_of_another_kind_than_the_task_is_refused_clearly(arch, task, data, expected, request):
    """A model given a task of another kind stops at build_model with one line naming both flags (it was an
    AttributeError, a TypeError or a batch-size mismatch from inside fairseq or torch)."""
    proc = fairseq("train", request.getfixturevalue(data), "--task", task, "--arch", arch, "--optimizer", "adam",
                   "--lr", "1e-3", "--max-update", 1, "--batch-size", 4, "--cpu", "--no-save", check=False)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode != 0 and last.startswith(f"ValueError: --arch {arch} ") and f"--task {task} " in last
    assert expected in last, last


@pytest.fixture(scope="module")
def mt_checkpoint(toy_translation_bin, tmp_path_factory):
    return train_translation(toy_translation_bin, tmp_path_factory.mktemp("mt"), "transformer",
                             *TINY_TRANSLATION_ARGS, "--share-all-embeddings", max_update=4)


def test_generate_with_diverse_beam_groups_over_several_batches(toy_translation_bin, mt_checkpoint):
    out = fairseq("generate", toy_translation_bin, "--path", mt_checkpoint, "--beam", 4, "--diverse-beam-groups", 2,
                  "--batch-size", 4, "--max-len-b", 8, "--cpu").stdout
    hyps = [line for line in out.splitlines() if line.startswith("H-")]
    assert len(hyps) == num_lines(f"{toy_translation_bin}/test.raw.de")


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
