"""The shared helpers pass on fairseq's own transformer and fail on a model that leaks."""
import pytest
import torch

from tests.helpers import invariance
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
