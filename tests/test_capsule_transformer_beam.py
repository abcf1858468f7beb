"""capsule_transformer in beam search (distinct beams, reorders, a shrinking batch) and without host syncs."""
import pytest
import torch
import torch.nn.functional as F
from fairseq.data import data_utils

from tests.helpers import beam
from tests.helpers.host_sync import count_host_syncs
from tests.helpers.models import build, prev_output, random_sentences
from tests.test_capsule_transformer import ALL_MODULES, IMPL, TINY
from user_dir.models.capsule_transformer import IMPLEMENTATIONS
from user_dir.modules.capsule_routing import CapsuleMultiheadAttention


def _model(*extra, impl="fast"):
    return build("capsule_transformer", TINY + ALL_MODULES + list(extra) + ["--capsule-implementation", impl], seed=0)


def _rows(d, n=3, length=8):
    """Sources of different lengths and distinct prefixes (one per sentence)."""
    srcs = random_sentences(d, [5, 11, 3, 8][:n], seed=4)
    prevs = [prev_output(t, d.eos()) for t in random_sentences(d, [length - 1] * n, seed=5)]
    return srcs, prevs


@pytest.mark.parametrize("left_pad_source", [True, False], ids=["left-pad", "right-pad"])
@pytest.mark.parametrize("extra", [[], ["--capsule-routing", "horizontal", "--capsule-squash", "rms"]],
                         ids=["both", "horizontal-rms"])
@pytest.mark.parametrize("length", [6, 22, 70], ids=["short", "past-twice-head-width", "long"])
@IMPL
def test_beam_reorder_distinct_rows(left_pad_source, extra, length, impl):
    """Prefixes of 6, 22 and 70 tokens: the fast decoder's kept logit rows (target length <= 2 x head width 8),
    and beyond the kept u rows, in-block logits (blocks of 16) and Gram are all reordered."""
    model, d = _model(*extra, impl=impl)
    srcs, prevs = _rows(d, length=length)
    schedule = None
    if length > 64:  # reorders across several blocks of 16 rows, the shrink after them
        permute, shrink = beam.default_schedule(len(srcs), 2, length).values()
        schedule = {20: permute, 66: permute, length - 2: shrink}
    beam.assert_beam_reorder(model, srcs, prevs, d.pad(), left_pad_source=left_pad_source, schedule=schedule)


@pytest.mark.parametrize("mode", ["noop", "shrink_only"])
def test_beam_check_catches_a_broken_reorder(mode):
    model, d = _model()
    srcs, prevs = _rows(d)
    beam.assert_broken_reorder_caught(model, mode, srcs, prevs, d.pad())


@IMPL
def test_beam_check_catches_unreordered_routing_state(monkeypatch, impl):
    """Only the capsule routing state (kept rows, Gram, row factors, vertical sums) left unreordered:
    fairseq's keys and values are still reordered, so this fails on the routing state alone."""
    model, d = _model(impl=impl)
    srcs, prevs = _rows(d)

    def keys_and_values_only(self, incremental_state, new_order):
        return super(CapsuleMultiheadAttention, self).reorder_incremental_state(incremental_state, new_order)

    monkeypatch.setattr(IMPLEMENTATIONS[impl][0], "reorder_incremental_state", keys_and_values_only)
    with pytest.raises(AssertionError, match="after reordering"):
        beam.assert_beam_reorder(model, srcs, prevs, d.pad())


@IMPL
def test_sequence_generator_scores_equal_teacher_forced_forward(impl):
    model, d = _model(impl=impl)
    sizes = beam.assert_generator_matches_forward(model, d, random_sentences(d, [4, 12, 7], seed=6), beam=4,
                                                  max_len=14)
    assert sizes, "beam search never reordered its state"
    sizes = beam.assert_generator_matches_forward(model, d, random_sentences(d, [9, 2], seed=7), beam=5,
                                                  max_len=10, left_pad_source=False)
    assert sizes


# ------------------------------------------------------------------ host syncs


@pytest.mark.parametrize("steps", [4, 20], ids=["short", "past-a-block"])
@IMPL
def test_no_host_sync_in_training_or_decoding(steps, impl):
    """Decoding 20 steps takes the fast decoder past its kept logit rows (8) and its first block of 16 rows."""
    model, d = _model(impl=impl)
    srcs = random_sentences(d, [6, 3, 9], seed=9)
    tgts = random_sentences(d, [steps, 7, 2], seed=10)
    tokens = data_utils.collate_tokens(srcs, d.pad(), left_pad=True)
    lengths = torch.tensor([len(s) for s in srcs])
    prev = data_utils.collate_tokens(tgts, d.pad(), d.eos(), move_eos_to_beginning=True)
    model.train()
    with count_host_syncs() as syncs:
        model(tokens, lengths, prev)[0].sum().backward()
    assert not syncs, f"training forward/backward syncs with the host: {list(syncs)}"
    model.eval()
    state = {}
    with torch.no_grad(), count_host_syncs() as syncs:
        enc = model.encoder(tokens, src_lengths=lengths)
        for t in range(steps):
            if t:
                order = torch.tensor([2, 0, 0])
                model.decoder.reorder_incremental_state_scripting(state, order)
                enc = model.encoder.reorder_encoder_out(enc, order)
            model.decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=state)
    assert not syncs, f"incremental decoding syncs with the host: {list(syncs)}"


# ------------------------------------------------------------------ deferred reorder (one copy per step)


@pytest.mark.parametrize("grad", [False, True], ids=["no-grad", "grad"])
def test_state_growth_applies_the_beam_order(grad):
    """append_rows / grow_gram / grow_rows (the fast decoder's state growth) equal an index_select then a cat
    (and keep autograd when it is on)."""
    from user_dir.modules.capsule_routing_fast import append_rows, grow_gram, grow_rows

    g = torch.Generator().manual_seed(0)
    order = torch.tensor([2, 0, 0, 1])  # 3 rows to 4: permuted and duplicated
    kept = torch.randn(3, 5, 4, generator=g, requires_grad=grad)
    new = torch.randn(4, 1, 4, generator=g, requires_grad=grad)
    with torch.set_grad_enabled(grad):
        grown = append_rows(kept, new, order)
        expected = torch.cat([kept.index_select(0, order), new], dim=1)
        assert torch.equal(grown, expected)
        gram = torch.randn(3, 5, 5, generator=g)
        gram = gram + gram.transpose(1, 2)
        cols = torch.randn(4, 6, 1, generator=g)
        old = gram.index_select(0, order)
        full = torch.cat([torch.cat([old, cols[:, :5].transpose(1, 2)], 1), cols], 2)
        assert torch.equal(grow_gram(gram, cols, order), full)
        rows = torch.randn(3, 5, 2, 5, generator=g, requires_grad=grad)  # logit rows (B, M, H, K)
        new_rows = torch.randn(4, 1, 2, 6, generator=g)
        expected_rows = torch.cat([F.pad(rows.index_select(0, order), (0, 1)), new_rows], dim=1)
        assert torch.equal(grow_rows(rows, new_rows, order), expected_rows)
    if grad:
        grown.sum().backward()
        assert torch.equal(kept.grad[:, 0, 0], torch.tensor([2.0, 1.0, 1.0]))  # row 0 taken twice


@IMPL
def test_reorders_before_a_step_compose(impl):
    """Two reorders between decoding steps (deferred and composed when fast) give what reordering the state
    twice would: the next step equals a model whose state was reordered once by the composed order."""
    model, d = _model(impl=impl)
    srcs, prevs = _rows(d, n=2, length=5)
    tokens = data_utils.collate_tokens(srcs, d.pad(), left_pad=True)
    lengths = torch.tensor([len(s) for s in srcs])
    prev = torch.stack(prevs)
    first, second = torch.tensor([1, 0]), torch.tensor([1, 1])
    outs = []
    with torch.no_grad():
        for orders in ([first, second], [first[second]]):
            enc = model.encoder(tokens, src_lengths=lengths)
            state = {}
            for t in range(3):
                model.decoder(prev[:, :t + 1], encoder_out=enc, incremental_state=state)
            for o in orders:
                model.decoder.reorder_incremental_state_scripting(state, o)
                enc = model.encoder.reorder_encoder_out(enc, o)
            outs.append(model.decoder(prev[:, :4], encoder_out=enc, incremental_state=state)[0])
    assert torch.allclose(outs[0], outs[1], atol=1e-6)
