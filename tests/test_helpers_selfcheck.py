"""The shared helpers pass on fairseq's own transformer and fail on a model that leaks."""
import os

import pytest
import torch
from fairseq.data import data_utils

from tests.helpers import beam, invariance, precision
from tests.helpers.host_sync import count_host_syncs
from tests.helpers.ddp import assert_ddp_matches_single_process, translation_batches_and_loss
from tests.helpers.models import build, prev_output, random_sentences

TINY = ["--encoder-layers", 1, "--decoder-layers", 1, "--encoder-embed-dim", 16, "--decoder-embed-dim", 16,
        "--encoder-ffn-embed-dim", 32, "--decoder-ffn-embed-dim", 32, "--encoder-attention-heads", 2,
        "--decoder-attention-heads", 2, "--dropout", 0]


def _transformer():
    return build("transformer", TINY)


def test_fairseq_transformer_passes_all_checks():
    model, d = _transformer()
    srcs = random_sentences(d, [5, 9, 3], seed=1)
    tgts = [prev_output(t, d.eos()) for t in random_sentences(d, [7, 4, 6], seed=2)]
    invariance.assert_padding_invariant(model, srcs, tgts, d.pad())
    invariance.assert_decoder_causal(model, srcs[0], tgts[0], d.pad(), len(d))
    invariance.assert_incremental_equals_full(model, srcs[1], tgts[0], d.pad())


def test_causality_check_catches_a_leak():
    model, d = _transformer()
    original = model.decoder.buffered_future_mask
    model.decoder.buffered_future_mask = lambda x: torch.zeros_like(original(x))  # no causal mask
    src = random_sentences(d, [5])[0]
    tgt = prev_output(random_sentences(d, [6], seed=3)[0], d.eos())
    with pytest.raises(AssertionError, match="changed by"):
        invariance.assert_decoder_causal(model, src, tgt, d.pad(), len(d))


def test_padding_check_catches_unmasked_pads():
    model, d = _transformer()
    srcs = random_sentences(d, [3, 9], seed=1)
    tgts = [prev_output(t, d.eos()) for t in random_sentences(d, [4, 4], seed=2)]
    model.encoder.embed_tokens.padding_idx = None
    real_forward = model.encoder.forward_scriptable

    def forward_without_padding_mask(src_tokens, src_lengths=None, **kw):
        out = real_forward(src_tokens, src_lengths, **kw)
        out["encoder_padding_mask"] = []
        return out

    model.encoder.forward = forward_without_padding_mask
    with pytest.raises(AssertionError, match="alone vs padded batch"):
        invariance.assert_padding_invariant(model, srcs, tgts, d.pad())


def ddp_setup():
    model, d = _transformer()
    return translation_batches_and_loss(model, d)


def test_ddp_helper_on_fairseq_transformer():
    assert_ddp_matches_single_process("tests.test_helpers_selfcheck:ddp_setup")


def _distinct_rows(d, n=3, length=7):
    srcs = random_sentences(d, [5, 9, 3, 7][:n], seed=4)
    prevs = [prev_output(t, d.eos()) for t in random_sentences(d, [length - 1] * n, seed=5)]
    return srcs, prevs


def test_beam_helpers_pass_on_fairseq_transformer():
    model, d = _transformer()
    srcs, prevs = _distinct_rows(d)
    beam.assert_beam_reorder(model, srcs, prevs, d.pad())
    beam.assert_beam_reorder(model, srcs, prevs, d.pad(), left_pad_source=False)
    sizes = beam.assert_generator_matches_forward(model, d, random_sentences(d, [4, 9, 6], seed=6), beam=4)
    assert sizes, "beam search never reordered its state"


@pytest.mark.parametrize("mode", ["noop", "shrink_only"])
def test_beam_reorder_check_catches_a_broken_reorder(mode):
    model, d = _transformer()
    srcs, prevs = _distinct_rows(d)
    beam.assert_broken_reorder_caught(model, mode, srcs, prevs, d.pad())
    beam.assert_beam_reorder(model, srcs, prevs, d.pad())  # restored afterwards


def test_beam_helpers_on_a_language_model():
    model, d = build("transformer_lm", ["--decoder-layers", 1, "--decoder-embed-dim", 16, "--decoder-ffn-embed-dim",
                                        32, "--decoder-attention-heads", 2, "--dropout", 0],
                     task="language_modeling")
    _, prevs = _distinct_rows(d)
    beam.assert_beam_reorder(model, None, prevs, d.pad())
    beam.assert_broken_reorder_caught(model, "noop", None, prevs, d.pad())
    prefixes = [p[1:4] for p in prevs]
    beam.assert_generator_matches_forward(model, d, None, beam=4, prefix_list=prefixes)


def test_generator_check_catches_a_wrong_score():
    model, d = _transformer()
    real = model.get_normalized_probs
    calls = {"n": 0}

    def off_in_beam_search(net_output, log_probs, sample=None):
        out = real(net_output, log_probs, sample)
        calls["n"] += 1
        return out + 1e-3 if net_output[0].size(1) == 1 else out  # only the one-step calls of beam search

    model.get_normalized_probs = off_in_beam_search
    with pytest.raises(AssertionError, match="teacher-forced"):
        beam.assert_generator_matches_forward(model, d, random_sentences(d, [4, 9], seed=6), beam=4)


def test_low_precision_helpers_on_fairseq_transformer():
    model, d = _transformer()
    src = random_sentences(d, [30], seed=7)[0].unsqueeze(0)
    prev = prev_output(random_sentences(d, [20], seed=8)[0], d.eos()).unsqueeze(0)

    def run(m):
        return m(src, torch.tensor([src.size(1)]), prev)[0]

    assert precision.sharpen_attention(model, 4.0) == 3  # encoder self, decoder self and cross attention
    for dtype in precision.LOW_PRECISION:
        err, base = precision.assert_low_precision_close(model, run, model, run, dtype)
        assert 0 < err == base
    precision.assert_autocast_backward(model, run)
    with pytest.raises(AssertionError, match="non-finite output"):
        precision.low_precision_error(model, lambda m: run(m) * 1e6, torch.float16)


def test_host_sync_counter_separates_plugin_and_fairseq_syncs():
    model, d = _transformer()
    src = random_sentences(d, [6, 4], seed=9)
    tokens = data_utils.collate_tokens(src, d.pad(), left_pad=True)
    with count_host_syncs() as syncs:
        model.encoder(tokens, src_lengths=torch.tensor([6, 4]))
    assert not syncs and syncs.external  # fairseq's encoder checks `encoder_padding_mask.any()`
    with count_host_syncs(plugin_dirs=[os.path.dirname(__file__)]) as syncs:
        bool(tokens.sum() > 0)
        tokens.max().item()
    assert [s.rsplit(": ", 1)[1] for s in syncs] == ["__bool__", "item"]
