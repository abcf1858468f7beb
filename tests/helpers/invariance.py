"""Batching invariance, causality and incremental decoding checks for fairseq models.

They work on any ``FairseqEncoderDecoderModel`` (pass ``src`` token lists) and
any decoder-only ``FairseqLanguageModel`` (``src=None``).  Sentences are
1-D LongTensors without padding; targets start with EOS as fairseq's
``prev_output_tokens`` do.  Models are put in eval mode (no dropout).
"""
import torch
from fairseq.data import data_utils


def _collate(seqs, pad, left_pad):
    return data_utils.collate_tokens(seqs, pad, left_pad=left_pad)


def _encoder_input(src_list, pad, left_pad_source):
    tokens = _collate(src_list, pad, left_pad_source)
    lengths = torch.tensor([len(s) for s in src_list])
    return tokens, lengths


def decoder_logits(model, src_list, prev_list, pad, left_pad_source=True):
    """Full-forward decoder output (B, T, V) for a batch (targets right-padded)."""
    prev = _collate(prev_list, pad, left_pad=False)
    with torch.no_grad():
        if src_list is None:
            out = model(prev)
        else:
            src, lengths = _encoder_input(src_list, pad, left_pad_source)
            out = model(src, lengths, prev)
    return out[0] if isinstance(out, tuple) else out


def assert_padding_invariant(model, src_list, prev_list, pad, left_pad_source=True, atol=1e-5):
    """A sentence's outputs alone equal its outputs inside a padded batch."""
    model.eval()
    batched = decoder_logits(model, src_list, prev_list, pad, left_pad_source)
    for i, prev in enumerate(prev_list):
        alone = decoder_logits(model, None if src_list is None else [src_list[i]], [prev], pad, left_pad_source)
        n = len(prev)
        diff = (alone[0, :n] - batched[i, :n]).abs().max().item()
        assert diff <= atol, f"sentence {i}: alone vs padded batch differ by {diff:.3g}"


def assert_decoder_causal(model, src, prev, pad, vocab_size, atol=1e-6, seed=0):
    """Changing target tokens after position t leaves outputs at positions ≤ t unchanged."""
    model.eval()
    g = torch.Generator().manual_seed(seed)
    src_list = None if src is None else [src]
    base = decoder_logits(model, src_list, [prev], pad)
    n = len(prev)
    for t in range(n - 1):
        changed = prev.clone()
        changed[t + 1:] = torch.randint(4, vocab_size, (n - t - 1,), generator=g)
        out = decoder_logits(model, src_list, [changed], pad)
        diff = (out[0, : t + 1] - base[0, : t + 1]).abs().max().item()
        assert diff <= atol, f"outputs up to position {t} changed by {diff:.3g} when later tokens changed"


def assert_incremental_equals_full(model, src, prev, pad, atol=1e-5, reorder=True):
    """Step-by-step decoding with ``incremental_state`` equals the full forward pass.

    With ``reorder`` a beam of two copies is decoded and, half way, the beam is
    reordered with ``reorder_incremental_state``/``reorder_encoder_out`` as
    fairseq's ``SequenceGenerator`` does; both copies must still match.
    """
    model.eval()
    src_list = None if src is None else [src]
    full = decoder_logits(model, src_list, [prev], pad)[0]
    beam = 2 if reorder else 1
    with torch.no_grad():
        encoder_out = None
        if src is not None:
            tokens, lengths = _encoder_input([src] * beam, pad, True)
            encoder_out = model.encoder(tokens, src_lengths=lengths)
        incremental_state = {}
        prev_batch = prev.unsqueeze(0).repeat(beam, 1)
        for t in range(len(prev)):
            if reorder and t == len(prev) // 2 and t > 0:
                order = torch.arange(beam - 1, -1, -1)
                model.decoder.reorder_incremental_state_scripting(incremental_state, order)
                if encoder_out is not None:
                    encoder_out = model.encoder.reorder_encoder_out(encoder_out, order)
            kwargs = {"incremental_state": incremental_state}
            if encoder_out is not None:
                kwargs["encoder_out"] = encoder_out
            step = model.decoder(prev_batch[:, : t + 1], **kwargs)
            step = step[0] if isinstance(step, tuple) else step
            for b in range(beam):
                diff = (step[b, -1] - full[t]).abs().max().item()
                assert diff <= atol, f"step {t} (beam {b}): incremental vs full differ by {diff:.3g}"
