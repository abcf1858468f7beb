"""FastTrees through the real fairseq CLIs: NMT train → generate, LM hydra-train (YAML) → eval-lm → trees,
sentence-pair classification train → validate."""
import json
import os
import random
import re

import pytest
import torch

from tests.helpers.cli import (ROOT, TINY_TRANSLATION_ARGS, USER_DIR, fairseq, load_script, num_lines, run, tool,
                               train_translation)

FT_TINY = ["--chunk-size", "8"]
COMMON = ["--optimizer", "adam", "--lr", "1e-3", "--cpu", "--num-workers", "0", "--seed", "1",
          "--no-progress-bar", "--log-format", "simple", "--no-epoch-checkpoints"]


def in_process(path, *args):
    """Runs one of the project's scripts' ``main(argv)`` in this process (saves an interpreter start)."""
    load_script(path).main([str(a) for a in args])


def test_translation_train_and_beam_generate(toy_translation_bin, tmp_path):
    ckpt = train_translation(toy_translation_bin, tmp_path / "ck", "fasttrees_transformer",
                             *TINY_TRANSLATION_ARGS, *FT_TINY, "--fasttrees-master", "conv", max_update=3)
    out = fairseq("generate", toy_translation_bin, "--path", ckpt, "--beam", "2", "--batch-size", "40",
                  "--max-len-b", "8", "--cpu", "--remove-bpe").stdout
    hyps = [line for line in out.splitlines() if line.startswith("H-")]
    assert len(hyps) == num_lines(os.path.join(toy_translation_bin, "test.raw.de")), out[-2000:]
    assert "BLEU" in out


def test_language_model_hydra_train_eval_and_trees(toy_lm_bin, tmp_path, capsys):
    """The LM is trained through one of the hydra YAMLs (tiny overrides), then fairseq-eval-lm and the tree tools."""
    save = tmp_path / "lm"
    run([tool("fairseq-hydra-train"), "--config-dir", "examples/fasttrees", "--config-name", "fasttrees_lm_ptb",
         f"task.data={toy_lm_bin}", f"common.user_dir={USER_DIR}", "model.decoder_layers=2",
         "model.decoder_embed_dim=32", "model.decoder_ffn_embed_dim=64", "model.decoder_attention_heads=2",
         "task.tokens_per_sample=64", "optimization.max_update=4", f"checkpoint.save_dir={save}",
         f"hydra.run.dir={tmp_path / 'hydra'}", "dataset.max_tokens=1000"])
    ckpt = save / "checkpoint_last.pt"
    out = fairseq("eval-lm", toy_lm_bin, "--path", ckpt, "--cpu", "--max-tokens", "1000",
                  "--tokens-per-sample", "64", "--sample-break-mode", "eos")
    assert "Perplexity" in out.stdout + out.stderr

    words = [w.split()[0] for w in open(os.path.join(toy_lm_bin, "dict.txt")).readlines()[:6]]
    sentences = tmp_path / "sents.txt"
    sentences.write_text(" ".join(words) + "\n" + " ".join(words[:3]) + "\n")
    png = tmp_path / "png"
    capsys.readouterr()
    in_process("examples/fasttrees/induce_trees.py", "--path", ckpt, "--input", sentences,
               "--png-dir", png, "--show-distances")
    trees = capsys.readouterr().out
    lines = [line.split("\t") for line in trees.splitlines()]
    tree_lines = [cols for cols in lines if len(cols) == 3]
    assert [(c[0], c[1]) for c in tree_lines] == [("1", "layer0"), ("1", "layer1"), ("2", "layer0"), ("2", "layer1")]
    for cols in tree_lines:  # a binary bracketing over exactly the input words
        toks = cols[2].replace("(", " ").replace(")", " ").split()
        assert toks == (words if cols[0] == "1" else words[:3])
        assert cols[2].count("(") == len(toks) - 1
    assert sorted(os.listdir(png)) == ["sent1_layer0.png", "sent1_layer1.png", "sent2_layer0.png", "sent2_layer1.png"]

    treebank = tmp_path / "mrg"
    treebank.mkdir()
    (treebank / "wsj_0001.mrg").write_text(
        f"( (S (NP (DT {words[0]}) (NN {words[1]})) (VP (VBD {words[2]}) (NP (NN {words[3]}))) (. .)))\n")
    in_process("examples/fasttrees/eval_parsing.py", "--path", ckpt, "--treebank", treebank)
    table = capsys.readouterr().out
    # gold ((w0 w1) (w2 w3)): each baseline finds one of its two brackets
    assert "| left-branching | 50.0 |" in table and "| right-branching | 50.0 |" in table
    assert "| FastTrees layer 1 |" in table


def _fake_logic(directory, max_ops=3, lines=60, seed=0):
    """Files in the format of Bowman et al.'s data: RELATION<TAB>premise<TAB>hypothesis."""
    rng = random.Random(seed)

    def formula(ops):
        if ops == 0:
            return rng.choice("abcdef")
        if rng.random() < 0.3:
            return f"( not {formula(ops - 1)} )"
        k = rng.randrange(ops)
        return f"( {formula(k)} ( {rng.choice(['and', 'or'])} {formula(ops - 1 - k)} ) )"

    for split in ("train", "test"):
        for ops in range(max_ops + 1):
            with open(os.path.join(directory, f"{split}{ops}"), "w") as f:
                for _ in range(lines):
                    f.write(f"{rng.choice('#<>=^v|')}\t{formula(ops)}\t{formula(rng.randrange(ops + 1))}\n")


def test_sentence_pair_classification_train_and_validate(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    _fake_logic(raw)
    data = tmp_path / "bin"
    in_process("preprocess/propositionallogic_prepare.py", "--data", raw, "--dest", data, "--train-max-ops", "2",
               "--test-ops", "1-3")
    save = tmp_path / "cls"
    task = ["--task", "sentence_prediction", "--num-classes", "7", "--init-token", "0", "--separator-token", "2",
            "--max-positions", "128"]
    fairseq("train", data, *task, "--criterion", "sentence_prediction", "--arch", "fasttrees_roberta_conv_logic",
            "--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--fasttrees-bidirectional",
            "--batch-size", "16", "--max-update", "4", "--save-dir", save, *COMMON)
    out = fairseq("validate", data, *task, "--criterion", "sentence_prediction", "--path",
                  save / "checkpoint_last.pt", "--valid-subset", "test_ops3", "--batch-size", "16", "--cpu")
    log = out.stdout + out.stderr
    assert "test_ops3" in log and "accuracy" in log
    # the hub (RoBERTa's interface, no BPE: whitespace tokens as prepared) classifies the test pairs as
    # fairseq-validate does; before, it downloaded GPT-2's BPE (or, with bpe=None, failed in encode)
    from user_dir.models.fasttrees_transformer import FastTreesRobertaModel

    hub = FastTreesRobertaModel.from_pretrained(str(save), checkpoint_file="checkpoint_last.pt",
                                                data_name_or_path=str(data)).eval()
    labels = hub.task.label_dictionary
    rows = [line.rstrip("\n").split("\t") for line in open(raw / "test3")]

    def text(formula):  # as propositionallogic_prepare.py writes it: brackets removed
        return " ".join(t for t in formula.split() if t not in "()")

    with torch.no_grad():
        predicted = [hub.predict("sentence_classification_head", hub.encode(text(p), text(h))).argmax(-1).item()
                     for _, p, h in rows]
    accuracy = 100.0 * sum(labels.string([i + labels.nspecial]) == r[0] for i, r in zip(predicted, rows)) / len(rows)
    validated = float(re.findall(r"\| accuracy ([\d.]+)", log)[-1])
    assert accuracy == pytest.approx(validated, abs=0.05)  # printed to 0.1


def test_mlu_experiment_script_writes_its_row(tmp_path):
    """benchmarks/fasttrees/mlu.sh on a tiny generated MLU set, a few updates: a row with the accuracy per
    sequence over every test example."""
    results = tmp_path / "rows.json"
    env = {"TRAIN": "200", "TEST": "30", "DATA": str(tmp_path / "bin"), "MAX_UPDATE": "4", "RESULTS": str(results),
           "PYTHON": tool("python")}
    run(["bash", os.path.join(ROOT, "benchmarks/fasttrees/mlu.sh"), "fasttrees_transformer", 1, tmp_path / "w"],
        env=env)
    (row,) = json.load(open(results))
    assert (row["arch"], row["seed"], row["updates"], row["test_examples"]) == ("fasttrees_transformer", 1, 4, 30)
    assert 0 <= row["sequence_accuracy"] <= 100


def test_mlu_sequence_accuracy_counts_whole_answers(tmp_path):
    out = tmp_path / "gen.txt"
    out.write_text("S-0\tx = 1 , y = 2 , x + y\nT-0\t3\nH-0\t-0.1\t3\nS-1\tx = 1 , y = 2 , x * y\nT-1\t2\n"
                   "H-1\t-0.2\t2 2\nT-2\t- 1\nH-2\t-0.3\t- 1\n")
    accuracy, n = load_script("benchmarks/fasttrees/mlu_rows.py").sequence_accuracy(out)
    assert (round(accuracy, 2), n) == (66.67, 3)


def test_mlu_summary_pairs_seeds_and_writes_the_claim(tmp_path):
    """summarize_mlu.py: the paired gain over the seeds both models have, the claim at the largest such budget."""
    rows = [{"arch": arch, "seed": seed, "updates": updates, "sequence_accuracy": acc, "test_examples": 10}
            for arch, seed, updates, acc in [("fasttrees_transformer", 1, 100, 50.0), ("transformer", 1, 100, 40.0),
                                             ("fasttrees_transformer", 1, 200, 70.0), ("transformer", 1, 200, 64.0),
                                             ("fasttrees_transformer", 2, 200, 72.0), ("transformer", 2, 200, 70.0),
                                             ("fasttrees_transformer", 1, 300, 75.0)]]
    summary = load_script("benchmarks/fasttrees/summarize_mlu.py")
    table = summary.markdown(rows)
    assert "+4 ± 2 (t-test p = 0.295, sign-flip p = 0.50, ahead in 2 of 2): within noise" in table
    assert "+10.00 (seed 1 only)" in table
    (results := tmp_path / "mlu.json").write_text(json.dumps(rows))
    claims = tmp_path / "claims.json"
    summary.main(["--results", str(results), "--claims", str(claims)])
    (claim,) = json.load(open(claims))
    assert (claim["id"], claim["updates"], claim["seeds"]) == ("fasttrees_mlu", 200, [1, 2])
    assert (claim["ours"], claim["baseline"]) == ([70.0, 72.0], [64.0, 70.0])
