"""End to end through the real CLIs: fairseq-train (bptt_lm) -> fairseq-eval-lm with a longer
memory -> fairseq-interactive (beam search) and hub sample(); one fairseq-hydra-train run."""
import os
import re
import shutil

import pytest

from tests.helpers.cli import ROOT, USER_DIR, fairseq, run, tool

TINY = ["--n-layer", 1, "--d-model", 16, "--n-head", 2, "--d-head", 8, "--d-inner", 32]
COMMON = ["--no-progress-bar", "--log-format", "simple", "--cpu", "--num-workers", 0, "--seed", 1]


@pytest.fixture(scope="module")
def trained(toy_lm_bin, tmp_path_factory):
    save = tmp_path_factory.mktemp("txl_ckpt")
    fairseq("train", toy_lm_bin, "--task", "bptt_lm", "--tokens-per-sample", 16, "--batch-size", 4,
            "--arch", "transformer_xl_lm", *TINY, "--mem-len", 16, "--cutoffs", "40", "--div-val", 2,
            # a large init: after 8 updates the model's scores depend clearly on its context (with the
            # reference's std 0.02 the attention is still near uniform and the memory moved the test
            # loss by ~1e-4 bits, below what eval-lm prints)
            "--init-std", 0.5,
            "--optimizer", "adam", "--lr", "3e-3", "--max-update", 8, "--save-dir", save,
            "--no-epoch-checkpoints", *COMMON)
    return toy_lm_bin, os.path.join(save, "checkpoint_last.pt")


def _eval_lm(data, ckpt, *extra, check=True):
    proc = fairseq("eval-lm", data, "--task", "bptt_lm", "--path", ckpt, "--gen-subset", "test",
                   "--tokens-per-sample", 64, "--cpu", "--num-workers", 0, *extra, check=check)
    return proc


def _parse(proc):
    text = proc.stdout + proc.stderr
    n = int(re.search(r"Evaluated ([\d,]+) tokens", text).group(1).replace(",", ""))
    ppl = float(re.search(r"Perplexity: ([\d.]+)", text).group(1))
    return n, ppl


def _count_tokens(data, split):
    from fairseq.data import Dictionary, data_utils

    d = Dictionary.load(os.path.join(data, "dict.txt"))
    ds = data_utils.load_indexed_dataset(os.path.join(data, split), d)
    return sum(len(ds[i]) for i in range(len(ds)))


def test_eval_lm_with_longer_memory_scores_every_token(trained):
    data, ckpt = trained
    n_test = _count_tokens(data, "test")
    long_mem = _eval_lm(data, ckpt, "--batch-size", 1, "--model-overrides",
                        '{"mem_len":640,"clamp_len":400,"same_length":True}')
    no_mem = _eval_lm(data, ckpt, "--batch-size", 3, "--model-overrides", '{"mem_len":0}')
    (n1, ppl1), (n2, ppl2) = _parse(long_mem), _parse(no_mem)
    assert n1 == n2 == n_test  # every token once, whatever the batch size
    assert ppl1 != ppl2  # the memory changes the scores


def test_interactive_beam_search_and_hub_sample(trained):
    data, ckpt = trained
    proc = run([tool("fairseq-interactive"), data, "--task", "bptt_lm", "--path", ckpt, "--beam", 3, "--nbest", 2,
                "--max-len-b", 6, "--cpu", "--user-dir", USER_DIR], input="die kinder\neinige maenner sagen\n")
    hyps = [line for line in proc.stdout.splitlines() if line.startswith("H-")]
    assert len(hyps) == 4, proc.stdout[-2000:]
    assert all(len(h.split("\t")[2].split()) > 2 for h in hyps)

    from user_dir.models.transformer_xl_lm import TransformerXLLanguageModel

    hub = TransformerXLLanguageModel.from_pretrained(os.path.dirname(ckpt), checkpoint_file=os.path.basename(ckpt),
                                                     data_name_or_path=data, cpu=True)
    out = hub.sample("die kinder", beam=2, max_len_b=5)
    assert out.startswith("die kinder") and len(out.split()) > 2


@pytest.mark.parametrize("arch", ["fasttrees_transformer_lm", "transformer_lm"])
def test_models_without_memory_train_and_score_on_bptt_lm(toy_lm_bin, tmp_path, arch):
    """bptt_lm's batches carry ``stream_pos`` for a model with memory only: fairseq's decoders do not take
    the key (a TypeError from inside fairseq before), and a model without memory scores every token once."""
    fairseq("train", toy_lm_bin, "--task", "bptt_lm", "--tokens-per-sample", 16, "--batch-size", 4, "--arch", arch,
            "--decoder-layers", 1, "--decoder-embed-dim", 16, "--decoder-ffn-embed-dim", 32,
            "--decoder-attention-heads", 2, "--optimizer", "adam", "--lr", "3e-3", "--max-update", 3,
            "--save-dir", tmp_path, "--no-epoch-checkpoints", *COMMON)
    n, ppl = _parse(_eval_lm(toy_lm_bin, tmp_path / "checkpoint_last.pt", "--batch-size", 2))
    assert n == _count_tokens(toy_lm_bin, "test") and ppl > 1


def test_dictionary_mismatch_is_reported(trained, tmp_path):
    data, ckpt = trained
    other = tmp_path / "bin"
    shutil.copytree(data, other)
    with open(other / "dict.txt", "a") as f:
        f.write("".join(f"extra{i} 1\n" for i in range(20)))
    proc = _eval_lm(str(other), ckpt, "--batch-size", 1, check=False)
    assert proc.returncode != 0
    assert "dictionary mismatch" in proc.stderr and str(other / "dict.txt") in proc.stderr, proc.stderr[-2000:]


def test_hydra_train_ptb_small_yaml(toy_lm_bin, tmp_path):
    run([tool("fairseq-hydra-train"), "--config-dir", os.path.join(ROOT, "examples", "transformer_xl"),
         "--config-name", "ptb_small", f"task.data={toy_lm_bin}", f"common.user_dir={USER_DIR}",
         "task.tokens_per_sample=8", "dataset.batch_size=4", "model.n_layer=1", "model.d_model=16", "model.n_head=2",
         "model.d_head=8", "model.d_inner=32", "model.mem_len=8", "optimization.max_update=3", "common.cpu=true",
         f"checkpoint.save_dir={tmp_path}", "dataset.num_workers=0", f"hydra.run.dir={tmp_path}/hydra"])
    assert os.path.exists(tmp_path / "checkpoint_last.pt")


def test_hub_score_equals_the_teacher_forced_log_probs(trained):
    """hub.score() with bptt_lm: the positional scores are the model's log-probs of the sentence
    (and its </s>) after </s>."""
    import torch

    from user_dir.models.transformer_xl_lm import TransformerXLLanguageModel

    data, ckpt = trained
    hub = TransformerXLLanguageModel.from_pretrained(os.path.dirname(ckpt), checkpoint_file=os.path.basename(ckpt),
                                                     data_name_or_path=data, cpu=True)
    sentences = ["die kinder sagen", "einige maenner"]
    scored = hub.score(sentences)
    model, eos = hub.models[0], hub.task.dictionary.eos()
    for sentence, hypo in zip(sentences, scored):
        tokens = hub.encode(sentence)
        assert tokens[-1] == eos and torch.equal(hypo["tokens"], tokens)
        with torch.no_grad():
            lp = model.get_normalized_probs(model(torch.cat([torch.tensor([eos]), tokens[:-1]])[None]), True)[0]
        expected = lp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        assert torch.allclose(hypo["positional_scores"], expected, atol=1e-5)


def _logged(text, pattern):
    return [float(x) for x in re.findall(pattern, text)]


def _train_run(data, save, *extra):
    proc = fairseq("train", data, "--task", "bptt_lm", "--tokens-per-sample", 16, "--batch-size", 4,
                   "--arch", "transformer_xl_lm", *TINY, "--mem-len", 16, "--cutoffs", "40", "--init-std", 0.5,
                   "--criterion", "projected_adaptive_loss", "--optimizer", "adam", "--lr", "3e-3",
                   "--max-update", 8, "--log-interval", 1, "--save-dir", save, "--no-epoch-checkpoints",
                   *COMMON, *extra)
    return proc.stdout + proc.stderr


def test_logged_valid_loss_equals_fairseq_validate_and_validation_keeps_training_memory(toy_lm_bin, tmp_path):
    """Validation at updates 4 and 8 (mid-epoch): (1) the valid loss fairseq-train logs at update 8 is
    fairseq-validate's on the saved checkpoint (no evaluation cache survives the updates in between);
    (2) the training losses are those of a run without validation (the training memory survives)."""
    with_valid = _train_run(toy_lm_bin, tmp_path / "a", "--validate-interval-updates", 4)
    without = _train_run(toy_lm_bin, tmp_path / "b", "--disable-validation")
    train_pattern = r"epoch 001:\s+\d+ / \d+ loss=([\d.]+)"
    losses = _logged(with_valid, train_pattern)
    assert len(losses) == 8 and losses == _logged(without, train_pattern)
    valid = _logged(with_valid, r"valid on 'valid' subset \| loss ([\d.]+)")
    assert len(valid) == 2 and valid[0] != valid[1]
    proc = fairseq("validate", toy_lm_bin, "--task", "bptt_lm", "--path", tmp_path / "a" / "checkpoint_last.pt",
                   "--tokens-per-sample", 16, "--batch-size", 4, "--cpu", "--num-workers", 0)
    assert _logged(proc.stdout + proc.stderr, r"valid on 'valid' subset \| loss ([\d.]+)") == valid[-1:]


def test_memory_efficient_fp16_training_with_checkpoint_activations(toy_lm_bin, tmp_path):
    """fairseq-train's mixed-precision path on CPU (--memory-efficient-fp16; --fp16-init-scale 1: an
    overflow would call .cuda()), with --checkpoint-activations: finite losses."""
    import math

    text = _train_run(toy_lm_bin, tmp_path, "--memory-efficient-fp16", "--fp16-init-scale", 1,
                      "--checkpoint-activations", "--disable-validation")
    losses = _logged(text, r"epoch 001:\s+\d+ / \d+ loss=([\d.a-z]+)")
    assert len(losses) == 8 and all(math.isfinite(x) for x in losses), losses
