"""``examples/transformer_xl/convert_hf_checkpoint.py``: a HuggingFace ``TransfoXLLMHeadModel`` directory
becomes a fairseq ``transformer_xl_lm`` checkpoint + ``dict.txt``.

A small random HF model and a TransfoXLTokenizer vocabulary built from a toy text are saved with
``save_pretrained``; the converter writes the checkpoint and binarizes a test text with the converted
dictionary; ``fairseq-eval-lm`` (the real CLI) must print, token by token, HF's log-probabilities for
the same segments and memory.  transformers (4.35.2) is the test-only oracle; no internet.
"""
import math
import os
import random
import re
import warnings

import pytest
import torch

from tests.helpers.cli import USER_DIR, fairseq, load_script, script

transformers = pytest.importorskip("transformers")

SCRIPT = "examples/transformer_xl/convert_hf_checkpoint.py"
SEGMENT = 7  # --tokens-per-sample of the evaluation (HF is fed the same segments)
CASES = {
    # div_val 1 with projections (d_embed != d_model), per-layer u/v, tied weights, safetensors
    "div_val1": dict(div_val=1, d_embed=12, untie_r=True, proj_share_all_but_first=True, mem_len=9,
                     clamp_len=5, same_length=True, pre_lnorm=False, tie_word_embeddings=True, safe=True),
    # div_val 2, shared u/v, untied projections and output weights, pre-norm, pytorch_model.bin, lower-case
    "div_val2": dict(div_val=2, d_embed=16, untie_r=False, proj_share_all_but_first=False, mem_len=6,
                     clamp_len=-1, same_length=False, pre_lnorm=True, tie_word_embeddings=False, safe=False,
                     lower_case=True),
}
CUTOFFS = [8, 20]


def _converter():
    return load_script(SCRIPT)


def _lines(rng, n, words, weights):
    out = []
    for _ in range(n):
        k = rng.choice([0, 2, 5, 9, 13])  # some empty lines: each is one </s> (<eos>) token
        out.append(" ".join(rng.choices(words, weights, k=k)))
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Vocabulary text (all words + frequent ``<unk>``) and a test text with an out-of-vocabulary word."""
    rng = random.Random(0)
    words = [f"w{i}" for i in range(34)] + ["<unk>"]
    weights = [1.0 / (i + 1) for i in range(34)] + [0.3]
    train = _lines(rng, 300, words, weights) + [" ".join(words)]
    test = _lines(rng, 30, words, weights)
    test[3] += " never-seen-word"
    test[5] += " W1 W2"  # <unk> for a case-sensitive vocabulary, w1 w2 for a lower-case one
    path = tmp_path_factory.mktemp("text") / "test.txt"
    path.write_text("\n".join(test) + "\n", encoding="utf-8")
    return train, test, str(path)


def _save_hf(directory, train_lines, opts):
    from transformers import TransfoXLConfig, TransfoXLLMHeadModel, TransfoXLTokenizer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tok = TransfoXLTokenizer(special=["<eos>"], lower_case=opts.get("lower_case", False))
        tok.count_sents([line.split() + ["<eos>"] for line in train_lines])
        tok.build_vocab()
        config = TransfoXLConfig(
            vocab_size=len(tok.idx2sym), cutoffs=CUTOFFS, d_model=16, d_embed=opts["d_embed"], n_head=2, d_head=8,
            d_inner=24, div_val=opts["div_val"], n_layer=2, mem_len=opts["mem_len"], clamp_len=opts["clamp_len"],
            same_length=opts["same_length"], pre_lnorm=opts["pre_lnorm"], untie_r=opts["untie_r"],
            proj_share_all_but_first=opts["proj_share_all_but_first"],
            tie_word_embeddings=opts["tie_word_embeddings"], dropout=0.0, dropatt=0.0, trainer_compatible=True)
        model = TransfoXLLMHeadModel(config)
    torch.manual_seed(5)
    with torch.no_grad():  # random values everywhere, large enough for peaked, context-dependent scores
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    model.eval()
    tok.save_pretrained(directory)
    model.save_pretrained(directory, safe_serialization=opts["safe"])
    return model, tok


@pytest.fixture(scope="module", params=sorted(CASES))
def converted(request, corpus, tmp_path_factory):
    train, test, test_path = corpus
    opts = CASES[request.param]
    hf_dir, out_dir = tmp_path_factory.mktemp("hf"), tmp_path_factory.mktemp("fairseq")
    hf, tok = _save_hf(hf_dir, train, opts)
    proc = script(SCRIPT, hf_dir, out_dir, "--testpref", test_path, "--validpref", test_path,
                  "--trainpref", test_path)
    flags = re.search(r"--finetune-from-model \S+ (.*) \.\.\.$", proc.stdout.strip()).group(1).split()
    return hf, tok, str(out_dir), test, flags


def _hf_ids(tok, lines):
    """The reference corpus encoding: (lower-cased if the tokenizer is), whitespace split, ``<eos>`` after
    every line, OOV → ``<unk>``."""
    unk = tok.sym2idx["<unk>"]
    lines = [line.lower() for line in lines] if tok.lower_case else lines
    ids = [tok.sym2idx.get(w, unk) for line in lines for w in line.split() + ["<eos>"]]
    return torch.tensor(ids)


def _empty_mems(hf, bsz):
    """The reference's initial memory: empty.  (HF's ``mems=None`` starts from ``mem_len`` zero states.)"""
    return [torch.zeros(0, bsz, hf.config.d_model) for _ in range(hf.config.n_layer)]


def _hf_stream_scores(hf, stream, segment):
    """HF log-probs of ``stream[1:]``, fed in segments of ``segment`` tokens with memory (as ``bptt_lm``
    with one stream: batch i predicts ``stream[i*T+1 : (i+1)*T+1]``)."""
    scores, mems = [], _empty_mems(hf, 1)
    with torch.no_grad():
        for start in range(0, len(stream) - 1, segment):
            inp = stream[start: min(start + segment, len(stream) - 1)]
            out = hf(input_ids=inp[None], mems=mems, return_dict=True)
            target = stream[start + 1: start + 1 + len(inp)]
            scores.append(out.prediction_scores[0].gather(-1, target[:, None]).squeeze(-1))
            mems = out.mems
    return torch.cat(scores)


def _word_probs(text):
    """``(word, log-prob)`` pairs that ``fairseq-eval-lm --output-word-probs`` prints, in order."""
    pairs = []
    for line in text.splitlines():
        m = re.search(r"fairseq_cli\.eval_lm(?: \| |:)\d+ (.*)$", line)  # (either logging format)
        if m:
            for entry in m.group(1).split("\t"):
                word, value = entry.rsplit(" [", 1)
                pairs.append((word, float(value.rstrip("]"))))
    return pairs


def test_eval_lm_scores_every_token_as_huggingface(converted):
    """Through the real CLIs: the converted checkpoint and the binarized text in fairseq-eval-lm give
    HF's log-probability for every test token (same segments, same memory, same eval options)."""
    hf, tok, out_dir, test, _ = converted
    stream = torch.cat([torch.tensor([tok.sym2idx["<eos>"]]), _hf_ids(tok, test)])  # bptt_lm: </s> in front
    expected = _hf_stream_scores(hf, stream, SEGMENT)
    proc = fairseq("eval-lm", out_dir, "--task", "bptt_lm", "--path", os.path.join(out_dir, "checkpoint.pt"),
                   "--gen-subset", "test", "--batch-size", 1, "--tokens-per-sample", SEGMENT, "--cpu",
                   "--num-workers", 0, "--output-word-probs")
    text = proc.stdout + proc.stderr
    got = _word_probs(text)
    assert len(got) == len(expected) == len(stream) - 1
    hf_words = [tok.idx2sym[i] for i in stream[1:].tolist()]
    assert [w for w, _ in got] == [{"<eos>": "</s>"}.get(w, w) for w in hf_words]
    assert "<unk>" in hf_words  # the OOV word and the literal <unk> both hit HF's <unk>
    diff = max(abs(lp - e) for (_, lp), e in zip(got, expected.tolist()))
    assert diff <= 1e-5 + 5e-7, f"fairseq-eval-lm log-probs differ from HF's by {diff:.3g}"  # (+ print rounding)
    n = int(re.search(r"Evaluated ([\d,]+) tokens", text).group(1).replace(",", ""))
    ppl = float(re.search(r"Perplexity: ([\d.]+)", text).group(1))
    assert n == len(expected)
    assert ppl == pytest.approx(math.exp(-expected.mean().item()), rel=1e-3, abs=0.006)
    # the memory matters for these scores (a conversion that lost it would not pass by chance)
    alone = torch.cat([_hf_stream_scores(hf, stream[s: s + SEGMENT + 1], SEGMENT)
                       for s in range(0, len(stream) - 1, SEGMENT)])
    assert (alone - expected).abs().max() > 1e-2


def test_every_hf_token_keeps_its_probability(converted):
    """Loaded as hub ``from_pretrained`` does: over random input, every HF token's log-probability in
    the converted model equals HF's (all clusters, not only the test text's tokens); ``<s>``/``<pad>``
    get probability 0."""
    from user_dir.models.transformer_xl_lm import TransformerXLLanguageModel

    hf, tok, out_dir, _, _ = converted
    hub = TransformerXLLanguageModel.from_pretrained(out_dir, "checkpoint.pt", user_dir=USER_DIR)
    model = hub.models[0]  # (in eval mode: the hub prepared it for inference)
    assert not model.training
    d = hub.task.dictionary
    assert (d.bos(), d.pad(), d.eos(), d.unk()) == (0, 1, 2, 3)
    new_to_hf = [-1 if d[j] in ("<s>", "<pad>") else tok.sym2idx[{"</s>": "<eos>"}.get(d[j], d[j])]
                 for j in range(len(d))]
    assert sorted(i for i in new_to_hf if i >= 0) == list(range(len(tok.idx2sym)))
    hf_to_new = torch.tensor([new_to_hf.index(i) for i in range(len(tok.idx2sym))])
    g = torch.Generator().manual_seed(3)
    mems_hf, mems_fs = _empty_mems(hf, 2), None
    with torch.no_grad():
        for _ in range(3):
            ids = torch.randint(0, len(tok.idx2sym), (2, 5), generator=g)
            out = hf(input_ids=ids, mems=mems_hf, return_dict=True)
            hid, extra = model.decoder(hf_to_new[ids], mems=mems_fs)
            lp = model.get_normalized_probs((hid, extra), log_probs=True)
            assert lp.shape[-1] == len(tok.idx2sym) + 2
            diff = (lp[..., hf_to_new] - out.prediction_scores).abs().max().item()
            assert diff <= 1e-5, f"log-probs of HF tokens differ by {diff:.3g}"
            assert lp[..., [d.bos(), d.pad()]].max() < -9000
            mems_hf, mems_fs = out.mems, extra["mems"]


def test_finetuning_starts_from_the_converted_weights(converted, tmp_path):
    """``fairseq-train --finetune-from-model`` with the flags the converter prints rebuilds the same model:
    with learning rate 0 its validation loss is HF's on the same text."""
    hf, tok, out_dir, test, flags = converted
    proc = fairseq("train", out_dir, "--task", "bptt_lm", "--finetune-from-model",
                   os.path.join(out_dir, "checkpoint.pt"), *flags, "--batch-size", 1, "--tokens-per-sample", SEGMENT,
                   "--optimizer", "adam", "--lr", 0, "--max-update", 1, "--save-dir", tmp_path, "--no-save", "--cpu",
                   "--no-progress-bar", "--log-format", "simple", "--num-workers", 0)
    loss = float(re.search(r"valid on 'valid' subset \| loss ([\d.]+)", proc.stdout + proc.stderr).group(1))
    stream = torch.cat([torch.tensor([tok.sym2idx["<eos>"]]), _hf_ids(tok, test)])
    expected = -_hf_stream_scores(hf, stream, SEGMENT).mean().item() / math.log(2)  # (fairseq logs base 2)
    assert loss == pytest.approx(expected, abs=6e-4)


def test_bad_input_gives_one_clear_error_line(tmp_path):
    missing = tmp_path / "nothing-here"
    proc = script(SCRIPT, missing, tmp_path / "out", check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"convert_hf_checkpoint.py: error: {missing}: not a directory"]


def test_missing_text_is_reported_before_converting(tmp_path):
    conv = _converter()
    with pytest.raises(conv.ConversionError, match=r"^--testpref \S+/wiki.test.tokens: file not found$"):
        conv.convert(str(tmp_path), str(tmp_path / "out"), {"test": str(tmp_path / "wiki.test.tokens")})
    assert not (tmp_path / "out").exists()


def _write(directory, name, text):
    directory.mkdir(exist_ok=True)
    (directory / name).write_text(text, encoding="utf-8")


CONFIG = ('{"model_type": "transfo-xl", "vocab_size": 40, "cutoffs": [8, 20], "d_model": 16, "n_head": 2, '
          '"d_head": 8, "d_inner": 24, "n_layer": 1%s}')


@pytest.mark.parametrize("config, vocab, message", [
    (None, None, "config.json not found"),
    ('{"model_type": "gpt2", "vocab_size": 5}', None, "model_type 'gpt2' (architectures []) is not a TransfoXL model"),
    (CONFIG % ', "attn_type": 2', None, "attn_type 2 is not supported"),
    (CONFIG % ', "cutoffs": [20, 8]', None, "cutoffs [20, 8] must be increasing"),
    (CONFIG % ', "div_val": 2, "tie_projs": [true, false, true]', None, "tie_projs [True, False, True] is not supported"),
    (CONFIG % "", None, "no vocabulary (vocab.pkl, vocab.bin or vocab.txt"),
    (CONFIG % "", ["<eos>"] + [f"w{i}" for i in range(38)], "the vocabulary has 39 symbols, config.json vocab_size is 40"),
    (CONFIG % "", [f"w{i}" for i in range(39)] + ["<unk>"], "no end-of-line symbol '<eos>'"),
    (CONFIG % "", ["<eos>"] + [f"w{i}" for i in range(38)] + ["<unk>"],
     "'<unk>' (HF id 39) is outside the softmax head (first cutoff 8)"),
    (CONFIG % "", ["<eos>", "<unk>", "</s>"] + [f"w{i}" for i in range(37)],
     "HF token '</s>' (id 2) has the name of a fairseq special symbol"),
    (CONFIG % "", ["<eos>", "<unk>"] + [f"w{i}" for i in range(38)], "the weights have no"),
])
def test_bad_input_errors_name_the_problem(tmp_path, config, vocab, message):
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    if config is not None:
        _write(hf_dir, "config.json", config)
    if vocab is not None:
        _write(hf_dir, "vocab.txt", "\n".join(vocab) + "\n")
    if message == "the weights have no":
        torch.save({"transformer.foo": torch.zeros(2)}, hf_dir / "pytorch_model.bin")
    conv = _converter()
    with pytest.raises(conv.ConversionError) as err:
        conv.convert(str(hf_dir), str(tmp_path / "out"))
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_vocabulary_files_are_read_without_running_code(tmp_path):
    """``vocab.pkl`` as ``save_pretrained`` writes it (a pickle) and as the hub has it (``torch.save``,
    legacy and zip format): the symbols come back, and a global that would run code is never called."""
    import collections
    import pickle

    marker = tmp_path / "code-ran"

    class Evil:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    symbols = ["<eos>", "the", "<unk>", "a"]
    vocab = {"idx2sym": symbols, "sym2idx": collections.OrderedDict((s, i) for i, s in enumerate(symbols)),
             "counter": collections.Counter({"the": 5, "a": 2}), "lower_case": True, "delimiter": None,
             "moses": Evil()}
    writers = {
        "pickle": lambda f: pickle.dump(vocab, f),
        "torch_legacy": lambda f: torch.save(vocab, f, _use_new_zipfile_serialization=False),
        "torch_zip": lambda f: torch.save(vocab, f),
    }
    conv = _converter()
    for name, write in writers.items():
        directory = tmp_path / name
        directory.mkdir()
        with open(directory / ("vocab.bin" if name == "torch_legacy" else "vocab.pkl"), "wb") as f:
            write(f)
        got, counter, eos, unk, lower_case, delimiter = conv.read_vocab(str(directory))
        assert (got, counter["the"], eos, unk, lower_case, delimiter) == (symbols, 5, "<eos>", "<unk>", True, None)
    assert not marker.exists()


def test_sharded_weights_are_merged(tmp_path):
    import json

    torch.save({"a": torch.ones(2)}, tmp_path / "pytorch_model-00001-of-00002.bin")
    torch.save({"b": torch.zeros(3)}, tmp_path / "pytorch_model-00002-of-00002.bin")
    index = {"weight_map": {"a": "pytorch_model-00001-of-00002.bin", "b": "pytorch_model-00002-of-00002.bin"}}
    (tmp_path / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    state = _converter().read_weights(str(tmp_path))
    assert sorted(state) == ["a", "b"] and state["b"].shape == (3,)


def test_vocabulary_map_keeps_every_cluster():
    """fairseq ids → HF ids (-1: new row) and the shifted cutoffs, with and without an HF ``<unk>``."""
    conv = _converter()
    symbols = ["<eos>", "the", "<unk>", "a", "b", "c"]
    assert conv.vocabulary_map(symbols, "<eos>", "<unk>", [4], "x") == ([-1, -1, 0, 2, 1, 3, 4, 5], [6])
    no_unk = ["<eos>", "the", "a", "b"]
    assert conv.vocabulary_map(no_unk, "<eos>", "<unk>", [2], "x") == ([-1, -1, 0, -1, 1, 2, 3], [5])
