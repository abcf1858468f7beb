"""Beam-search checks that can fail: distinct beams, reordering and a shrinking batch.

fairseq's ``SequenceGenerator`` calls ``reorder_incremental_state`` at every step with a
``new_order`` that permutes and duplicates beam rows, and shrinks the batch when
sentences finish.  A test that decodes identical rows cannot tell a correct reorder from
none, so here every row has its own source and its own prefix, and after each reorder a
row's history is the history of the row it was copied from.  Every step is compared with
a full forward pass over each row's actual history.

``broken_reorder`` breaks a model's reordering on purpose (no-op, or only when the batch
shrinks) so the self-checks can show these helpers fail on such a model.
"""
import contextlib

import pytest
import torch
from fairseq.data import data_utils
from fairseq.sequence_generator import SequenceGenerator

from tests.helpers.invariance import decoder_logits


def _collate(seqs, pad, left_pad):
    return data_utils.collate_tokens(seqs, pad, left_pad=left_pad)


def _encode(model, src_list, pad, left_pad_source):
    tokens = _collate(src_list, pad, left_pad_source)
    lengths = torch.tensor([len(s) for s in src_list])
    return model.encoder(tokens, src_lengths=lengths)


def default_schedule(num_sentences, beam, length):
    """``{step: new_order}`` as beam search makes them: rows move only inside their sentence's beam.

    A third of the way every beam is rotated and, in the first sentence, one row is
    duplicated (its sibling dropped); at two thirds the second sentence finishes and
    the batch shrinks to the others.
    """
    groups = torch.arange(num_sentences * beam).view(num_sentences, beam)
    permute = torch.roll(groups, 1, dims=1)
    permute[0, :] = groups[0, -1]  # a duplicated row
    keep = [g for g in range(num_sentences) if g != 1] if num_sentences > 1 else [0]
    shrink = torch.roll(groups[keep], 1, dims=1)
    return {max(1, length // 3): permute.reshape(-1), max(2, (2 * length) // 3): shrink.reshape(-1)}


def assert_beam_reorder(model, src_list, prev_list, pad, left_pad_source=True, atol=1e-5, schedule=None):
    """Incremental decoding of distinct rows with reorders and a shrink equals full forward passes.

    Rows are laid out as beam search lays them out: sentence ``i`` owns rows
    ``i*beam … i*beam+beam-1`` and every reorder keeps rows inside their sentence
    (fairseq's cross-attention relies on that).

    Args:
        src_list: one source per sentence (1-D LongTensors of different lengths), or
            ``None`` for a decoder-only language model (each prefix is then a sentence).
        prev_list: one prefix per sentence, all of the same length (beam rows always
            are), starting with EOS like fairseq's ``prev_output_tokens``; prefixes
            must differ.  Sentence ``i``'s two beam rows start from prefixes ``i`` and
            ``i+1`` (cyclically), so no two rows are alike.
        schedule: ``{step: new_order}`` applied before decoding ``step``; by default a
            rotation with a duplicate inside each beam, then a shrink.
    """
    model.eval()
    beam, n = 2, len(prev_list)
    length = len(prev_list[0])
    assert all(len(p) == length for p in prev_list), "beam rows have equal lengths"
    assert len({tuple(p.tolist()) for p in prev_list}) == n, "prefixes must be distinct"
    assert src_list is None or len(src_list) == n, "one prefix per source sentence"
    schedule = default_schedule(n, beam, length) if schedule is None else schedule
    srcs = None if src_list is None else [s for s in src_list for _ in range(beam)]
    feed = torch.stack([prev_list[(i + j) % n] for i in range(n) for j in range(beam)])
    history = feed[:, :0]
    incremental_state = {}
    with torch.no_grad():
        encoder_out = None if srcs is None else _encode(model, srcs, pad, left_pad_source)
        for t in range(length):
            if t in schedule:
                order = schedule[t]
                model.decoder.reorder_incremental_state_scripting(incremental_state, order)
                if encoder_out is not None:
                    encoder_out = model.encoder.reorder_encoder_out(encoder_out, order)
                    srcs = [srcs[i] for i in order.tolist()]
                history = history[order]  # a row continues the history it was copied from ...
                if order.numel() < feed.size(0):  # ... with its own next tokens (duplicates diverge)
                    feed = feed[order]
            history = torch.cat([history, feed[:, t:t + 1]], dim=1)
            kwargs = {"incremental_state": incremental_state}
            if encoder_out is not None:
                kwargs["encoder_out"] = encoder_out
            step = model.decoder(history, **kwargs)
            step = (step[0] if isinstance(step, tuple) else step)[:, -1]
            full = decoder_logits(model, srcs, list(history), pad, left_pad_source)[:, -1]
            for row in range(history.size(0)):
                diff = (step[row] - full[row]).abs().max().item()
                assert diff <= atol, (f"step {t}, row {row} (batch of {history.size(0)}): incremental vs full "
                                      f"differ by {diff:.3g} after reordering")


def _reorder_modules(model):
    return [m for m in model.decoder.modules() if hasattr(m, "reorder_incremental_state")]


@contextlib.contextmanager
def broken_reorder(model, mode, modules=None):
    """Breaks ``reorder_incremental_state`` of every decoder module (or of ``modules`` only,
    e.g. one architecture's own sublayers) for the block.

    ``"noop"``: never reorders.  ``"shrink_only"``: reorders only when the batch shrinks
    (a plausible bug: the state stays right in size, wrong in content).
    """
    if mode not in ("noop", "shrink_only"):
        raise ValueError(f"mode must be 'noop' or 'shrink_only', got {mode!r}")
    modules = _reorder_modules(model) if modules is None else list(modules)
    assert modules, "the decoder has no reorder_incremental_state to break"
    sizes = {}

    def broken(module, original):
        def reorder(incremental_state, new_order):
            last = sizes.get(id(module))
            sizes[id(module)] = new_order.numel()
            if mode == "shrink_only" and last is not None and new_order.numel() < last:
                return original(incremental_state, new_order)
            return incremental_state
        return reorder

    for m in modules:
        m.reorder_incremental_state = broken(m, m.reorder_incremental_state)
    try:
        yield
    finally:
        for m in modules:
            del m.reorder_incremental_state


def assert_broken_reorder_caught(model, mode, src_list, prev_list, pad, modules=None, **kwargs):
    """:func:`assert_beam_reorder` fails while :func:`broken_reorder` is in force: the check
    catches that bug for this model."""
    with broken_reorder(model, mode, modules), pytest.raises(AssertionError, match="after reordering"):
        assert_beam_reorder(model, src_list, prev_list, pad, **kwargs)


def assert_generator_matches_forward(model, dictionary, src_list=None, beam=4, max_len=12, atol=1e-5,
                                     prefix_list=None, left_pad_source=True):
    """fairseq's beam search scores every hypothesis as a teacher-forced full forward pass would.

    Runs ``SequenceGenerator`` (beam ``beam``) on a batch of sources of different lengths
    (encoder-decoder models) or of prefixes (``src_list=None``, language models; the
    prefixes are forced and then continued), then re-scores each hypothesis with one full
    forward pass: ``positional_scores`` must equal the log-probs of its tokens.  Returns
    the sizes of the batches the generator reordered to (a test can check it shrank).
    """
    model.eval()
    pad, eos = dictionary.pad(), dictionary.eos()
    if src_list is not None:
        tokens = _collate(src_list, pad, left_pad_source)
        sample = {"net_input": {"src_tokens": tokens, "src_lengths": torch.tensor([len(s) for s in src_list])}}
        prefix_tokens, n = None, len(src_list)
    else:
        prefixes = torch.stack(prefix_list)
        bos = torch.full((len(prefix_list), 1), eos)
        sample = {"net_input": {"src_tokens": torch.cat([bos, prefixes], 1),
                                "src_lengths": torch.full((len(prefix_list),), prefixes.size(1) + 1)}}
        prefix_tokens, n = prefixes, len(prefix_list)
        max_len += prefixes.size(1)
    generator = SequenceGenerator([model], dictionary, beam_size=beam, max_len_a=0, max_len_b=max_len,
                                  min_len=1)
    sizes = []
    reorder = model.decoder.reorder_incremental_state_scripting

    def recording(incremental_state, new_order):
        sizes.append(new_order.numel())
        return reorder(incremental_state, new_order)

    model.decoder.reorder_incremental_state_scripting = recording
    try:
        with torch.no_grad():
            hypos = generator.generate([model], sample, prefix_tokens=prefix_tokens)
    finally:
        del model.decoder.reorder_incremental_state_scripting
    assert len(hypos) == n
    for i, sentence_hypos in enumerate(hypos):
        assert len(sentence_hypos) == beam, f"sentence {i}: {len(sentence_hypos)} hypotheses, beam {beam}"
        for j, hypo in enumerate(sentence_hypos):
            target = hypo["tokens"]
            prev = torch.cat([torch.tensor([eos]), target[:-1]])
            srcs = None if src_list is None else [src_list[i]]
            with torch.no_grad():
                out = model(prev.unsqueeze(0)) if srcs is None else model(
                    _collate(srcs, pad, left_pad_source), torch.tensor([len(srcs[0])]), prev.unsqueeze(0))
                lprobs = model.get_normalized_probs(out, log_probs=True)[0]
            expected = lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
            diff = (expected - hypo["positional_scores"]).abs().max().item()
            assert diff <= atol, (f"sentence {i}, hypothesis {j} ({target.tolist()}): beam-search scores differ "
                                  f"from a teacher-forced forward by {diff:.3g}")
    return sizes
