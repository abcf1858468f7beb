"""capsule_transformer in float16, bfloat16 and under CPU autocast, against fairseq's transformer.

Routing (Gram matrices, squash, couplings, agreements) runs in float32 and only ``Ω`` is cast
back, so the model's low-precision error must stay within a few times the error of fairseq's
``transformer`` of the same size in the same dtype on the same input
(:func:`tests.helpers.precision.assert_low_precision_close`).  The inputs are the ones where
float16 range matters (routing kept in float16 overflows on them): length 120 with sharpened
attention, plus length 1 and pad rows.
"""
import pytest
import torch
from fairseq.data import data_utils

from tests.helpers import precision
from tests.helpers.models import build, random_sentences, toy_dictionary
from tests.test_capsule_transformer import ALL_MODULES, IMPL

# 2 + 2 layers, 8 heads: a size at which routing kept in float16 overflows
SIZES = ["--encoder-layers", 2, "--decoder-layers", 2, "--encoder-embed-dim", 64, "--decoder-embed-dim", 64,
         "--encoder-ffn-embed-dim", 128, "--decoder-ffn-embed-dim", 128, "--encoder-attention-heads", 8,
         "--decoder-attention-heads", 8, "--dropout", 0]
SHARPEN = 8.0


def _pair(*extra, impl="fast"):
    d = toy_dictionary(60)
    extra = extra + ("--capsule-implementation", impl)
    capsule, _ = build("capsule_transformer", SIZES + ALL_MODULES + list(extra), dictionary=d, seed=0)
    vanilla, _ = build("transformer", SIZES, dictionary=d, seed=0)
    vanilla.load_state_dict({k: v for k, v in capsule.state_dict().items() if ".capsule." not in k})
    assert precision.sharpen_attention(capsule, SHARPEN) == 6 and precision.sharpen_attention(vanilla, SHARPEN) == 6
    return capsule, vanilla, d


def _run(d, src_lengths, tgt_lengths, seed=11):
    """``run(model)``: decoder logits for left-padded sources and right-padded targets."""
    srcs = random_sentences(d, src_lengths, seed=seed)
    tgts = random_sentences(d, tgt_lengths, seed=seed + 1)
    tokens = data_utils.collate_tokens(srcs, d.pad(), left_pad=True)
    lengths = torch.tensor([len(s) for s in srcs])
    prev = data_utils.collate_tokens(tgts, d.pad(), d.eos(), move_eos_to_beginning=True)

    def run(model):
        return model(tokens, lengths, prev)[0]

    return run


CASES = {
    "len120": ([120, 97], [120, 64]),   # long rows, pad rows on both sides
    "len1": ([0, 0], [0, 0]),           # one token (EOS) each side
    "pad-rows": ([1, 40], [30, 0]),     # a target that is all pad after EOS
}


@IMPL
@pytest.mark.parametrize("dtype", precision.LOW_PRECISION, ids=["fp16", "bf16"])
@pytest.mark.parametrize("case", list(CASES))
def test_low_precision_close_to_float32_like_fairseq(dtype, case, impl):
    capsule, vanilla, d = _pair(impl=impl)
    run = _run(d, *CASES[case])
    err, base = precision.assert_low_precision_close(capsule, run, vanilla, run, dtype)
    assert err > 0  # the model did run in low precision


def test_fp16_routing_gram_beyond_float16_range_stays_finite():
    """The Gram matrices of a sharpened length-120 batch exceed float16's 65504 (a vertical capsule
    is a head's whole Lq × Lk slice): they must be formed in float32 (a float16 Gram gives inf,
    then NaN couplings)."""
    from user_dir.modules.capsule_routing import CapsuleMultiheadAttention, capturing

    capsule, _, d = _pair()
    run = _run(d, *CASES["len120"])
    model = capsule.half()
    modules = [m for m in model.modules() if isinstance(m, CapsuleMultiheadAttention)]
    with torch.no_grad(), capturing(modules):
        out = run(model)
        # the vertical Gram's diagonal: a head's squared logits over all queries and keys
        biggest = max(m.last_capture["logits_before"].float().pow(2).sum((2, 3)).max() for m in modules)
    assert torch.isfinite(out).all()
    assert biggest > 65504, f"the input no longer stresses the float16 range (largest ||C||² {biggest:.3g})"


@pytest.mark.parametrize("case", ["len120", "pad-rows"])
def test_autocast_bf16_forward_backward(case):
    capsule, vanilla, d = _pair()
    run = _run(d, *CASES[case])
    out = precision.assert_autocast_backward(capsule, run)
    ref = precision.assert_autocast_backward(vanilla, run)
    with torch.no_grad():
        full = run(capsule.float()).float()
        full_ref = run(vanilla.float()).float()
    finite = torch.isfinite(full)
    err = (out[finite] - full[finite]).abs().max().item()
    base = (ref[finite] - full_ref[finite]).abs().max().item()
    assert err <= 4 * base + 1e-3, f"autocast error {err:.3g} vs fairseq transformer's {base:.3g}"
    routing = [p for n, p in capsule.named_parameters() if ".capsule." in n]
    assert routing and any(p.grad is not None and p.grad.abs().sum() > 0 for p in routing)


@IMPL
@pytest.mark.parametrize("dtype", precision.LOW_PRECISION, ids=["fp16", "bf16"])
def test_low_precision_beam_search_runs_on_kept_state(dtype, impl):
    """Beam search in float16 / bfloat16 for 24 target tokens, so decoding passes from kept logit rows to
    kept u rows (twice the head width, 8, is 16): it runs and every hypothesis score is finite."""
    from fairseq.sequence_generator import SequenceGenerator

    capsule, _, d = _pair(impl=impl)
    model = capsule.to(dtype)
    srcs = random_sentences(d, [30, 12], seed=21)
    sample = {"net_input": {"src_tokens": data_utils.collate_tokens(srcs, d.pad(), left_pad=True),
                            "src_lengths": torch.tensor([len(s) for s in srcs])}}
    generator = SequenceGenerator([model], d, beam_size=4, max_len_a=0, max_len_b=24, min_len=24)
    with torch.no_grad():
        hypos = generator.generate([model], sample)
    for sentence in hypos:
        assert len(sentence) == 4
        for hypo in sentence:
            assert len(hypo["tokens"]) == 25 and torch.isfinite(hypo["positional_scores"]).all()
