"""FastTrees: scan = loop, gate structure, batching invariance, causality, DDP, trees, errors (incremental decoding with distinct beams, half precision and host syncs: test_fasttrees_gpu_readiness.py)."""
import pytest
import torch

from tests.helpers import invariance
from tests.helpers.ddp import assert_ddp_matches_single_process, translation_batches_and_loss
from tests.helpers.models import build, prev_output, random_sentences
from user_dir.modules.fasttrees_layer import (
    FastTreesConfig,
    FastTreesSublayer,
    cumax,
    fasttrees_modules,
    linear_scan,
    odd_even_scan,
    sequential_scan,
)
from user_dir.modules.fasttrees_trees import (
    build_tree,
    get_brackets,
    gold_tree,
    layer_distances,
    left_branching,
    parse_sexpr,
    right_branching,
    sentence_f1,
    tree_to_string,
)

TINY_MT = ["--encoder-layers", 1, "--decoder-layers", 1, "--encoder-embed-dim", 16, "--decoder-embed-dim", 16,
           "--encoder-ffn-embed-dim", 32, "--decoder-ffn-embed-dim", 32, "--encoder-attention-heads", 2,
           "--decoder-attention-heads", 2, "--dropout", 0, "--chunk-size", 4]
TINY_LM = ["--decoder-layers", 2, "--decoder-embed-dim", 16, "--decoder-ffn-embed-dim", 32,
           "--decoder-attention-heads", 2, "--dropout", 0, "--chunk-size", 4]
VARIANTS = {
    "ffn": [],
    "conv": ["--fasttrees-master", "conv", "--conv-kernel-size", 3, "--conv-dilation", 2],
    "bidirectional": ["--fasttrees-bidirectional"],
    "no-recurrence": ["--fasttrees-no-recurrence"],
}


# --------------------------------------------------------------------------- scan
@pytest.mark.parametrize("T", [1, 2, 7, 64, 257])
def test_parallel_scan_equals_sequential_loop(T):
    g = torch.Generator().manual_seed(T)
    a = torch.rand(T, 3, 8, generator=g, dtype=torch.float64).requires_grad_()
    b = torch.randn(T, 3, 8, generator=g, dtype=torch.float64).requires_grad_()
    ref = sequential_scan(a, b)
    got = linear_scan(a, b)
    assert torch.allclose(got, ref, atol=1e-12)
    c0 = torch.randn(3, 8, generator=g, dtype=torch.float64)
    assert torch.allclose(linear_scan(a, b, c0), sequential_scan(a, b, c0), atol=1e-12)
    ga = torch.autograd.grad(ref.sum(), (a, b), allow_unused=True, materialize_grads=True)
    gb = torch.autograd.grad(got.sum(), (a, b), allow_unused=True, materialize_grads=True)
    for x, y in zip(ga, gb):
        assert torch.allclose(x, y, atol=1e-10)
    # float32, long sequence: within float error of the float64 loop
    a32, b32 = a.detach().float(), b.detach().float()
    err = (linear_scan(a32, b32).double() - ref.detach()).abs().max().item()
    assert err < 1e-5, err


@pytest.mark.parametrize("T", [1, 2, 3, 8, 13, 64, 257])
def test_reverse_scan_equals_right_to_left_loop(T):
    """odd_even_scan(reverse=True): c_t = a_t c_{t+1} + b_t, c_T = 0 (the backward pass's recurrence)."""
    g = torch.Generator().manual_seed(T)
    a = torch.rand(T, 3, 4, generator=g, dtype=torch.float64)
    b = torch.randn(T, 3, 4, generator=g, dtype=torch.float64)
    ref = sequential_scan(a.flip(0), b.flip(0)).flip(0)
    assert torch.allclose(odd_even_scan(a, b, reverse=True), ref, atol=1e-12)
    assert torch.allclose(odd_even_scan(a, b), sequential_scan(a, b), atol=1e-12)


@pytest.mark.parametrize("T", [2, 3, 9, 70])
def test_scan_backward_equals_loop_gradients(T):
    """The hand-written backward (a reverse-time scan) gives autograd's gradients of the loop, c0 included."""
    g = torch.Generator().manual_seed(T)
    a = torch.rand(T, 2, 5, generator=g, dtype=torch.float64).requires_grad_()
    b = torch.randn(T, 2, 5, generator=g, dtype=torch.float64).requires_grad_()
    c0 = torch.randn(2, 5, generator=g, dtype=torch.float64).requires_grad_()
    w = torch.randn(T, 2, 5, generator=g, dtype=torch.float64)  # non-uniform upstream gradient
    ref = torch.autograd.grad((sequential_scan(a, b, c0) * w).sum(), (a, b, c0))
    got = torch.autograd.grad((linear_scan(a, b, c0) * w).sum(), (a, b, c0))
    for x, y in zip(got, ref):
        assert torch.allclose(x, y, atol=1e-12)
    assert torch.autograd.gradcheck(lambda a, b: linear_scan(a, b), (a[:7], b[:7]))


def test_scan_is_not_trivially_equal():
    """The check above can fail: a scan that ignores c_{t-1} differs from the loop."""
    a, b = torch.full((5, 1), 0.5), torch.ones(5, 1)
    assert not torch.allclose(linear_scan(a, b), b)
    assert torch.allclose(linear_scan(a, b)[:, 0], torch.tensor([1, 1.5, 1.75, 1.875, 1.9375]))


@pytest.mark.parametrize("bidirectional", [False, True])
def test_sublayer_parallel_equals_loop_with_padding(bidirectional):
    torch.manual_seed(0)
    layer = FastTreesSublayer(16, FastTreesConfig(chunk_size=4), causal=not bidirectional,
                              bidirectional=bidirectional).double()
    x = torch.randn(9, 3, 16, dtype=torch.float64)
    pad = torch.zeros(3, 9, dtype=torch.bool)
    pad[1, :4] = True  # left padding
    pad[2, 6:] = True  # right padding
    reference = FastTreesSublayer(16, FastTreesConfig(chunk_size=4), causal=not bidirectional,
                                  bidirectional=bidirectional, scan="loop").double()
    reference.load_state_dict(layer.state_dict())
    fast, slow = layer(x, pad), reference(x, pad)
    assert torch.allclose(fast, slow, atol=1e-12)


def test_master_gates_are_ordered_and_chunked():
    torch.manual_seed(0)
    layer = FastTreesSublayer(24, FastTreesConfig(chunk_size=3), causal=True)
    f_master, i_master = layer.master_gates(torch.randn(5, 2, 24))
    assert f_master.shape == (5, 2, 8)  # 24 / chunk 3 master units
    assert (f_master.diff(dim=-1) >= -1e-6).all() and torch.allclose(f_master[..., -1], torch.ones(5, 2))
    assert (i_master.diff(dim=-1) <= 1e-6).all() and torch.allclose(i_master[..., -1], torch.zeros(5, 2), atol=1e-6)
    assert torch.allclose(cumax(torch.zeros(4)), torch.tensor([0.25, 0.5, 0.75, 1.0]))


def _plain_equations(layer, x):
    """The sublayer written out equation by equation (ON-LSTM eqs. 9-14, master FFN), one Linear per map."""
    T, B, d = x.shape
    C, n = layer.chunk_size, layer.n_chunk
    hf, hi = torch.relu(layer.master_in(x)).chunk(2, -1)
    f_master = cumax(layer.master_forget(hf)).repeat_interleave(C, -1)
    i_master = 1 - cumax(layer.master_input(hi)).repeat_interleave(C, -1)
    w_o, w_c, w_i, w_f = layer.gates.weight.chunk(4, 0)
    b_o, b_c, b_i, b_f = layer.gates.bias.chunk(4, 0)
    o, c_hat = torch.sigmoid(x @ w_o.t() + b_o), torch.tanh(x @ w_c.t() + b_c)
    i, f = torch.sigmoid(x @ w_i.t() + b_i), torch.sigmoid(x @ w_f.t() + b_f)
    omega = f_master * i_master
    f_hat, i_hat = f * omega + (f_master - omega), i * omega + (i_master - omega)
    c, out = torch.zeros(B, d, dtype=x.dtype), []
    for t in range(T):
        c = f_hat[t] * c + i_hat[t] * c_hat[t]
        out.append(o[t] * torch.tanh(c))
    assert n * C == d
    return torch.stack(out)


def test_sublayer_equals_plain_equations():
    """The sublayer (chunked masters, parallel scan with its hand-written backward) computes the paper's equations."""
    torch.manual_seed(0)
    layer = FastTreesSublayer(24, FastTreesConfig(chunk_size=3), causal=True).double()
    x = torch.randn(11, 3, 24, dtype=torch.float64, requires_grad=True)
    got, ref = layer(x), _plain_equations(layer, x)
    assert torch.allclose(got, ref, atol=1e-12)
    g_got = torch.autograd.grad(got.square().sum(), [x] + list(layer.parameters()))
    g_ref = torch.autograd.grad(ref.square().sum(), [x] + list(layer.parameters()))
    for a, b in zip(g_got, g_ref):
        assert torch.allclose(a, b, atol=1e-10)
    # and the check can fail: a different master forget gate changes the output
    with torch.no_grad():
        layer.master_forget.bias[0] += 2.0
    assert not torch.allclose(layer(x), ref, atol=1e-6)


def test_conv_master_is_causal():
    """Conv. FastTrees: gates at t do not depend on x_{>t} (the released ConvFT reads x_{t+1})."""
    torch.manual_seed(0)
    layer = FastTreesSublayer(16, FastTreesConfig(chunk_size=4, fasttrees_master="conv", conv_kernel_size=2,
                                                  conv_dilation=2), causal=True)
    x = torch.randn(8, 1, 16)
    base = layer(x)
    for t in range(7):
        changed = x.clone()
        changed[t + 1:] = torch.randn(7 - t, 1, 16)
        assert torch.allclose(layer(changed)[: t + 1], base[: t + 1], atol=1e-6)
        assert not torch.allclose(layer(changed)[t + 1:], base[t + 1:])


# --------------------------------------------------------------------------- models
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_translation_model_invariances(variant):
    model, d = build("fasttrees_transformer", TINY_MT + VARIANTS[variant])
    srcs = random_sentences(d, [5, 9, 3], seed=1)
    tgts = [prev_output(t, d.eos()) for t in random_sentences(d, [7, 4, 6], seed=2)]
    invariance.assert_padding_invariant(model, srcs, tgts, d.pad())
    invariance.assert_decoder_causal(model, srcs[0], tgts[0], d.pad(), len(d))


@pytest.mark.parametrize("variant", ["ffn", "conv"])
def test_language_model_invariances(variant):
    model, d = build("fasttrees_transformer_lm", TINY_LM + VARIANTS[variant], task="language_modeling")
    tgts = [prev_output(t, d.eos()) for t in random_sentences(d, [7, 4, 9], seed=2)]
    invariance.assert_padding_invariant(model, None, tgts, d.pad())
    invariance.assert_decoder_causal(model, None, tgts[2], d.pad(), len(d))


def test_block_order_self_attention_fasttrees_ffn():
    model, _ = build("fasttrees_transformer", TINY_MT)
    layer = model.encoder.layers[0]
    calls = []
    for name in ("self_attn", "fasttrees", "fc1"):
        getattr(layer, name).register_forward_hook(lambda m, i, o, name=name: calls.append(name))
    model.encoder(torch.tensor([[5, 6, 7, 2]]), src_lengths=torch.tensor([4]))
    assert calls == ["self_attn", "fasttrees", "fc1"]
    assert len(fasttrees_modules(model)) == 2  # one per encoder and decoder layer


def _roberta(extra=()):
    return build("fasttrees_roberta_logic", ["--encoder-embed-dim", 16, "--encoder-ffn-embed-dim", 32,
                                             "--encoder-layers", 1, "--chunk-size", 4, "--dropout", 0,
                                             "--criterion", "sentence_prediction", "--num-classes", 3,
                                             "--max-positions", 64, *extra], task="sentence_prediction")


def test_classification_head_interface_and_padding():
    model, d = _roberta(["--fasttrees-bidirectional"])
    model.register_classification_head("sentence_classification_head", num_classes=3)
    sents = [torch.cat([torch.tensor([d.bos()]), s]) for s in random_sentences(d, [6, 3], seed=4)]
    batch = torch.full((2, 8), d.pad())
    batch[0], batch[1, :5] = sents[0], sents[1]  # right padding, as sentence_prediction collates
    logits, _ = model(batch, features_only=True, classification_head_name="sentence_classification_head")
    alone, _ = model(sents[1][None], features_only=True, classification_head_name="sentence_classification_head")
    assert logits.shape == (2, 3)
    assert torch.allclose(logits[1], alone[0], atol=1e-5)


def ddp_setup():
    model, d = build("fasttrees_transformer", TINY_MT + VARIANTS["conv"] + ["--fasttrees-bidirectional"])
    return translation_batches_and_loss(model, d)


def test_ddp_readiness():
    assert_ddp_matches_single_process("tests.test_fasttrees:ddp_setup")


# --------------------------------------------------------------------------- trees
def test_build_tree_hand_checked():
    words = "the cat sat on the mat".split()
    tree = build_tree([0.0, 0.1, 0.8, 0.3, 0.5, 0.2], words)
    # split before "sat" (largest), then before "cat" and before the second "the"
    assert tree_to_string(tree) == "((the cat) (sat (on (the mat))))"
    assert get_brackets(tree)[0] == {(0, 2), (2, 6), (3, 6), (4, 6)}
    gold = [["the", "cat"], ["sat", ["on", ["the", "mat"]]]]
    assert sentence_f1(tree, gold) == 1.0
    # right-branching shares (2,6) (3,6) (4,6) of 4 gold brackets: P = 3/4 (0,6 not counted), R = 3/4
    assert sentence_f1(right_branching(words), gold) == pytest.approx(0.75)
    assert tree_to_string(left_branching(words[:3])) == "((the cat) sat)"
    assert tree_to_string(build_tree([0.5, 0.5, 0.1], ["a", "b", "c"])) == "(a (b c))"  # ties: first maximum


def test_gold_tree_drops_punctuation_and_empty_elements():
    text = "( (S (NP-SBJ (DT The) (NN cat) ) (, ,) (VP (VBD sat) (NP (-NONE- *T*-1) )) (. .) ))"
    (node,) = parse_sexpr(text)
    assert gold_tree(node) == [["the", "cat"], "sat"]


def test_layer_distances_are_one_minus_mean_master_forget():
    model, d = build("fasttrees_transformer_lm", TINY_LM, task="language_modeling")
    tokens = torch.stack(random_sentences(d, [6, 6], seed=3))
    dist = layer_distances(model, tokens)
    assert dist.shape == (2, 2, 7)
    inputs = []
    sublayer = model.decoder.layers[0].fasttrees
    sublayer.register_forward_hook(lambda m, args, out: inputs.append(args[0]))
    with torch.no_grad():
        model(tokens)
        f_master, _ = sublayer.master_gates(inputs[0])
    assert torch.allclose(dist[0], 1 - f_master.mean(-1).t(), atol=1e-5)
    assert all(m.distance is None and not m.record_distance for m in fasttrees_modules(model))


def test_tree_request_on_model_without_fasttrees_layers():
    model, d = build("transformer_lm", ["--decoder-layers", 1, "--decoder-embed-dim", 16,
                                        "--decoder-ffn-embed-dim", 32, "--decoder-attention-heads", 2],
                     task="language_modeling")
    with pytest.raises(ValueError, match="no FastTrees layers"):
        layer_distances(model, torch.tensor([[2, 5, 6]]))


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("extra, message", [
    (["--chunk-size", 5], r"--chunk-size 5 must be a positive divisor of the model dimension 16"),
    (["--chunk-size", 0], r"--chunk-size 0"),
    (["--fasttrees-master", "conv", "--conv-kernel-size", 0], r"--conv-kernel-size must be >= 1, got 0"),
    (["--fasttrees-master", "conv", "--conv-dilation", 0], r"--conv-dilation must be >= 1"),
    (["--chunk-size", 16, "--fasttrees-bidirectional"], r"--fasttrees-bidirectional needs an even number"),
])
def test_bad_flags_give_clear_errors(extra, message):
    with pytest.raises(ValueError, match=message):
        build("fasttrees_transformer", TINY_MT + extra)


def test_bidirectional_language_model_is_refused():
    with pytest.raises(ValueError, match="--fasttrees-bidirectional is for encoders"):
        build("fasttrees_transformer_lm", TINY_LM + ["--fasttrees-bidirectional"], task="language_modeling")
