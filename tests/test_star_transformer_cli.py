"""Star-Transformer tasks end-to-end through the real fairseq CLIs, on tiny generated data."""
import os
import random
import re

import pytest
import torch

from tests.helpers import cli
from tests.helpers.beam import assert_beam_reorder
from tests.helpers.invariance import assert_padding_invariant
from tests.helpers.models import build, prev_output, random_sentences

TINY = ["--arch", "star_transformer", "--encoder-embed-dim", "16", "--encoder-attention-heads", "2",
        "--encoder-layers", "1"]
TRAIN = ["--optimizer", "adam", "--lr", "1e-3", "--batch-size", "8", "--max-update", "4", "--cpu",
         "--no-progress-bar", "--log-format", "simple", "--num-workers", "0", "--seed", "1",
         "--no-epoch-checkpoints"]
WORDS = "good bad fine awful great poor nice dull the a movie plot film".split()


def _metric(text, name):
    found = re.findall(rf"\| {name} ([\d.]+)", text)
    assert found, f"no {name} in output:\n{text[-2000:]}"
    return float(found[-1])


def _sentences(n, rng):
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 9))) for _ in range(n)]


@pytest.fixture(scope="module")
def sst_bin(tmp_path_factory):
    """SST-format files (LABEL sentence) -> preprocess/sst_prepare.py."""
    raw = tmp_path_factory.mktemp("sst_raw")
    rng = random.Random(0)
    for split, n in (("train", 60), ("dev", 16), ("test", 16)):
        with open(raw / f"stsa.fine.{split}", "w") as f:
            for s in _sentences(n, rng):
                f.write(f"{rng.randint(0, 4)} {s}\n")
    dest = tmp_path_factory.mktemp("sst") / "bin"
    cli.script("preprocess/sst_prepare.py", "--raw", raw, "--classes", 5, "--dest", dest)
    return dest


@pytest.fixture(scope="module")
def sst_hydra_run(sst_bin, tmp_path_factory):
    """fairseq-hydra-train with examples/star_transformer/sst5.yaml (tiny overrides): (checkpoint dir, log)."""
    tmp = tmp_path_factory.mktemp("sst_hydra")
    out = cli.run([cli.tool("fairseq-hydra-train"), "--config-dir", os.path.join(cli.ROOT, "examples/star_transformer"),
                   "--config-name", "sst5", f"task.data={sst_bin}", f"common.user_dir={cli.USER_DIR}",
                   "model.encoder_embed_dim=16", "model.encoder_attention_heads=2", "model.encoder_head_dim=0",
                   "model.classifier_hidden_dim=8", "optimization.max_update=2", "dataset.batch_size=8",
                   f"checkpoint.save_dir={tmp / 'ck'}", f"hydra.run.dir={tmp / 'run'}"])
    return tmp / "ck", out.stdout + out.stderr


def test_sst_hydra_yaml_then_validate(sst_bin, sst_hydra_run):
    """sentence_prediction: fairseq-hydra-train with examples/star_transformer/sst5.yaml, then fairseq-validate."""
    ck, log = sst_hydra_run
    assert "valid on 'test' subset" in log
    out = cli.fairseq("validate", sst_bin, "--task", "sentence_prediction", "--criterion", "sentence_prediction",
                      "--num-classes", 5, "--path", ck / "checkpoint_last.pt", "--valid-subset", "test",
                      "--batch-size", 8, "--cpu")
    assert 0.0 <= _metric(out.stdout + out.stderr, "accuracy") <= 100.0


def test_nli_sentence_pair_train_validate(tmp_path):
    rng = random.Random(1)
    for split, n in (("dev", 70), ("test", 12)):
        with open(tmp_path / f"{split}.txt", "w") as f:
            for _ in range(n):
                f.write(f"{_sentences(1, rng)[0]}\t{_sentences(1, rng)[0]}\t{rng.randint(0, 2)}\n")
    dest = tmp_path / "bin"
    cli.script("preprocess/snli_prepare.py", "--dev", tmp_path / "dev.txt", "--test", tmp_path / "test.txt",
               "--dest", dest, "--valid-size", 10)
    save = tmp_path / "ck"
    cli.fairseq("train", dest, "--task", "sentence_pair_classification", "--criterion", "sentence_prediction",
                "--num-classes", 3, "--max-positions", 32, *TINY, *TRAIN, "--save-dir", save)
    out = cli.fairseq("validate", dest, "--task", "sentence_pair_classification", "--criterion",
                      "sentence_prediction", "--num-classes", 3, "--path", save / "checkpoint_last.pt",
                      "--valid-subset", "test", "--batch-size", 8, "--cpu")
    assert 0.0 <= _metric(out.stdout + out.stderr, "accuracy") <= 100.0
    # the pair head reads four d-sized features ([r1; r2; |r1-r2|; r1-r2] by default)
    state = torch.load(save / "checkpoint_last.pt", weights_only=False)["model"]
    assert state["classification_heads.sentence_classification_head.dense.weight"].shape[1] == 4 * 16
    # the hub classifies premise/hypothesis pairs as fairseq-validate does: same accuracy on the test split
    from user_dir.models.star_transformer import StarTransformerModel

    hub = StarTransformerModel.from_pretrained(str(save), checkpoint_file="checkpoint_last.pt",
                                               data_name_or_path=str(dest)).eval()
    head = "sentence_classification_head"
    rows = [line.rstrip("\n").split("\t") for line in open(tmp_path / "test.txt")]
    premises, hypotheses = [hub.encode(r[0]) for r in rows], [hub.encode(r[1]) for r in rows]
    with torch.no_grad():
        batch = hub.predict(head, premises, pair=hypotheses)
        single = torch.cat([hub.predict(head, p, pair=h) for p, h in zip(premises, hypotheses)])
    assert torch.allclose(batch, single, atol=1e-5)  # padding in the batch changes nothing
    labels = [hub.task.label_dictionary.string([i + hub.task.label_dictionary.nspecial]) for i in batch.argmax(-1)]
    accuracy = 100.0 * sum(lab == r[2] for lab, r in zip(labels, rows)) / len(rows)
    assert accuracy == pytest.approx(_metric(out.stdout + out.stderr, "accuracy"), abs=0.05)  # printed to 0.1
    assert hub.predict_label(head, rows[0][0], pair=rows[0][1]) == labels[0]
    with pytest.raises(ValueError, match="classifies sentence pairs .* give the hypotheses with pair="):
        hub.predict(head, premises[0])
    with pytest.raises(ValueError, match="2 premises but 1 hypotheses"):
        hub.predict(head, premises[:2], pair=hypotheses[:1])


def _write_conll(path, sents, header=True):
    with open(path, "w") as f:
        if header:
            f.write("-TOKEN- -POSTAG- -CHUNKTAG- -NETAG-\n\n-DOCSTART- -X- -X- O\n\n")
        for words, tags in sents:
            for w, t in zip(words, tags):
                f.write(f"{w} NN B-NP {t}\n")
            f.write("\n")


def _ner_sents(n, rng):
    names = ["john", "mary", "paris", "berlin"]
    out = []
    for _ in range(n):
        words, tags = [], []
        for _ in range(rng.randint(2, 8)):
            if rng.random() < 0.3:
                w = rng.choice(names)
                typ = "PER" if w in names[:2] else "LOC"
                words += [w, "smith"] if typ == "PER" else [w]
                tags += [f"B-{typ}", f"I-{typ}"] if typ == "PER" else [f"B-{typ}"]
            else:
                words.append(rng.choice(WORDS))
                tags.append("O")
        out.append((words, tags))
    return out


@pytest.fixture(scope="module")
def ner_dir(tmp_path_factory):
    raw = tmp_path_factory.mktemp("conll_raw")
    rng = random.Random(2)
    for split, n in (("train", 80), ("valid", 12), ("test", 12)):
        _write_conll(raw / f"{split}.txt", _ner_sents(n, rng))
    dest = tmp_path_factory.mktemp("conll") / "ner"
    cli.script("preprocess/conll_tagging_prepare.py", "--conll", raw, "--tag-column", 3, "--dest", dest)
    return raw, dest


def test_tagging_train_predict(ner_dir, tmp_path):
    """sequence_tagging with a CRF: fairseq-train (validation reports accuracy and span F1), then predict."""
    raw, dest = ner_dir
    save = tmp_path / "ck"
    out = cli.fairseq("train", dest, "--task", "sequence_tagging", "--criterion", "sequence_tagging", "--crf",
                      *TINY, *TRAIN, "--lr", "1e-2", "--max-update", "30", "--save-dir", save)
    text = out.stdout + out.stderr
    assert _metric(text, "accuracy") > 60.0  # better than nothing after 30 updates ('O' alone is ~70%)
    assert 0.0 <= _metric(text, "span_f1") <= 100.0
    # the predict command writes one tag per token of the raw CoNLL file (4 columns, header, DOCSTART)
    pred = tmp_path / "pred.txt"
    cli.script("examples/star_transformer/predict_tags.py", "--path", save / "checkpoint_last.pt",
               "--input", raw / "test.txt", "--output", pred, "--word-column", 0)
    gold = [line.split() for line in open(dest / "test.txt")]
    got = [line.split() for line in open(pred)]
    assert [g[:1] for g in gold] == [p[:1] for p in got]
    tags = set(open(dest / "tags.txt").read().split())
    assert all(p[1] in tags for p in got if p)
    # the hub tags sentences as the predict command does (CRF Viterbi), alone or in one padded batch
    from user_dir.models.star_transformer import StarTransformerModel

    hub = StarTransformerModel.from_pretrained(str(save), checkpoint_file="checkpoint_last.pt",
                                               data_name_or_path=str(dest)).eval()
    sentences, predicted = [[]], [[]]
    for line in got:
        if line:
            sentences[-1].append(line[0])
            predicted[-1].append(line[1])
        elif sentences[-1]:
            sentences.append([])
            predicted.append([])
    sentences, predicted = [s for s in sentences if s], [p for p in predicted if p]
    with torch.no_grad():
        assert hub.tag([" ".join(s) for s in sentences]) == predicted
        assert hub.tag(" ".join(sentences[0])) == predicted[0]
    with pytest.raises(ValueError, match="tag: empty sentence"):
        hub.tag(["john", " "])


def test_tagging_bad_input(ner_dir, tmp_path):
    """Wrong column count, unseen tag, too long a sentence: errors name the file and line."""
    from user_dir.tasks.sequence_tagging import SequenceTaggingConfig, SequenceTaggingTask, TaggingFormatError

    _, dest = ner_dir
    task = SequenceTaggingTask.setup_task(SequenceTaggingConfig(data=str(dest), max_positions=16, seed=1))
    bad = tmp_path / "test.txt"
    bad.write_text("john B-PER\nsmith I-PER\nruns\n\n")
    with pytest.raises(TaggingFormatError, match=r"test\.txt:3: expected 2 columns \(as on the first token line\), "
                                                  r"found 1"):
        task.dataset_from_file(str(bad))
    bad.write_text("john B-PER\nsmith B-ANIMAL\n\n")
    with pytest.raises(TaggingFormatError, match=r"test\.txt:2: tag 'B-ANIMAL' was not seen in training"):
        task.dataset_from_file(str(bad))
    bad.write_text("x O\n\n" + "".join(f"w{i} O\n" for i in range(40)) + "\n")
    with pytest.raises(TaggingFormatError, match=r"test\.txt:3: sentence of 40 tokens is longer than the position "
                                                  r"table \(--max-positions 16\)"):
        task.dataset_from_file(str(bad))
    with pytest.raises(TaggingFormatError, match=r"test\.txt:1: 2 column\(s\), but --word-column 0 / --tag-column 3"):
        from user_dir.tasks.sequence_tagging import read_conll
        bad.write_text("john B-PER\n")
        read_conll(str(bad), 0, 3)


def test_masked_summation_train(tmp_path):
    args = ["--task", "masked_summation", "--criterion", "masked_summation_mse", "--seq-len", 24,
            "--min-seq-len", 12, "--num-columns", 3, "--train-size", 64, "--valid-size", 16, "--test-size", 16]
    save = tmp_path / "ck"
    out = cli.fairseq("train", *args, *TINY, *TRAIN, "--max-update", 40, "--lr", "1e-2", "--save-dir", save,
                      "--valid-subset", "valid,test")
    text = out.stdout + out.stderr
    first = float(re.findall(r"\| mse ([\d.]+)", text)[0])
    test_mse = float(re.search(r"valid on 'test' subset \| loss [\d.]+ \| mse ([\d.]+)", text).group(1))
    # targets are sums of 3 values ~U(0,1) per column: each has variance 1/4 around its mean 1.5, so a model
    # that learnt the mean reaches ~0.25; predicting ~0 (untrained) gives ~2.5
    assert test_mse < 1.0, (first, test_mse)


def test_nmt_padding_incremental_and_generate(toy_translation_bin, tmp_path):
    nmt = ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
           "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
           "--dropout", "0"]
    model, d = build("star_transformer_nmt", nmt)
    src = random_sentences(d, [6, 2, 4], seed=3)
    tgt = random_sentences(d, [3, 5, 4], seed=4)
    prev = [prev_output(t, d.eos()) for t in tgt]
    assert_padding_invariant(model, src, prev, d.pad(), left_pad_source=True)
    assert_padding_invariant(model, src, prev, d.pad(), left_pad_source=False)
    same_length = [prev_output(t, d.eos()) for t in random_sentences(d, [5, 5, 5], seed=6)]
    assert_beam_reorder(model, src, same_length, d.pad())  # distinct beams, reordered and shrunk
    ck = cli.train_translation(toy_translation_bin, tmp_path / "ck", "star_transformer_nmt", *nmt, max_update=4)
    out = cli.fairseq("generate", toy_translation_bin, "--path", ck, "--beam", 3, "--batch-size", 8,
                      "--max-len-b", 10, "--cpu", "--gen-subset", "valid")
    hyps = [line for line in out.stdout.splitlines() if line.startswith("H-")]
    assert len(hyps) > 10


def test_nmt_alignment_covers_source_tokens_only(toy_translation_bin, tmp_path):
    """The relay is an extra memory slot of the decoder, not a source token: the attention the model
    returns, and so ``--print-alignment``, index the source tokens (the relay's column made fairseq's
    alignment extraction fail with a KeyError, or shift every soft alignment by one)."""
    nmt = ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
           "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2"]
    for flags in ([], ["--no-decoder-attends-relay"]):
        model, d = build("star_transformer_nmt", nmt + flags)
        model.eval()
        src = random_sentences(d, [6], seed=3)[0].unsqueeze(0)
        prev = prev_output(random_sentences(d, [3], seed=4)[0], d.eos()).unsqueeze(0)
        attn = model(src, torch.tensor([src.size(1)]), prev)[1]["attn"][0]
        assert attn.shape == (1, prev.size(1), src.size(1)), flags
    ck = cli.train_translation(toy_translation_bin, tmp_path / "ck", "star_transformer_nmt", *nmt, max_update=2)
    out = cli.fairseq("generate", toy_translation_bin, "--path", ck, "--beam", 3, "--batch-size", 8,
                      "--max-len-b", 10, "--cpu", "--gen-subset", "valid", "--print-alignment").stdout
    sources = {line.split("\t")[0][2:]: line.split("\t")[1].split() for line in out.splitlines() if line.startswith("S-")}
    aligned = [line.split("\t") for line in out.splitlines() if line.startswith("A-")]
    assert len(aligned) == len(sources) > 10
    for head, pairs in aligned:
        assert all(int(p.split("-")[0]) < len(sources[head[2:]]) for p in pairs.split()), (head, pairs)


def test_hub_from_pretrained(sst_bin, sst_hydra_run):
    """StarTransformerModel.from_pretrained: checkpoint dir + data -> predict / extract_features, as RoBERTa's hub."""
    from user_dir.models.star_transformer import StarTransformerModel

    ck, _ = sst_hydra_run
    hub = StarTransformerModel.from_pretrained(str(ck), checkpoint_file="checkpoint_last.pt",
                                               data_name_or_path=str(sst_bin)).eval()
    head = "sentence_classification_head"
    sentences = ["good movie", "the plot was dull and the film awful", "nice"]
    tokens = [hub.encode(s) for s in sentences]
    assert hub.decode(tokens[0]) == "good movie"
    with torch.no_grad():
        batch = hub.predict(head, tokens)
        single = torch.cat([hub.predict(head, t) for t in tokens])
        logits = hub.predict(head, tokens[1], return_logits=True)
        feats = hub.extract_features(tokens)
    assert batch.shape == (3, 5)
    assert torch.allclose(batch.exp().sum(-1), torch.ones(3), atol=1e-5)
    assert torch.allclose(batch, single, atol=1e-5)  # padding in the batch changes nothing
    assert torch.allclose(logits.log_softmax(-1), single[1], atol=1e-5)
    assert feats.shape == (3, len(tokens[1]), 16)
    assert hub.predict_label(head, sentences[0]) in {str(c) for c in range(5)}
    # the hub runs the same model fairseq-train saved: same logits as the checkpoint loaded by hand
    state = torch.load(ck / "checkpoint_last.pt", weights_only=False)["model"]
    assert torch.equal(state["classification_heads.sentence_classification_head.out_proj.weight"],
                       hub.model.classification_heads[head].out_proj.weight)
    with pytest.raises(KeyError, match="no classification head"):
        hub.predict("nope", tokens[0])
    with pytest.raises(ValueError, match="classifies single sentences: pair= is for"):
        hub.predict(head, tokens[0], pair=tokens[1])
    with pytest.raises(ValueError, match="trained with --task sentence_prediction, not sequence_tagging"):
        hub.tag("good movie")


def test_checkpoint_trained_with_word_vectors_loads_without_the_file(sst_bin, tmp_path):
    """--pretrained-embeddings is read to train; a trained checkpoint holds the vectors, so fairseq-validate and
    the hub load it after the file is gone (before: FileNotFoundError, and GloVe 840B read again at every load)."""
    from fairseq.data import Dictionary

    from user_dir.models.star_transformer import StarTransformerModel

    vectors = tmp_path / "vectors.txt"
    words = {w: [round(0.1 * (i + 1) * (-1) ** j, 3) for j in range(16)] for i, w in enumerate(WORDS)}
    vectors.write_text("".join(f"{w} {' '.join(map(str, v))}\n" for w, v in words.items()))
    train = ["--task", "sentence_prediction", "--criterion", "sentence_prediction", "--num-classes", 5, *TINY,
             *TRAIN, "--freeze-embeddings"]
    missing = cli.fairseq("train", sst_bin, *train, "--pretrained-embeddings", tmp_path / "absent.txt",
                          "--save-dir", tmp_path / "none", check=False)
    assert missing.returncode != 0  # training still needs the file, and says which
    assert "--pretrained-embeddings: file not found:" in missing.stderr and "absent.txt" in missing.stderr
    cli.fairseq("train", sst_bin, *train, "--pretrained-embeddings", vectors, "--save-dir", tmp_path / "ck")
    vectors.unlink()
    out = cli.fairseq("validate", sst_bin, "--task", "sentence_prediction", "--criterion", "sentence_prediction",
                      "--num-classes", 5, "--path", tmp_path / "ck" / "checkpoint_last.pt", "--valid-subset",
                      "test", "--batch-size", 8, "--cpu")
    assert "not read, the checkpoint holds the vectors" in out.stdout + out.stderr
    assert 0.0 <= _metric(out.stdout + out.stderr, "accuracy") <= 100.0
    hub = StarTransformerModel.from_pretrained(str(tmp_path / "ck"), checkpoint_file="checkpoint_last.pt",
                                               data_name_or_path=str(sst_bin))
    table = hub.model.encoder.embed_tokens.weight
    d = Dictionary.load(os.path.join(sst_bin, "input0", "dict.txt"))
    for w, v in words.items():  # frozen: the file's vectors, restored from the checkpoint
        assert torch.allclose(table[d.index(w)], torch.tensor(v)), w


def test_converged_experiment_script_writes_a_row(tmp_path):
    """benchmarks/star_transformer/converged.sh sst5 on a fake SST corpus (tiny Star, 2 epochs): one row with the
    dev and test accuracy; run again, nothing is repeated; an interrupted run gives no row."""
    import json

    raw = tmp_path / "raw"
    raw.mkdir()
    rng = random.Random(1)
    for split, n in (("train", 40), ("dev", 12), ("test", 12)):
        (raw / f"stsa.fine.{split}").write_text("".join(f"{rng.randint(0, 4)} {s}\n" for s in _sentences(n, rng)))
    results, work = tmp_path / "rows.json", tmp_path / "w"
    env = {"RAW": str(raw), "MAX_EPOCH": "2", "RESULTS": str(results), "PYTHON": cli.tool("python"),
           "STAR_ARGS": "--encoder-embed-dim 16 --encoder-attention-heads 2 --encoder-head-dim 0 "
                        "--classifier-hidden-dim 8"}
    cmd = ["bash", os.path.join(cli.ROOT, "benchmarks/star_transformer/converged.sh"), "sst5", "star", 1, work]
    cli.run(cmd, env=env)
    (row,) = json.load(open(results))
    assert (row["task"], row["model"], row["seed"], row["epochs"], row["converged"]) == ("sst5", "star", 1, 2, False)
    assert 0 <= row["test"] <= 100 and 0 <= row["best_dev"] <= 100
    assert json.loads(cli.run(cmd, env=env).stdout) == row  # finished: not repeated
    (work / "result.json").unlink()
    (log,) = work.glob("train_*.log")
    log.write_text(log.read_text().split("epoch 002 | valid")[0])
    proc = cli.run(["bash", "-c", f"cd {cli.ROOT} && {cli.tool('python')} benchmarks/star_transformer/converged_rows.py "
                    f"--work {work} --task sst5 --model star --seed 1 --max-epoch 2 --command x"], check=False)
    assert proc.returncode != 0 and "interrupted run" in proc.stderr


@pytest.mark.parametrize("model", ["transformer", "bilstm"])
def test_converged_script_runs_masked_summation(model, tmp_path):
    """converged.sh masked_sum (tiny: n 16, 64 samples per split, 2 epochs) for a baseline on continuous inputs
    (the Transformer, the paper's BiLSTM): one row keyed by the sequence length, with the lowest dev MSE as best."""
    import json

    results = tmp_path / "rows.json"
    env = {"N": "16", "SAMPLES": "64", "MAX_EPOCH": "2", "RESULTS": str(results), "PYTHON": cli.tool("python")}
    cli.run(["bash", os.path.join(cli.ROOT, "benchmarks/star_transformer/converged.sh"), "masked_sum", model, 1,
             tmp_path / "w"], env=env)
    (row,) = json.load(open(results))
    assert (row["task"], row["n"], row["model"], row["metric"], row["epochs"]) == ("masked_sum", 16, model, "mse", 2)
    dev = [float(x) for x in re.findall(r"valid on 'valid' subset \| loss [\d.]+ \| mse ([\d.]+)",
                                        (tmp_path / "w" / "train_masked_sum.log").read_text())]
    assert row["best_dev"] == min(dev) and row["test"] > 0
    assert row["command"].startswith("N=16 SAMPLES=64 MAX_EPOCH=2") and row["lr"] == 1e-3
    # the command reproduces the row: a non-default results file and work directory are part of it
    assert f"RESULTS={results} " in row["command"] and row["command"].endswith(f"masked_sum {model} 1 {tmp_path / 'w'}")


def test_converged_script_min_epoch_holds_off_the_patience_rule(tmp_path):
    """converged.sh masked_sum with MIN_EPOCH: at learning rate 0 dev MSE never improves after epoch 1, so patience 1
    would stop the run after epoch 2; MIN_EPOCH=4 keeps it training to epoch 4, where the count (3 validations since
    the best, carried across the two fairseq-train calls) stops it, and the row's command names the minimum.  Run
    again with the same minimum, nothing is trained; with MIN_EPOCH=6 the stopped run continues from its checkpoint
    to epoch 6 and stops there, its row replaced."""
    import json

    results = tmp_path / "rows.json"
    env = {"N": "16", "SAMPLES": "64", "LR": "0", "PATIENCE": "1", "MIN_EPOCH": "4", "MAX_EPOCH": "8",
           "RESULTS": str(results), "PYTHON": cli.tool("python")}
    cmd = ["bash", os.path.join(cli.ROOT, "benchmarks/star_transformer/converged.sh"), "masked_sum", "lstm", 1,
           tmp_path / "w"]
    cli.run(cmd, env=env)
    (row,) = json.load(open(results))
    assert (row["epochs"], row["min_epoch"], row["converged"]) == (4, 4, True)
    assert row["command"].startswith("N=16 LR=0 SAMPLES=64 MIN_EPOCH=4 MAX_EPOCH=8 PATIENCE=1 ")
    log = (tmp_path / "w" / "train_masked_sum.log").read_text()
    cli.run(cmd, env=env)
    assert (tmp_path / "w" / "train_masked_sum.log").read_text() == log
    cli.run(cmd, env=dict(env, MIN_EPOCH="6"))
    (row,) = json.load(open(results))
    assert (row["epochs"], row["min_epoch"], row["converged"]) == (6, 6, True), row
    assert row["command"].startswith("N=16 LR=0 SAMPLES=64 MIN_EPOCH=6 MAX_EPOCH=8 PATIENCE=1 ")
    more = (tmp_path / "w" / "train_masked_sum.log").read_text()[len(log):]
    # continued from the end of epoch 4 (1 update an epoch: 64 samples, batch 64), not started again
    assert re.search(r"Loaded checkpoint \S+checkpoint_last\.pt \(epoch \d+ @ 4 updates\)", more), more[-3000:]
    assert "epoch 005 | valid" in more and "epoch 007 | valid" not in more


def test_convergence_summary_pairs_seeds_and_writes_claims(tmp_path, capsys):
    """summarize_converged.py: mean ± s.e. per model, Star − Transformer paired over common seeds, capped runs
    marked; for masked summation lower is better and the claim takes the longest n with paired seeds."""
    import json

    from tests.helpers.cli import load_script

    def row(task, model, seed, test, n=None, converged=True):
        r = {"task": task, "model": model, "seed": seed, "test": test, "epochs": 9, "converged": converged,
             "metric": {"sst5": "accuracy", "masked_sum": "mse"}[task]}
        return dict(r, n=n) if n else r

    rows = [row("sst5", "star", 1, 42.0), row("sst5", "star", 2, 41.0), row("sst5", "star", 3, 40.0, converged=False),
            row("sst5", "transformer", 1, 40.0), row("sst5", "transformer", 2, 40.0),
            row("masked_sum", "star", 1, 0.10, n=100), row("masked_sum", "transformer", 1, 0.20, n=100),
            row("masked_sum", "star", 2, 0.12, n=100), row("masked_sum", "transformer", 2, 0.22, n=100),
            dict(row("masked_sum", "star", 1, 0.5, n=200), min_epoch=20)]
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    claims = tmp_path / "claims.json"
    load_script("benchmarks/star_transformer/summarize_converged.py").main(
        ["--results", str(tmp_path / "rows.json"), "--claims", str(claims)])
    out = capsys.readouterr().out
    assert ("| star | 1: 42, 2: 41, 3: 40 | 41 ± 0.58 | 9, 9, 9 (capped) | +1.5 ± 0.5 (t-test p = 0.205, sign-flip "
            "p = 0.50, ahead in 2 of 2) | within noise |") in out
    # lower MSE by the same 0.1 in both seeds: a paired difference without spread is significant
    assert "| star | 1: 0.1, 2: 0.12 |" in out and "-0.1 ± 0 (t-test p = 0.000, sign-flip p = 0.50, ahead in 2 of 2) | Star ahead |" in out
    by_id = {c["id"]: c for c in json.load(open(claims))}
    assert by_id["star_sst5"]["ours"] == [42.0, 41.0] and by_id["star_sst5"]["baseline"] == [40.0, 40.0]
    assert by_id["star_masked_sum"]["n"] == 100 and by_id["star_masked_sum"]["ours"] == [0.10, 0.12]
    assert by_id["star_masked_sum"]["by_n"] == {  # n = 200, one seed: not the claim's pair, but listed
        "100": {"star": {"1": 0.10, "2": 0.12}, "transformer": {"1": 0.20, "2": 0.22}}, "200": {"star": {"1": 0.5}}}
    assert "star_conll03" not in by_id  # no CoNLL rows yet
    assert "| star | 1: 0.5 | 0.5 | 9 (min 20) | — | — |" in out  # a run held to a minimum epoch count says so


def test_convergence_summary_reports_each_model_at_its_learning_rate_chosen_on_dev(tmp_path, capsys):
    """Masked summation with runs at two learning rates: each model is reported at the one with the lower mean
    dev MSE over the seeds both have (a lower test MSE at the other does not count), and the claim says which;
    a run whose dev MSE never fell below predicting the mean (10 / 12) is marked failed."""
    import json

    from tests.helpers.cli import load_script

    def row(model, seed, lr, dev, test):
        return {"task": "masked_sum", "n": 200, "lr": lr, "model": model, "seed": seed, "metric": "mse",
                "best_dev": dev, "test": test, "epochs": 9, "converged": True}

    rows = [row("star", 1, 1e-3, 0.04, 0.041), row("star", 2, 1e-3, 0.05, 0.052), row("star", 3, 1e-3, 0.8, 0.8),
            row("transformer", 1, 1e-3, 0.16, 0.01), row("transformer", 2, 1e-3, 1.49, 1.48),  # best test, worse dev
            row("transformer", 1, 5e-4, 0.10, 0.11), row("transformer", 2, 5e-4, 0.12, 0.13),
            row("transformer", 3, 5e-4, 9.0, 9.0),  # a seed the other rate lacks: not in the choice
            row("lstm", 1, 1e-3, 0.9, 0.86), row("lstm", 2, 1e-3, 0.95, 0.91)]
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    claims = tmp_path / "claims.json"
    load_script("benchmarks/star_transformer/summarize_converged.py").main(
        ["--results", str(tmp_path / "rows.json"), "--claims", str(claims)])
    out = capsys.readouterr().out
    assert "| star (lr 0.001) | 1: 0.041, 2: 0.052, 3: 0.8 |" in out and "| 9, 9, 9 | " in out  # 0.8 < 10 / 12
    assert "| transformer (lr 0.0005, chosen on mean dev mse: 0.0005: 0.11, 0.001: 0.825) | 1: 0.11, 2: 0.13, 3: 9 |" in out
    assert "| 9, 9, 9 (failed) |" in out
    (claim,) = json.load(open(claims))
    assert claim["baseline"] == [0.11, 0.13, 9.0] and claim["lr"] == {"star": 1e-3, "transformer": 5e-4}
    assert claim["failed_seeds"] == {"star": [], "transformer": [3]}
    assert claim["recurrent_baselines"] == {"lstm": {"1": 0.86, "2": 0.91}}  # the paper's LSTM beside the pair
    assert claim["command"].startswith("N=200 LR=<star 0.001, transformer 0.0005> ")
