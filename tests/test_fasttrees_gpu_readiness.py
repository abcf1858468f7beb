"""FastTrees on a GPU's terms: float16 / bfloat16 / autocast for fasttrees_transformer, _lm and
_roberta, no host sync in the forward pass, and beam search checked with distinct beams."""
import pytest
import torch
from fairseq.data import data_utils

from tests.helpers import beam, cli, precision
from tests.helpers.host_sync import count_host_syncs
from tests.helpers.models import build, prev_output, random_sentences
from tests.test_fasttrees import TINY_LM, TINY_MT, VARIANTS
from tests.test_star_transformer_gpu_readiness import (
    CPU_HALF_PRECISION,
    assert_finite_half_precision_losses,
    syncs_while_decoding,
)

SIZE = ["--dropout", 0, "--max-source-positions", 256, "--max-target-positions", 256]
MT = ["--encoder-layers", 2, "--decoder-layers", 1, "--encoder-embed-dim", 32, "--decoder-embed-dim", 32,
      "--encoder-ffn-embed-dim", 64, "--decoder-ffn-embed-dim", 64, "--encoder-attention-heads", 2,
      "--decoder-attention-heads", 2, *SIZE]
LM = ["--decoder-layers", 2, "--decoder-embed-dim", 32, "--decoder-ffn-embed-dim", 64, "--decoder-attention-heads", 2,
      "--dropout", 0, "--tokens-per-sample", 256]
ROBERTA = ["--encoder-layers", 2, "--encoder-embed-dim", 32, "--encoder-ffn-embed-dim", 64,
           "--encoder-attention-heads", 2, "--dropout", 0, "--max-positions", 256, "--num-classes", 3]
DTYPES = pytest.mark.parametrize("dtype", precision.LOW_PRECISION, ids=["fp16", "bf16"])
MT_VARIANTS = pytest.mark.parametrize("variant", ["ffn", "conv"])


def _mt_batch(d, left_pad=True):
    """Sources of 130, 57 and 1 tokens, targets of 120, 30 and 1."""
    srcs = random_sentences(d, [129, 56, 0], seed=1)
    tokens = data_utils.collate_tokens(srcs, d.pad(), left_pad=left_pad)
    prev = data_utils.collate_tokens([prev_output(t, d.eos()) for t in random_sentences(d, [120, 30, 1], seed=2)],
                                     d.pad(), left_pad=False)
    return tokens, torch.tensor([len(s) for s in srcs]), prev


def _lm_batch(d):
    return data_utils.collate_tokens([prev_output(t, d.eos()) for t in random_sentences(d, [130, 40, 1], seed=3)],
                                     d.pad(), left_pad=False)


def _roberta_batch(d):
    sents = [torch.cat([torch.tensor([d.bos()]), s]) for s in random_sentences(d, [130, 40, 1], seed=4)]
    return data_utils.collate_tokens(sents, d.pad(), left_pad=False)


def _roberta(arch="fasttrees_roberta"):
    model, d = build(arch, [*ROBERTA, "--criterion", "sentence_prediction"], task="sentence_prediction")
    model.register_classification_head("cls", num_classes=3)
    return model, d


def _check(model, run, baseline, baseline_run, dtype):
    assert precision.sharpen_attention(model, 8.0) > 0 and precision.sharpen_attention(baseline, 8.0) > 0
    precision.assert_low_precision_close(model, run, baseline, baseline_run, dtype)


@DTYPES
@MT_VARIANTS
@pytest.mark.parametrize("left_pad", [True, False], ids=["left_pad", "right_pad"])
def test_fp16_bf16_fasttrees_transformer(dtype, variant, left_pad):
    model, d = build("fasttrees_transformer", MT + VARIANTS[variant] + ["--chunk-size", 4])
    baseline, _ = build("transformer", MT, dictionary=d)
    tokens, lengths, prev = _mt_batch(d, left_pad)

    def run(m):
        return m(tokens, lengths, prev)[0]

    _check(model, run, baseline, run, dtype)


@DTYPES
def test_fp16_bf16_fasttrees_transformer_lm(dtype):
    model, d = build("fasttrees_transformer_lm", LM + ["--chunk-size", 4], task="language_modeling")
    assert model.decoder.layers[0].normalize_before  # the baseline gets the same (pre-norm) placement
    baseline, _ = build("transformer_lm", LM + ["--decoder-normalize-before"], task="language_modeling", dictionary=d)
    tokens = _lm_batch(d)

    def run(m):
        return m(tokens)[0]

    _check(model, run, baseline, run, dtype)


@DTYPES
def test_fp16_bf16_fasttrees_roberta(dtype):
    model, d = _roberta()
    baseline, _ = build("roberta", [*ROBERTA, "--criterion", "sentence_prediction"], task="sentence_prediction",
                        dictionary=d)
    baseline.register_classification_head("cls", num_classes=3)
    tokens = _roberta_batch(d)

    def run(m):
        return m(tokens, features_only=True, classification_head_name="cls")[0]

    _check(model, run, baseline, run, dtype)


def test_autocast_bf16_forward_backward():
    model, d = build("fasttrees_transformer", MT + VARIANTS["conv"] + ["--fasttrees-bidirectional", "--chunk-size", 4])
    tokens, lengths, prev = _mt_batch(d)
    precision.assert_autocast_backward(model, lambda m: m(tokens, lengths, prev)[0])
    lm, d = build("fasttrees_transformer_lm", LM + ["--chunk-size", 4], task="language_modeling")
    precision.assert_autocast_backward(lm, lambda m: m(_lm_batch(d))[0])
    roberta, d = _roberta()
    tokens = _roberta_batch(d)
    precision.assert_autocast_backward(roberta, lambda m: m(tokens, features_only=True,
                                                             classification_head_name="cls")[0])


# ------------------------------------------------------------------------------------------ host syncs
@MT_VARIANTS
def test_no_host_sync_in_training_forward_or_incremental_decoding(variant):
    model, d = build("fasttrees_transformer", MT + VARIANTS[variant] + ["--chunk-size", 4])
    tokens, lengths, prev = _mt_batch(d)
    model.train()
    with count_host_syncs() as syncs:
        model(tokens, lengths, prev)[0].sum().backward()
    assert not syncs, f"host syncs in the training forward: {list(syncs)}"
    syncs = syncs_while_decoding(model.eval(), prev, src_tokens=tokens, src_lengths=lengths)
    assert not syncs, f"host syncs in incremental decoding: {list(syncs)}"


def test_no_host_sync_in_language_model():
    model, d = build("fasttrees_transformer_lm", LM + ["--chunk-size", 4], task="language_modeling")
    tokens = _lm_batch(d)
    with count_host_syncs() as syncs:
        model(tokens)[0].sum().backward()
    assert not syncs and not syncs_while_decoding(model, tokens), f"host syncs: {list(syncs)}"


# ---------------------------------------------------------------------------------------- beam search
def _rows(d):
    srcs = random_sentences(d, [5, 9, 3], seed=4)
    prevs = [prev_output(t, d.eos()) for t in random_sentences(d, [6, 6, 6], seed=5)]
    return srcs, prevs


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("left_pad", [True, False], ids=["left_pad", "right_pad"])
def test_beam_reorder_with_distinct_beams(variant, left_pad):
    model, d = build("fasttrees_transformer", TINY_MT + VARIANTS[variant])
    srcs, prevs = _rows(d)
    beam.assert_beam_reorder(model, srcs, prevs, d.pad(), left_pad_source=left_pad)


@pytest.mark.parametrize("variant", ["ffn", "conv"])
def test_language_model_beam_reorder_with_distinct_beams(variant):
    model, d = build("fasttrees_transformer_lm", TINY_LM + VARIANTS[variant], task="language_modeling")
    beam.assert_beam_reorder(model, None, _rows(d)[1], d.pad())


@pytest.mark.parametrize("mode", ["noop", "shrink_only"])
@pytest.mark.parametrize("arch", ["fasttrees_transformer", "fasttrees_transformer_lm"])
def test_beam_check_catches_a_broken_reorder(arch, mode):
    """Broken in the FastTrees sublayers alone (fairseq's attention caches reorder correctly), the
    cell and conv-window states are what the check must catch."""
    lm = arch.endswith("_lm")
    model, d = build(arch, (TINY_LM if lm else TINY_MT) + VARIANTS["conv"],
                     task="language_modeling" if lm else "translation")
    srcs, prevs = _rows(d)
    from user_dir.modules.fasttrees_layer import FastTreesSublayer

    sublayers = [m for m in model.decoder.modules() if isinstance(m, FastTreesSublayer)]
    beam.assert_broken_reorder_caught(model, mode, None if lm else srcs, prevs, d.pad(), modules=sublayers)


@MT_VARIANTS
def test_sequence_generator_scores_equal_teacher_forced_forward(variant):
    model, d = build("fasttrees_transformer", TINY_MT + VARIANTS[variant])
    sizes = beam.assert_generator_matches_forward(model, d, random_sentences(d, [4, 9, 6], seed=6), beam=4,
                                                  max_len=10)
    assert sizes, "beam search never reordered its state"


def test_language_model_generator_scores_equal_teacher_forced_forward():
    model, d = build("fasttrees_transformer_lm", TINY_LM + VARIANTS["conv"], task="language_modeling")
    prefixes = [p[1:4] for p in _rows(d)[1]]
    beam.assert_generator_matches_forward(model, d, None, beam=4, prefix_list=prefixes)


# ------------------------------------------------------------------------------------- through fairseq-train
@CPU_HALF_PRECISION
def test_fp16_fairseq_train_fasttrees_transformer(flags, toy_translation_bin, tmp_path):
    out = cli.fairseq("train", toy_translation_bin, "--task", "translation", "--arch", "fasttrees_transformer",
                      *cli.TINY_TRANSLATION_ARGS, "--chunk-size", 8, "--fasttrees-master", "conv", "--optimizer",
                      "adam", "--lr", "1e-3", "--max-tokens", 1000, "--max-update", 5, "--no-save", "--save-dir",
                      tmp_path, "--log-format", "simple", "--log-interval", 1, "--no-progress-bar", "--cpu",
                      "--num-workers", 0, "--seed", 1, *flags)
    assert_finite_half_precision_losses(out.stdout + out.stderr, 5)
