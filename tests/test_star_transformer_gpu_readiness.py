"""Star-Transformer on a GPU's terms: float16 / bfloat16 / autocast for every head (classification,
CRF tagging, NLI, star_transformer_nmt), no host sync in the forward pass, and beam search of
star_transformer_nmt checked with distinct beams."""
import math
import re

import pytest
import torch
from fairseq.data import data_utils

from tests.helpers import beam, cli, precision
from tests.helpers.host_sync import count_host_syncs
from tests.helpers.models import build, prev_output, random_sentences, toy_dictionary

STAR = ["--encoder-embed-dim", 64, "--encoder-attention-heads", 4, "--encoder-layers", 2, "--max-positions", 2048,
        "--dropout", 0, "--pooler-dropout", 0]
NMT = ["--encoder-embed-dim", 32, "--decoder-embed-dim", 32, "--encoder-attention-heads", 2,
       "--decoder-attention-heads", 2, "--encoder-layers", 2, "--decoder-layers", 1, "--decoder-ffn-embed-dim", 64,
       "--max-positions", 2048, "--max-target-positions", 256, "--dropout", 0]
# fairseq's transformer of the same size: its error in the same dtype sets the tolerance
BASELINE = ["--encoder-layers", 2, "--decoder-layers", 1, "--encoder-embed-dim", 64, "--decoder-embed-dim", 64,
            "--encoder-ffn-embed-dim", 128, "--decoder-ffn-embed-dim", 128, "--encoder-attention-heads", 4,
            "--decoder-attention-heads", 4, "--max-source-positions", 2048, "--max-target-positions", 256,
            "--dropout", 0]
NMT_BASELINE = ["--encoder-layers", 2, "--decoder-layers", 1, "--encoder-embed-dim", 32, "--decoder-embed-dim", 32,
                "--encoder-ffn-embed-dim", 64, "--decoder-ffn-embed-dim", 64, "--encoder-attention-heads", 2,
                "--decoder-attention-heads", 2, "--max-source-positions", 2048, "--max-target-positions", 256,
                "--dropout", 0]
DTYPES = pytest.mark.parametrize("dtype", precision.LOW_PRECISION, ids=["fp16", "bf16"])
# (lengths, left_pad): 120+ tokens with a 1-token sentence and an all-pad row; n = 1100, the 512-row blocks
INPUTS = {"n130_left": ([130, 57, 1, 0], True), "n130_right": ([130, 57, 1, 0], False),
          "n1100_blocks": ([1100, 700], False)}


def _tokens(d, lengths, left_pad, seed=0):
    sents = [s[:-1] if n else s[:0] for s, n in zip(random_sentences(d, [max(n, 1) for n in lengths], seed), lengths)]
    sents = [s if len(s) else torch.tensor([d.pad()]) for s in sents]  # an all-pad row
    return data_utils.collate_tokens(sents, d.pad(), left_pad=left_pad), torch.tensor(lengths)


def _star(extra=()):
    model, d = build("star_transformer", [*STAR, *extra])
    model.register_classification_head("cls", num_classes=3)
    model.register_classification_head("nli", num_classes=3, input_multiplier=4)
    model.register_tagging_head("tags", num_tags=5, crf=True)
    return model, d


def _baseline_encoder_run(tokens, lengths):
    baseline, _ = build("transformer", BASELINE)
    return baseline, lambda m: m.encoder(tokens, src_lengths=lengths)["encoder_out"][0]


def _check(model, run, baseline, baseline_run, dtype):
    assert precision.sharpen_attention(model, 8.0) > 0 and precision.sharpen_attention(baseline, 8.0) > 0
    precision.assert_low_precision_close(model, run, baseline, baseline_run, dtype)


def _crf_outputs(m, tokens):
    """Emissions of real tokens and the CRF's per-token negative log-likelihood (right-padded rows)."""
    feats, extra = m(tokens)
    head = m.tagging_heads["tags"]
    emissions, mask = head(feats), ~extra["padding_mask"]
    tags = torch.arange(tokens.numel()).view_as(tokens) % 5
    nll = head.loss(emissions, tags, mask) / mask.sum()
    return torch.cat([emissions.float().masked_fill(~mask.unsqueeze(-1), 0.0).flatten(), nll.view(1)])


@DTYPES
@pytest.mark.parametrize("case", list(INPUTS))
def test_fp16_bf16_classification(dtype, case):
    lengths, left_pad = INPUTS[case]
    model, d = _star()
    tokens, src_lengths = _tokens(d, lengths, left_pad)
    baseline, baseline_run = _baseline_encoder_run(tokens, src_lengths)
    _check(model, lambda m: m(tokens, classification_head_name="cls")[0], baseline, baseline_run, dtype)


@DTYPES
def test_fp16_bf16_tagging_crf(dtype):
    model, d = _star()
    tokens, lengths = _tokens(d, [130, 57, 1], left_pad=False)
    baseline, baseline_run = _baseline_encoder_run(tokens, lengths)
    _check(model, lambda m: _crf_outputs(m, tokens), baseline, baseline_run, dtype)


@DTYPES
def test_fp16_bf16_nli(dtype):
    model, d = _star()
    premise, lengths = _tokens(d, [130, 57, 1], left_pad=False)
    hypothesis, _ = _tokens(d, [12, 125, 3], left_pad=False, seed=1)
    baseline, baseline_run = _baseline_encoder_run(premise, lengths)
    _check(model, lambda m: m(premise, classification_head_name="nli", pair_tokens=hypothesis)[0], baseline,
           baseline_run, dtype)


def _nmt_batch(d, left_pad=True):
    tokens, lengths = _tokens(d, [130, 57, 1], left_pad)
    prev = data_utils.collate_tokens([prev_output(t, d.eos()) for t in random_sentences(d, [120, 30, 1], seed=3)],
                                     d.pad(), left_pad=False)
    return tokens, lengths, prev


@DTYPES
def test_fp16_bf16_star_transformer_nmt(dtype):
    model, d = build("star_transformer_nmt", NMT)
    baseline, _ = build("transformer", NMT_BASELINE, dictionary=d)
    tokens, lengths, prev = _nmt_batch(d)

    def run(m):
        return m(tokens, lengths, prev)[0]

    _check(model, run, baseline, run, dtype)


@pytest.mark.parametrize("n", [9, 1100])
def test_autocast_bf16_forward_backward(n):
    """torch.autocast (what --amp does): the fused ring core ran forward but crashed in backward."""
    from user_dir.modules.star_transformer_layer import FusedRingAttention

    model, d = _star()
    model.train()
    tokens, _ = _tokens(d, [n, n - 4], left_pad=False)
    out = precision.assert_autocast_backward(model, lambda m: m(tokens, classification_head_name="cls")[0])
    assert out.shape == (2, 3)
    ring = model.encoder.star.cycles[0].ring_attn
    assert isinstance(ring, FusedRingAttention) and ring.q_proj.weight.grad.abs().sum() > 0


def test_autocast_bf16_heads_and_nmt():
    model, d = _star()
    tokens, _ = _tokens(d, [20, 7], left_pad=False)
    precision.assert_autocast_backward(model, lambda m: _crf_outputs(m, tokens))
    precision.assert_autocast_backward(
        model, lambda m: m(tokens, classification_head_name="nli", pair_tokens=tokens.flip(0))[0])
    nmt, d = build("star_transformer_nmt", NMT)
    tokens, lengths, prev = _nmt_batch(d)
    precision.assert_autocast_backward(nmt, lambda m: m(tokens, lengths, prev)[0])


def test_padded_long_batch_runs_in_blocks_with_the_same_outputs(monkeypatch):
    """A padded batch of n 1100 goes through the 512-row blocks (padding does not force the
    one-block path) and gives the one-block outputs and gradients."""
    from user_dir.modules import star_ring_core
    from user_dir.modules.star_transformer_layer import StarTransformer

    model, d = _star()
    tokens, _ = _tokens(d, [1100, 700, 1], left_pad=True)
    results, project, stack = [], star_ring_core.project, model.encoder.star
    for rows in (star_ring_core.BLOCK_ROWS, 4096):
        model.encoder.star = StarTransformer(stack.options, ring_block_rows=rows)  # the same weights
        model.encoder.star.load_state_dict(stack.state_dict())
        calls = []
        monkeypatch.setattr(star_ring_core, "project", lambda *a: calls.append(1) or project(*a))
        out = model(tokens, classification_head_name="cls")[0]
        out.sum().backward()
        results.append((out.detach(), model.encoder.star.cycles[0].ring_attn.k_proj.weight.grad.clone(), len(calls)))
    (blocked, g_blocked, calls_blocked), (whole, g_whole, calls_whole) = results
    assert calls_blocked == 3 * calls_whole  # 3 blocks per forward and per backward, each cycle
    assert torch.allclose(blocked, whole, atol=1e-5) and torch.allclose(g_blocked, g_whole, atol=1e-4)


# ------------------------------------------------------------------------------------------ host syncs
def syncs_while_decoding(model, prev, steps=4, **encoder_input):
    """Host syncs made by the plugin while encoding (``encoder_input``, if any) and decoding
    ``steps`` tokens incrementally; shared by the FastTrees and MTN tests."""
    with torch.no_grad(), count_host_syncs() as syncs:
        encoder_out = model.encoder(**encoder_input) if encoder_input else None
        state = {}
        for t in range(steps):
            model.decoder(prev[:, :t + 1], encoder_out=encoder_out, incremental_state=state)
    return syncs


@pytest.mark.parametrize("n", [40, 1100])
def test_no_host_sync_in_training_forward(n):
    model, d = _star()
    model.train()
    tokens, _ = _tokens(d, [n, n // 2], left_pad=True)
    with count_host_syncs() as syncs:
        model(tokens, classification_head_name="cls")[0].sum().backward()
    assert not syncs, f"host syncs in the Star forward: {list(syncs)}"


def test_no_host_sync_in_nmt_encoding_and_incremental_decoding():
    model, d = build("star_transformer_nmt", NMT)
    tokens, lengths, prev = _nmt_batch(d)
    syncs = syncs_while_decoding(model, prev, src_tokens=tokens, src_lengths=lengths)
    assert not syncs, f"host syncs: {list(syncs)}"


def test_too_long_input_still_named():
    """The one place a forward reads the device: only when n exceeds the table, to name the length."""
    model, d = _star(("--max-positions", 64))
    tokens, _ = _tokens(d, [70, 3], left_pad=False)
    with pytest.raises(ValueError, match="input of 70 tokens is longer than the position table"):
        model(tokens, classification_head_name="cls")
    left, _ = _tokens(d, [64, 3, 66], left_pad=True)
    with pytest.raises(ValueError, match="input of 66 tokens"):
        model(left[:, 2:], classification_head_name="cls")  # 64 columns: no check, 64 positions fit
        model(left, classification_head_name="cls")


# ------------------------------------------------------------------------------------- through fairseq-train
# fairseq 0.12.3's half-precision training paths that run on CPU (--fp16 alone needs CUDA for its
# flattened gradients; a gradient overflow calls .cuda(), hence loss scale 1)
CPU_HALF_PRECISION = pytest.mark.parametrize("flags", [
    ["--memory-efficient-fp16", "--fp16-init-scale", 1], ["--fp16", "--fp16-no-flatten-grads", "--fp16-init-scale", 1]],
    ids=["memory_efficient_fp16", "fp16_no_flatten_grads"])


def assert_finite_half_precision_losses(stdout, updates):
    """fairseq-train's log (``--log-interval 1``): a finite loss for each of ``updates`` updates, in float16."""
    lines = [line for line in stdout.splitlines() if "train_inner" in line]
    losses = [float(re.search(r"loss=([^,]+),", line).group(1)) for line in lines]
    assert len(losses) == updates and all(math.isfinite(x) for x in losses), stdout[-3000:]
    assert all("loss_scale=1," in line for line in lines), "not the fp16 trainer"
    return losses


@CPU_HALF_PRECISION
def test_fp16_fairseq_train_star_transformer_nmt(flags, toy_translation_bin, tmp_path):
    out = cli.fairseq("train", toy_translation_bin, "--task", "translation", "--arch", "star_transformer_nmt", *NMT[:-2],
                      "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", 1000, "--max-update", 5, "--no-save",
                      "--save-dir", tmp_path, "--log-format", "simple", "--log-interval", 1, "--no-progress-bar",
                      "--cpu", "--num-workers", 0, "--seed", 1, *flags)
    assert_finite_half_precision_losses(out.stdout + out.stderr, 5)


# ---------------------------------------------------------------------------------------- beam search
def _nmt_beam_model():
    model, d = build("star_transformer_nmt", ["--encoder-layers", 1, "--decoder-layers", 1, "--encoder-embed-dim", 16,
                                              "--decoder-embed-dim", 16, "--decoder-ffn-embed-dim", 32,
                                              "--encoder-attention-heads", 2, "--decoder-attention-heads", 2,
                                              "--dropout", 0], dictionary=toy_dictionary())
    srcs = random_sentences(d, [5, 9, 3], seed=4)
    prevs = [prev_output(t, d.eos()) for t in random_sentences(d, [6, 6, 6], seed=5)]
    return model, d, srcs, prevs


@pytest.mark.parametrize("left_pad", [True, False])
def test_nmt_beam_reorder_with_distinct_beams(left_pad):
    model, d, srcs, prevs = _nmt_beam_model()
    beam.assert_beam_reorder(model, srcs, prevs, d.pad(), left_pad_source=left_pad)


@pytest.mark.parametrize("mode", ["noop", "shrink_only"])
def test_nmt_beam_check_catches_a_broken_reorder(mode):
    model, d, srcs, prevs = _nmt_beam_model()
    beam.assert_broken_reorder_caught(model, mode, srcs, prevs, d.pad())


@pytest.mark.parametrize("left_pad", [True, False])
def test_nmt_sequence_generator_scores_equal_teacher_forced_forward(left_pad):
    model, d, srcs, _ = _nmt_beam_model()
    sizes = beam.assert_generator_matches_forward(model, d, srcs, beam=4, max_len=10, left_pad_source=left_pad)
    assert sizes, "beam search never reordered its state"
