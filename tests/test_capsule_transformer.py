"""capsule_transformer: routing semantics, batching invariances, DDP, parameter count, errors."""
import pytest
import torch

from tests.helpers import invariance
from tests.helpers.ddp import assert_ddp_matches_single_process, translation_batches_and_loss
from tests.helpers.models import build, prev_output, random_sentences
from user_dir.models.capsule_transformer import ATTENTION_MODULES, IMPLEMENTATIONS
from user_dir.modules.capsule_routing import CapsuleMultiheadAttention, CapsuleRouting, dynamic_routing

TINY = ["--encoder-layers", 2, "--decoder-layers", 2, "--encoder-embed-dim", 32, "--decoder-embed-dim", 32,
        "--encoder-ffn-embed-dim", 32, "--decoder-ffn-embed-dim", 32, "--encoder-attention-heads", 4,
        "--decoder-attention-heads", 4, "--dropout", 0]
ALL_MODULES = ["--routed-attention", ",".join(ATTENTION_MODULES)]
# every equality test runs on both implementations (--capsule-implementation)
IMPL = pytest.mark.parametrize("impl", list(IMPLEMENTATIONS))


def _impl(impl):
    return ["--capsule-implementation", impl]


def _model(*extra, seed=0):
    return build("capsule_transformer", TINY + list(extra), seed=seed)


def _data(d):
    srcs = random_sentences(d, [5, 9, 3], seed=1)
    tgts = [prev_output(t, d.eos()) for t in random_sentences(d, [7, 4, 6], seed=2)]
    return srcs, tgts


def _routed_by_name(model):
    return {n: m for n, m in model.named_modules() if isinstance(m, CapsuleMultiheadAttention)}


def _routed(model):
    return list(_routed_by_name(model).values())


# ------------------------------------------------------------------ routing semantics


def _random_cube(bsz=2, q=6, heads=4, k=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(bsz, q, heads, k, generator=g) * 2
    return logits, torch.full((bsz, q), heads * 0 + k)


@IMPL
@pytest.mark.parametrize("kind", ["vertical", "horizontal"])
@pytest.mark.parametrize("causal", [False, True])
def test_more_iterations_change_the_output(kind, causal, impl):
    logits, counts = _random_cube()
    torch.manual_seed(0)
    routing = IMPLEMENTATIONS[impl][1]
    r1 = routing(4, kind, iters=1, causal=causal)
    r3 = routing(4, kind, iters=3, causal=causal)
    r3.load_state_dict(r1.state_dict())
    o1, o3 = r1(logits, counts)[0], r3(logits, counts)[0]
    assert torch.isfinite(o3).all()
    assert (o1 - o3).abs().max() > 1e-3, "r = 1 and r = 3 give the same Ω: routing does nothing"


def test_vertical_outputs_differ_across_heads():
    logits, counts = _random_cube()
    omega = CapsuleRouting(4, "vertical", iters=3)(logits, counts)[0]  # (B, Q, H, K)
    for h in range(1, 4):
        assert (omega[:, :, h] - omega[:, :, 0]).abs().max() > 1e-3, f"Ω↕ of head {h} equals head 0's"


def test_zero_initial_logits_would_collapse_to_an_average():
    """Why the initial routing logits are learned: identity votes + zero logits = one average."""
    logits, _ = _random_cube()
    caps = logits.permute(0, 2, 1, 3).reshape(2, 4, -1)  # vertical capsules, (B, H, Q·K)
    outputs, _ = dynamic_routing(caps, torch.zeros(4, 4), 3, None, out_dim=-1)  # (B, H, Q·K)
    assert torch.allclose(outputs, outputs[:, :1].expand_as(outputs), atol=1e-6)


def test_routing_changes_the_model_and_iterations_matter():
    model3, d = _model("--routing-iters", 3)
    model1, _ = _model("--routing-iters", 1)
    model1.load_state_dict(model3.state_dict())
    srcs, tgts = _data(d)
    out3 = invariance.decoder_logits(model3, srcs, tgts, d.pad())
    out1 = invariance.decoder_logits(model1, srcs, tgts, d.pad())
    assert (out3 - out1).abs().max() > 1e-4
    vanilla, _ = build("transformer", TINY, seed=0)
    missing = vanilla.load_state_dict({k: v for k, v in model3.state_dict().items() if ".capsule." not in k})
    out_v = invariance.decoder_logits(vanilla, srcs, tgts, d.pad())
    assert (out3 - out_v).abs().max() > 1e-4, "Ω has no effect on the model's output"
    assert not missing.missing_keys


def test_default_routes_encoder_and_decoder_self_attention():
    routed = _routed_by_name(_model()[0])
    assert sorted(routed) == ["decoder.layers.0.self_attn", "decoder.layers.1.self_attn",
                              "encoder.layers.0.self_attn", "encoder.layers.1.self_attn"]
    assert all(m.capsule.causal == n.startswith("decoder") for n, m in routed.items())
    model, _ = _model("--routed-attention", "enc_dec", "--routed-decoder-layers", "1")
    assert list(_routed_by_name(model)) == ["decoder.layers.1.encoder_attn"]
    model, _ = _model("--routed-attention", "enc_self")  # the Multi30k setting (docs/capsule_transformer.md)
    assert list(_routed_by_name(model)) == ["encoder.layers.0.self_attn", "encoder.layers.1.self_attn"]


# ------------------------------------------------------------------ batching invariances


VARIANTS = [
    [],
    ["--routed-attention", "enc_self"],
    ALL_MODULES,
    ALL_MODULES + ["--capsule-routing", "vertical"],
    ALL_MODULES + ["--capsule-routing", "horizontal", "--capsule-squash", "rms", "--horizontal-max-distance", 2],
]


@IMPL
@pytest.mark.parametrize("extra", VARIANTS, ids=["default", "enc-self", "all-both", "all-vertical", "all-horizontal-rms"])
def test_padding_causality_incremental(extra, impl):
    model, d = _model(*extra, *_impl(impl))
    srcs, tgts = _data(d)
    invariance.assert_padding_invariant(model, srcs, tgts, d.pad())
    invariance.assert_decoder_causal(model, srcs[0], tgts[0], d.pad(), len(d))
    invariance.assert_incremental_equals_full(model, srcs[1], tgts[0], d.pad(), reorder=False)  # beams: _beam.py


def test_causality_check_would_catch_non_causal_routing():
    """Pooling vertical capsules over all target positions (non-causal) must be caught."""
    model, d = _model()
    for m in _routed(model):
        m.capsule.causal = False
    srcs, tgts = _data(d)
    with pytest.raises(AssertionError, match="changed by"):
        invariance.assert_decoder_causal(model, srcs[0], tgts[0], d.pad(), len(d))


def test_no_nan_with_heavy_padding_in_training_mode():
    model, d = _model(*ALL_MODULES)
    model.train()
    srcs = random_sentences(d, [1, 12], seed=4)
    tgts = [prev_output(t, d.eos()) for t in random_sentences(d, [1, 10], seed=5)]
    out = invariance.decoder_logits(model, srcs, tgts, d.pad())
    assert torch.isfinite(out).all()


# ------------------------------------------------------------------ DDP, parameters


def ddp_setup():
    model, d = _model(*ALL_MODULES, seed=3)
    return translation_batches_and_loss(model, d)


def test_ddp_readiness():
    assert_ddp_matches_single_process("tests.test_capsule_transformer:ddp_setup")


def test_every_routing_parameter_gets_a_gradient():
    model, batches, loss_fn = ddp_setup()
    loss_fn(model, batches[0]).backward()
    routing = {n: p for n, p in model.named_parameters() if ".capsule." in n}
    assert len(routing) == 2 * 6  # 6 routed modules, vertical + horizontal each
    for n, p in routing.items():
        assert p.grad is not None and p.grad.abs().sum() > 0, n


def _extra_params(arch, sizes):
    """Parameters of ``arch`` minus those of fairseq's transformer with the same flags."""
    capsule, _ = build(arch, sizes)
    vanilla_arch = arch.replace("capsule_transformer", "transformer")
    vanilla, _ = build(vanilla_arch if vanilla_arch != "transformer" else "transformer_wmt_en_de", sizes)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    return count(capsule) - count(vanilla), capsule


@pytest.mark.parametrize("arch,heads,expected", [
    # 12 routed modules (6 encoder + 6 decoder self-attention), H² + 2·8 + 1 each
    ("capsule_transformer", 8, 12 * (8 * 8 + 17)),                  # base: 972
    ("capsule_transformer_wmt_en_de_big", 16, 12 * (16 * 16 + 17)),  # big: 3,276
])
def test_extra_parameter_count(arch, heads, expected):
    # the count depends on heads, layers and routed modules only: shrink the widths, keep the preset's rest
    small = ["--encoder-embed-dim", 2 * heads, "--decoder-embed-dim", 2 * heads, "--encoder-ffn-embed-dim", 8,
             "--decoder-ffn-embed-dim", 8]
    extra, model = _extra_params(arch, small)
    assert model.cfg.encoder.attention_heads == heads and model.cfg.encoder.layers == 6
    assert model.cfg.decoder.attention_heads == heads and model.cfg.decoder.layers == 6
    assert extra == expected


def test_presets():
    model, _ = build("capsule_transformer_iwslt_de_en", ["--encoder-embed-dim", 16, "--decoder-embed-dim", 16])
    assert model.cfg.encoder.attention_heads == 4 and model.cfg.encoder.ffn_embed_dim == 1024
    assert model.cfg.routing_iters == 3 and model.cfg.capsule_routing == "both"


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize("flags,message", [
    (["--routing-iters", 0], "--routing-iters must be a positive integer"),
    (["--routing-iters", -2], "--routing-iters must be a positive integer"),
    (["--routed-attention", "enc_dec", "--no-cross-attention"], "no encoder-decoder attention"),
    (["--routed-attention", "dec_cross"], "unknown module"),
    (["--routed-encoder-layers", "0,5"], r"has no layer \[5\]"),
    (["--routed-attention", "dec_self", "--routed-encoder-layers", "0"], "routes no encoder module"),
    (["--horizontal-max-distance", -1], "--horizontal-max-distance must be >= 0"),
])
def test_bad_flags_are_clear_errors(flags, message):
    with pytest.raises(ValueError, match=message):
        _model(*flags)


def test_invalid_choice_is_rejected_by_the_parser():
    with pytest.raises(SystemExit):
        _model("--capsule-routing", "diagonal")


def test_loading_a_checkpoint_with_other_routing_settings_fails_clearly():
    both, _ = _model()
    vertical, _ = _model("--capsule-routing", "vertical")
    with pytest.raises(ValueError, match="different capsule routing settings.*routing parameters"):
        vertical.load_state_dict(both.state_dict())
    more, _ = _model(*ALL_MODULES)
    with pytest.raises(ValueError, match="routed here but not in the checkpoint: decoder.layers.0.encoder_attn"):
        more.load_state_dict(both.state_dict())
    vanilla, _ = build("transformer", TINY)
    with pytest.raises(ValueError, match="no capsule routing parameters"):
        both.load_state_dict(vanilla.state_dict())
    iters1, _ = _model("--routing-iters", 1)  # iterations add no parameters: allowed
    iters1.load_state_dict(both.state_dict())


def test_squash_gain_is_the_papers_with_a_finite_gradient_at_zero():
    """``squash(s) = f·s`` with ``||squash(s)|| = q / (1 + q)`` for ``q = ||s||²`` (paper Eq. 6); an empty
    capsule (``q = 0``) or a Gram form rounded below 0 gives a finite gain and gradient."""
    from user_dir.modules.capsule_routing import squash_gain

    q = torch.tensor([1e-4, 0.25, 1.0, 9.0, 400.0], dtype=torch.float64)
    torch.testing.assert_close(squash_gain(q) * q.sqrt(), q / (1 + q), rtol=1e-12, atol=0)
    edge = torch.tensor([-3e-9, 0.0], requires_grad=True)
    gain = squash_gain(edge)
    gain.sum().backward()
    assert torch.isfinite(gain).all() and torch.isfinite(edge.grad).all() and (gain.abs() < 1e-4).all()


@IMPL
def test_cancelling_capsules_give_no_nan(impl):
    """One visible key, heads with opposite signs: ``||s||²`` rounds below 0 (seen on Multi30k)."""
    logits = torch.zeros(1, 1, 4, 3)
    logits[0, 0, :, 0] = torch.tensor([0.7, -0.36, 0.81, 0.93])
    routing = IMPLEMENTATIONS[impl][1](4, "vertical", iters=3, causal=True)
    with torch.no_grad():
        routing.vertical_logits.copy_(torch.tensor([[1.39, -3.2, 0.1, 0.2], [0.3, 1.39, 0.1, 2.0],
                                                    [0.1, -1.0, 1.39, 0.3], [0.2, -2.0, 0.4, 1.39]]))
    omega = routing(logits, torch.tensor([[1]]))[0]
    assert torch.isfinite(omega).all()


# ------------------------------------------------------------------ --capsule-omega-gate (not in the paper)


def test_omega_gate_starts_as_the_plain_transformer_and_learns():
    gated, d = _model(*ALL_MODULES, "--capsule-omega-gate")
    vanilla, _ = build("transformer", TINY)
    missing, unexpected = torch.nn.Module.load_state_dict(gated, vanilla.state_dict(), strict=False)
    assert not unexpected and missing and all(".capsule." in n for n in missing)
    srcs, tgts = _data(d)
    same = invariance.decoder_logits(gated, srcs, tgts, d.pad())
    assert torch.allclose(same, invariance.decoder_logits(vanilla, srcs, tgts, d.pad()), atol=1e-6)
    gates = [m.capsule.omega_gate for m in _routed(gated)]
    assert len(gates) == 6 and all(g.shape == (4,) for g in gates)
    with torch.enable_grad():  # the gate at 0 still gets a gradient, so routing can switch on
        _, batches, loss_fn = translation_batches_and_loss(gated, d)
        loss_fn(gated, batches[0]).backward()
    assert all(g.grad is not None and g.grad.abs().sum() > 0 for g in gates)
    with torch.no_grad():
        for g in gates:
            g.fill_(0.7)
    assert not torch.allclose(invariance.decoder_logits(gated, srcs, tgts, d.pad()), same, atol=1e-4)


def test_omega_gate_keeps_padding_causality_incremental():
    model, d = _model(*ALL_MODULES, "--capsule-omega-gate")
    with torch.no_grad():
        for m in _routed(model):
            m.capsule.omega_gate.uniform_(0.2, 1.5)
    srcs, tgts = _data(d)
    invariance.assert_padding_invariant(model, srcs, tgts, d.pad())
    invariance.assert_decoder_causal(model, srcs[0], tgts[0], d.pad(), len(d))
    invariance.assert_incremental_equals_full(model, srcs[1], tgts[0], d.pad(), reorder=False)  # beams: _beam.py
    plain, _ = _model(*ALL_MODULES)
    with pytest.raises(ValueError, match="different capsule routing settings"):
        model.load_state_dict(plain.state_dict())


def test_capturing_keeps_the_routing_only_inside_the_block():
    from user_dir.modules.capsule_routing import capturing

    model, d = _model()
    srcs, tgts = _data(d)
    modules = _routed(model)
    with capturing(modules):
        invariance.decoder_logits(model, srcs, tgts, d.pad())
        assert all({"logits_before", "logits_after", "visible"} <= set(m.last_capture) for m in modules)
    assert all(not m.capture and not m.last_capture for m in modules)


# ------------------------------------------------------------------ the fast implementation's products


@pytest.mark.parametrize("size", [5, 127, 128, 257])
def test_triangular_products_equal_dense_ones(size):
    from user_dir.modules.capsule_routing_fast import matmul_lower, matmul_tril, matmul_triu, matmul_upper

    g = torch.Generator().manual_seed(size)
    w, e = torch.randn(2, 1, size, size, generator=g).tril(), torch.randn(2, 3, size, size, generator=g).tril()
    gram, c = torch.randn(2, size, size, generator=g), torch.randn(2, size, size, generator=g).triu()
    assert torch.allclose(matmul_lower(w, e), w @ e, atol=1e-4)
    assert torch.allclose(matmul_upper(gram, c), gram @ c, atol=1e-4)
    keys = torch.randn(2, 3, size, 7, generator=g)
    assert torch.allclose(matmul_tril(e, keys), e @ keys, atol=1e-4)  # u_m = Σ_{k<=m} E_mk k_k
    u, q = torch.randn(2, size, 9, generator=g), torch.randn(2, 9, size, generator=g)
    assert torch.allclose(matmul_triu(u, q).triu(), (u @ q).triu(), atol=1e-4)  # only the upper triangle


def test_factored_horizontal_gram_equals_the_capsule_gram():
    """G_mn = u_min·q_max (capsule_routing_fast) is the Gram of the explicit (M × H·K) capsules, for key padding
    (every row sees the same keys) and for causal self-attention (row m sees keys <= m)."""
    from user_dir.modules.capsule_routing_fast import factored_gram

    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 4, 9, 5, generator=g), torch.randn(2, 4, 9, 5, generator=g)  # (B, H, M, d)
    for visible in (torch.rand(2, 1, 1, 9, generator=g) > 0.3, torch.ones(9, 9, dtype=torch.bool).tril()):
        cube = (q @ k.transpose(2, 3)) * visible  # (B, H, M, K), masked entries 0
        caps = cube.transpose(1, 2).reshape(2, 9, -1)
        u = (cube @ k).transpose(1, 2).reshape(2, 9, -1)
        assert torch.allclose(factored_gram(u, q.transpose(1, 2).reshape(2, 9, -1)), caps @ caps.transpose(1, 2),
                              atol=1e-4)


def _squash(s, size):
    """Paper Eq. 6 on the last dimension, norms divided by ``size``; ``squash(0) = 0``."""
    q = s.square().sum(-1, keepdim=True) / size
    return torch.where(q > 0, q / ((1 + q) * q.sqrt()), 0.0) * s


def _horizontal_written_out(cube, counts, routing):
    """Paper Alg. 1 for horizontal capsules, one output token at a time, on explicit capsules
    ``C_m = E[m]`` (``H·K`` entries): couplings over the visible input tokens, ``s_n = Σ_m c_m C_m``,
    ``v_n = squash(s_n)``, ``b_m += <C_m, v_n>`` (divided by the capsule size in rms mode)."""
    bsz, q_len, heads, k_len = cube.shape
    caps = cube.reshape(bsz, q_len, heads * k_len)
    table, dist = routing.horizontal_logits.detach(), routing.max_distance
    out = torch.zeros_like(caps)
    for b in range(bsz):
        for n in range(q_len):
            inputs = [m for m in range(q_len) if counts[b, m] > 0 and (m <= n or not routing.causal)]
            if not inputs:  # a pad row's causal prefix: nothing to route, Ω = 0
                continue
            logits = torch.stack([table[max(-dist, min(dist, n - m)) + dist] for m in inputs])
            size = max(float(counts[b, n] * heads), 1.0) if routing.squash == "rms" else 1.0
            for it in range(routing.iters):
                c = torch.softmax(logits, 0)
                s = sum(c[i] * caps[b, m] for i, m in enumerate(inputs))
                v = _squash(s, size)
                if it + 1 < routing.iters:
                    logits = logits + torch.stack([caps[b, m].dot(v) for m in inputs]) / size
            out[b, n] = v
    return out.view_as(cube)


def _vertical_written_out(cube, counts, routing):
    """Paper Alg. 1 for vertical capsules on explicit capsules ``C_h`` (head ``h``'s logits of the query
    rows, ``Q·K`` entries; when causal, query ``t``'s capsules are the prefix of rows ``<= t``): couplings
    over the output heads, ``s_n = Σ_h c_hn C_h``, ``v_n = squash(s_n)``, ``b_hn += <C_h, v_n>``."""
    bsz, q_len, heads, k_len = cube.shape
    out = torch.zeros_like(cube)
    for b in range(bsz):
        for t in range(q_len) if routing.causal else [q_len - 1]:
            caps = cube[b, :t + 1].transpose(0, 1).reshape(heads, -1)
            size = max(float(counts[b, :t + 1].sum()), 1.0) if routing.squash == "rms" else 1.0
            logits = routing.vertical_logits.detach()
            for it in range(routing.iters):
                v = _squash(torch.softmax(logits, 1).T @ caps, size)  # (H out, entries)
                if it + 1 < routing.iters:
                    logits = logits + caps @ v.T / size
            v = v.view(heads, t + 1, k_len).transpose(0, 1)
            if routing.causal:
                out[b, t] = v[t]
            else:
                out[b] = v
    return out


@IMPL
@pytest.mark.parametrize("squash", ["l2", "rms"])
@pytest.mark.parametrize("causal", [False, True])
def test_vertical_routing_equals_the_algorithm_written_out(causal, squash, impl):
    """Ω↕ (of the Gram form with per-query prefix Grams when fast) = the algorithm written out."""
    routing = IMPLEMENTATIONS[impl][1](4, routing="vertical", causal=causal, squash=squash)
    torch.nn.init.normal_(routing.vertical_logits, generator=torch.Generator().manual_seed(1))  # asymmetric
    cube, counts = _random_cube()
    counts[1, 0], counts[0, 2] = 0, 3  # a pad row, and a row that sees 3 keys
    cube[1, 0], cube[0, 2, :, 3:] = 0.0, 0.0
    with torch.no_grad():
        omega, _, _ = routing(cube, counts)
    expected = _vertical_written_out(cube, counts, routing)
    assert torch.allclose(omega, expected, atol=1e-5), (omega - expected).abs().max()


@IMPL
@pytest.mark.parametrize("squash", ["l2", "rms"])
@pytest.mark.parametrize("causal", [False, True])
def test_horizontal_routing_equals_the_algorithm_written_out(causal, squash, impl):
    """Ω↔ = the algorithm on explicit capsules, output by output: on a bare cube with a pad row, and in
    self-attention (future mask when causal; rows longer than the head width, so the fast implementation's
    factored Gram and Ω products)."""
    attention_class, routing_class = IMPLEMENTATIONS[impl]
    routing = routing_class(4, routing="horizontal", causal=causal, squash=squash, max_distance=3)
    torch.nn.init.normal_(routing.horizontal_logits, generator=torch.Generator().manual_seed(1))  # asymmetric
    cube, counts = _random_cube(q=6, k=6)
    counts[1, 0] = 0  # a pad row: no capsule
    cube[1, 0] = 0.0
    with torch.no_grad():
        omega, _, _ = routing(cube, counts)
        expected = _horizontal_written_out(cube, counts, routing)
        assert torch.allclose(omega, expected, atol=1e-5), (omega - expected).abs().max()
        torch.manual_seed(0)
        attention = attention_class(8, 4, routing, self_attention=True)
        future = torch.triu(torch.full((12, 12), float("-inf")), 1) if causal else None
        attention.capture = True
        attention(*[torch.randn(12, 2, 8)] * 3, attn_mask=future)
        captured = attention.last_capture
        visible = captured["visible"]
        cube = captured["logits_before"].transpose(1, 2).masked_fill(~visible.unsqueeze(2), 0.0)
        expected = _horizontal_written_out(cube, visible.sum(-1), routing)
        assert torch.allclose(captured["omega_horizontal"], expected, atol=1e-5)


@pytest.mark.parametrize("kind", ["self", "cross"])
def test_factored_routing_with_key_padding_equals_the_explicit_capsules(kind):
    """Long rows (``M·K > (M + K)·d``) take ``u_m = q_m (K_hᵀ K_h)`` (fast :func:`key_gram_u`), which needs the
    pad keys zeroed: ``Ω↔`` must equal the reference routing over the explicit capsules at every visible entry."""
    torch.manual_seed(0)
    fast, reference = IMPLEMENTATIONS["fast"], IMPLEMENTATIONS["reference"]
    attention = fast[0](16, 4, fast[1](4, routing="horizontal"),
                        self_attention=kind == "self", encoder_decoder_attention=kind == "cross")
    explicit_routing = reference[1](4, routing="horizontal")
    explicit_routing.load_state_dict(attention.capsule.state_dict())
    x, memory = torch.randn(30, 2, 16), torch.randn(26, 2, 16)
    key_pad = torch.zeros(2, 30 if kind == "self" else 26, dtype=torch.bool)
    key_pad[0, :9] = True  # left padding
    key = x if kind == "self" else memory
    with torch.no_grad():
        attention.capture = True
        attention(x, key, key, key_padding_mask=key_pad)
        captured = attention.last_capture
        visible = captured["visible"]  # (B, T, S)
        routed = visible & ~key_pad.unsqueeze(2) if kind == "self" else visible
        cube = captured["logits_before"].transpose(1, 2).masked_fill(~routed.unsqueeze(2), 0.0)
        explicit, _, _ = explicit_routing(cube, routed.sum(-1))
    factored = captured["omega_horizontal"]
    mask = routed.unsqueeze(2).expand_as(factored)
    assert torch.allclose(factored[mask], explicit[mask], atol=1e-5), (factored - explicit)[mask].abs().max()


@IMPL
def test_long_target_full_pass_equals_decoding(impl):
    """At 140 target tokens the fast full pass takes the blocked triangular products, and fast decoding keeps
    the logit rows, then u rows, in-block logits and the Gram, in decoder self- and encoder-decoder
    attention: full pass and decoding must agree."""
    model, d = _model(*ALL_MODULES, *_impl(impl))
    src = random_sentences(d, [20], seed=3)[0]
    prev = prev_output(random_sentences(d, [140], seed=4)[0], d.eos())
    invariance.assert_incremental_equals_full(model, src, prev, d.pad(), reorder=False)


@pytest.mark.parametrize("size", [1, 5, 16, 17, 70])
def test_suffix_weighted_sums_equal_a_loop(size):
    """Decoding's Ω↔ sums w_m q_m over rows m >= k: blocked (block 4 here) = the plain sums."""
    from user_dir.modules.capsule_routing_fast import suffix_weighted_sums

    g = torch.Generator().manual_seed(size)
    w, rows = torch.rand(2, 3, size, generator=g), torch.randn(2, size, 5, generator=g)
    loop = torch.stack([(w[:, :, k:, None] * rows[:, None, k:]).sum(2) for k in range(size)], dim=2)
    assert torch.allclose(suffix_weighted_sums(w, rows, block=4), loop, atol=1e-5)


@pytest.mark.parametrize("size", [1, 4, 5, 16, 17, 70])
def test_decode_suffix_omega_equals_suffix_weighted_sums(size):
    """One decoding step's Ω↔ from block totals and kept in-block logits (block 4 here: several blocks,
    a partial last one at 5, 17, 70) = k_k · Σ_{m>=k} w_m q_m from suffix_weighted_sums; the in-block
    logits kept row by row (as decoding grows them) = those of the whole cube at once."""
    from user_dir.modules.capsule_routing_fast import block_diagonal, decode_suffix_omega, suffix_weighted_sums

    g = torch.Generator().manual_seed(size)
    bsz, heads, hd = 2, 3, 5
    q, k = torch.randn(bsz, heads, size, hd, generator=g), torch.randn(bsz, heads, size, hd, generator=g)
    cube = (q @ k.transpose(2, 3)).tril().transpose(1, 2)  # (B, M, H, K): row m sees keys <= m
    q_rows = q.transpose(1, 2).reshape(bsz, size, -1)
    w = torch.rand(bsz, size, generator=g)
    sums = suffix_weighted_sums(w.unsqueeze(1), q_rows, block=4).view(bsz, size, heads, hd)
    expected = (sums * k.transpose(1, 2)).sum(-1).transpose(1, 2)  # (B, H, K)
    diag = block_diagonal(cube, 0, block=4)
    grown = torch.cat([block_diagonal(cube[:, m:m + 1, :, :m + 1], m, block=4) for m in range(size)], dim=1)
    assert torch.equal(grown, diag)
    omega = decode_suffix_omega(w, q_rows, k, diag, block=4)
    assert torch.allclose(omega, expected, atol=1e-5)


# ------------------------------------------------------------------ fast = reference


def _module_pair(kind, module, squash, dtype):
    """The same attention module (same weights) in the reference and the fast implementation."""
    torch.manual_seed(0)
    pair = []
    for impl in ("reference", "fast"):
        attention, routing = IMPLEMENTATIONS[impl]
        pair.append(attention(16, 4, routing(4, kind, causal=module != "encoder", squash=squash, max_distance=3),
                              self_attention=module != "cross", encoder_decoder_attention=module == "cross"))
    for p in pair[0].capsule.parameters():
        torch.nn.init.normal_(p, generator=torch.Generator().manual_seed(1))
    pair[1].load_state_dict(pair[0].state_dict())
    return [m.to(dtype).eval() for m in pair]


def _run_module(attention, module, x, memory, key_pad, step_by_step):
    """Outputs ``(T, B, E)`` of a full pass (encoder: key padding; decoder self-attention: future mask;
    cross-attention: source key padding), or of incremental decoding, one query at a time."""
    tgt_len = x.size(0)
    key = memory if module == "cross" else x
    if not step_by_step:
        future = torch.triu(torch.full((tgt_len, tgt_len), float("-inf")), 1) if module == "decoder" else None
        return attention(x, key, key, key_padding_mask=None if module == "decoder" else key_pad,
                         attn_mask=future)[0]
    state, outs = {}, []
    for t in range(tgt_len):
        query = x[t:t + 1]
        key = memory if module == "cross" else query
        outs.append(attention(query, key, key, incremental_state=state, static_kv=module == "cross",
                              key_padding_mask=key_pad if module == "cross" else None)[0])
    return torch.cat(outs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("kind", ["vertical", "horizontal", "both"])
@pytest.mark.parametrize("module", ["encoder", "decoder", "cross"])
@pytest.mark.parametrize("squash", ["l2", "rms"])
def test_fast_equals_reference(module, kind, dtype, squash):
    """The fast implementation (Gram matrices, factors, kept state) = the reference (explicit capsules) on
    random inputs with key padding (encoder, cross-attention) and the causal mask (decoder), in a full pass
    and, for decoder modules, in incremental decoding; 40 queries, past every threshold of the fast path at
    head width 4 (kept logit rows to 8, blocks of 16)."""
    g = torch.Generator().manual_seed(2)
    x, memory = torch.randn(40, 3, 16, generator=g) * 3, torch.randn(23, 3, 16, generator=g) * 3
    key_pad = torch.zeros(3, 40 if module == "encoder" else 23, dtype=torch.bool)
    key_pad[0, :9], key_pad[2, -4:] = True, True  # left and right padding
    reference, fast = _module_pair(kind, module, squash, dtype)
    x, memory = x.to(dtype), memory.to(dtype)
    # bfloat16: the logits are rounded to 8 bits (the fast path routes from the unrounded factors): 3% of the
    # outputs' scale
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    with torch.no_grad():
        for step_by_step in ([False, True] if module != "encoder" else [False]):
            expected = _run_module(reference, module, x, memory, key_pad, step_by_step).float()
            got = _run_module(fast, module, x, memory, key_pad, step_by_step).float()
            assert torch.isfinite(expected).all()
            err = (got - expected).abs().max()
            assert err <= tol * max(1.0, expected.abs().max()), (step_by_step, err)
