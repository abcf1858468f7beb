"""Star-Transformer encoder: fastNLP parity, a naive reference, padding invariance, DDP, errors."""
import os

import pytest
import torch

from tests.helpers.ddp import assert_ddp_matches_single_process
from tests.helpers.models import build, random_sentences, toy_dictionary
from user_dir.modules import star_ring_core
from user_dir.modules.star_ring_core import BLOCK_ROWS, RingNeighbours
from user_dir.modules.star_transformer_layer import (FusedRingAttention, RingAttention, StarTransformer,
                                                     StarTransformerOptions)

TINY = ["--encoder-embed-dim", "16", "--encoder-attention-heads", "2", "--encoder-layers", "2",
        "--max-positions", "32", "--dropout", "0", "--pooler-dropout", "0"]


def _fastnlp():
    os.environ.setdefault("FASTNLP_BACKEND", "torch")
    try:
        from fastNLP.modules.torch.encoder.star_transformer import StarTransformer as FastNLPStar
    except Exception as e:  # pragma: no cover - depends on the environment
        pytest.skip(f"fastNLP 1.0.1 is not importable ({type(e).__name__}: {e}); "
                    "install the test extras (pip install -r requirements-test.txt) to run the parity test")
    return FastNLPStar


@pytest.mark.parametrize("head_dim", [7, 8])
def test_parity_with_fastnlp(head_dim):
    """fastNLP-compatible flags + copied weights: nodes and relay equal fastNLP's to 1e-5."""
    FastNLPStar = _fastnlp()
    torch.manual_seed(0)
    d, heads, L = 24, 3, 11
    ref = FastNLPStar(d, 3, heads, head_dim, dropout=0.0, max_len=16).eval()
    # perturb LayerNorm params so that copying them is actually checked
    for norm in ref.norm:
        torch.nn.init.normal_(norm.weight, 1.0, 0.2)
        torch.nn.init.normal_(norm.bias, 0.0, 0.2)
    mine = StarTransformer(StarTransformerOptions.fastnlp(
        encoder_embed_dim=d, encoder_layers=3, encoder_attention_heads=heads, encoder_head_dim=head_dim,
        max_positions=16, dropout=0.0)).eval()
    mine.load_fastnlp_state(ref)
    x = torch.randn(4, L, d)
    lengths = torch.tensor([11, 7, 3, 1])
    mask = torch.arange(L)[None] < lengths[:, None]
    with torch.no_grad():
        ref_nodes, ref_relay = ref(x.clone(), mask)
        nodes, relay = mine(x, ~mask)
    assert (nodes - ref_nodes).abs().max() < 1e-5
    assert (relay - ref_relay).abs().max() < 1e-5
    # the default (paper) semantics are different from fastNLP's: the check above is not vacuous
    paper = StarTransformer(StarTransformerOptions(encoder_embed_dim=d, encoder_layers=3, encoder_attention_heads=heads,
                                                   encoder_head_dim=head_dim, max_positions=16, dropout=0.0)).eval()
    paper.load_state_dict(mine.state_dict(), strict=False)
    with torch.no_grad():
        assert (paper(x, ~mask)[1] - ref_relay).abs().max() > 1e-3


def _naive_cycle_reference(star, x, pad):
    """Loop-based Algorithm 1 with explicit 5-vector contexts (post-norm, closed ring, masked pads)."""
    o = star.options
    B, n, d = x.shape
    pos = star.positions(pad, B, n, x.device)
    emb = x + star.embed_positions(pos)
    nodes_out, relays = torch.zeros(B, n, d), torch.zeros(B, d)
    for b in range(B):
        real = [i for i in range(n) if not pad[b, i]]
        e = emb[b, real]
        h, s = e.clone(), e.mean(0)
        m = len(real)
        for cyc in star.cycles:
            ra = cyc.ring_attn
            H, dh = ra.heads, ra.head_dim
            new_h = torch.zeros_like(h)
            for i in range(m):
                ctx = [h[(i - 1) % m], h[i], h[(i + 1) % m], e[i], s] if not o.star_no_ring_wrap else \
                    [v for v in ([h[i - 1]] if i > 0 else []) + [h[i]] + ([h[i + 1]] if i < m - 1 else []) + [e[i], s]]
                C = torch.stack(ctx)
                q = ra.q_proj(h[i]).view(H, dh)
                k = ra.k_proj(C).view(-1, H, dh)
                v = ra.v_proj(C).view(-1, H, dh)
                a = torch.einsum("hd,chd->hc", q, k).div(dh ** 0.5).softmax(-1)
                new_h[i] = ra.out_proj(torch.einsum("hc,chd->hd", a, v).reshape(-1))
            h = cyc.ring_norm(torch.relu(new_h))
            sa = cyc.relay_attn
            C = torch.cat([s[None], h])
            q = sa.q_proj(s).view(H, dh)
            k, v = sa.k_proj(C).view(-1, H, dh), sa.v_proj(C).view(-1, H, dh)
            a = torch.einsum("hd,chd->hc", q, k).div(dh ** 0.5).softmax(-1)
            s = cyc.relay_norm(torch.relu(sa.out_proj(torch.einsum("hc,chd->hd", a, v).reshape(-1))))
        nodes_out[b, real] = h
        relays[b] = s
    return nodes_out, relays


@pytest.mark.parametrize("core", ["fused", "reference"])
@pytest.mark.parametrize("wrap", [True, False])
@pytest.mark.parametrize("left_pad", [False, True])
def test_matches_naive_reference(wrap, left_pad, core):
    """The shifted/sliced ring attention (either core) equals an explicit per-token loop (paper semantics)."""
    torch.manual_seed(1)
    star = StarTransformer(StarTransformerOptions(encoder_embed_dim=12, encoder_layers=2, encoder_attention_heads=3,
                                                  max_positions=16, dropout=0.0, star_no_ring_wrap=not wrap,
                                                  star_ring_core=core)).eval()
    lengths = [6, 4, 1, 2]
    n = max(lengths)
    x = torch.randn(len(lengths), n, 12)
    idx = torch.arange(n)[None]
    L = torch.tensor(lengths)[:, None]
    pad = idx < (n - L) if left_pad else idx >= L
    with torch.no_grad():
        nodes, relay = star(x, pad)
        ref_nodes, ref_relay = _naive_cycle_reference(star, x, pad)
    assert (nodes - ref_nodes).abs().max() < 1e-5
    assert (relay - ref_relay).abs().max() < 1e-5


def test_ring_wrap_links_first_and_last_token():
    """Closed ring: with one cycle, the first token sees the last one directly; open ring: only via the relay."""
    torch.manual_seed(0)
    for wrap in (True, False):
        star = StarTransformer(StarTransformerOptions(encoder_embed_dim=8, encoder_layers=1, encoder_attention_heads=2,
                                                      max_positions=16, dropout=0.0, star_no_ring_wrap=not wrap)).eval()
        x = torch.randn(1, 6, 8, requires_grad=True)
        nodes, _ = star(x)
        (nodes[0, 0] * torch.randn(8)).sum().backward()  # LN outputs sum to a constant
        # the last token reaches h_0 through the ring (wrap) and through s^0 = mean (both)
        g_last, g_mid = x.grad[0, 5].abs().sum(), x.grad[0, 3].abs().sum()
        assert (g_last > g_mid * 1.5) == wrap, (wrap, g_last, g_mid)


@pytest.mark.parametrize("extra", [
    [],
    ["--arch", "star_transformer_fastnlp"],
    ["--star-norm-position", "pre", "--star-residual", "--encoder-ffn-embed-dim", "32", "--init-std", "0.02"],
    ["--star-no-ring-wrap", "--star-activation", "leaky_relu", "--encoder-head-dim", "5"],
    ["--star-ring-core", "reference"],
    ["--encoder-type", "transformer"],  # the A/B baseline behind the same heads
    ["--encoder-type", "lstm", "--encoder-layers", "2"],  # the recurrent baselines, reading real tokens only
    ["--encoder-type", "bilstm", "--encoder-layers", "2"],
])
def test_padding_invariance_classification(extra):
    """A sentence's logits and satellites alone equal those inside a right- or left-padded batch."""
    arch = "star_transformer"
    if "--arch" in extra:
        arch = extra[1]
        extra = extra[2:]
    model, d = build(arch, TINY + extra)
    model.register_classification_head("sentence_classification_head", num_classes=3)
    model.eval()
    fastnlp_like = arch == "star_transformer_fastnlp"
    sents = random_sentences(d, [7, 3, 5, 1])
    from fairseq.data import data_utils
    for left in (False, True):
        toks = data_utils.collate_tokens(sents, d.pad(), left_pad=left)
        with torch.no_grad():
            logits, _ = model(toks, classification_head_name="sentence_classification_head")
            feats, _ = model(toks)
            for i, s in enumerate(sents):
                alone, _ = model(s[None], classification_head_name="sentence_classification_head")
                alone_feats, _ = model(s[None])
                n = len(s)
                row = feats[i, -n:] if left else feats[i, :n]
                diff = max((alone - logits[i]).abs().max().item(), (alone_feats[0] - row).abs().max().item())
                if fastnlp_like:
                    # fastNLP's semantics (unmasked pads) are NOT padding invariant: documented deviation
                    if n < len(sents[0]) and not left:
                        assert diff > 1e-6
                else:
                    assert diff < 1e-5, (extra, left, i, diff)


def test_position_table_overflow_is_a_clear_error():
    model, d = build("star_transformer", ["--encoder-embed-dim", "16", "--encoder-attention-heads", "2",
                                          "--max-positions", "8"])
    toks = random_sentences(d, [12])[0][None]
    with pytest.raises(ValueError, match=r"13 tokens is longer than the position table \(--max-positions 8\)"):
        model(toks)


def test_bad_flag_values():
    with pytest.raises(ValueError, match="--star-activation"):
        StarTransformer(StarTransformerOptions(encoder_embed_dim=8, encoder_attention_heads=2, star_activation="gelu"))
    with pytest.raises(ValueError, match="--star-norm-position"):
        StarTransformer(StarTransformerOptions(encoder_embed_dim=8, encoder_attention_heads=2,
                                               star_norm_position="middle"))


def test_pretrained_vectors(tmp_path):
    d = toy_dictionary(5)
    glove = tmp_path / "vec.txt"
    glove.write_text("w0 " + " ".join(["0.5"] * 16) + "\nnotinvocab " + " ".join(["1"] * 16) + "\n"
                     "w3 " + " ".join(["-1"] * 16) + "\n")
    model, _ = build("star_transformer", TINY + ["--pretrained-embeddings", glove, "--freeze-embeddings"],
                     dictionary=d)
    emb = model.encoder.embed_tokens
    assert torch.allclose(emb.weight[d.index("w0")], torch.full((16,), 0.5))
    assert torch.allclose(emb.weight[d.index("w3")], torch.full((16,), -1.0))
    assert not emb.weight.requires_grad
    # word2vec text format with a header line
    w2v = tmp_path / "w2v.txt"
    w2v.write_text("1 16\nw1 " + " ".join(["2"] * 16) + "\n")
    model, _ = build("star_transformer", TINY + ["--pretrained-embeddings", w2v],
                     dictionary=d)
    assert torch.allclose(model.encoder.embed_tokens.weight[d.index("w1")], torch.full((16,), 2.0))
    assert model.encoder.embed_tokens.weight.requires_grad
    bad = tmp_path / "bad.txt"
    bad.write_text("w0 " + " ".join(["0.5"] * 16) + "\nw1 1 2 3\n")
    with pytest.raises(ValueError, match=r"bad\.txt:2: vector for 'w1' has dimension 3, but the embedding table "
                                         r"has dimension 16"):
        build("star_transformer", TINY + ["--pretrained-embeddings", bad], dictionary=d)


def ddp_setup():
    torch.manual_seed(0)
    model, d = build("star_transformer", TINY + ["--encoder-ffn-embed-dim", "16", "--star-residual"])
    model.register_classification_head("head", num_classes=3)
    model.train()
    from fairseq.data import data_utils
    batches = []
    for seed in (1, 2):
        sents = random_sentences(d, [5, 3, 6], seed=seed)
        batches.append((data_utils.collate_tokens(sents, d.pad()), torch.tensor([0, 2, 1])))

    def loss_fn(m, batch):
        toks, y = batch
        logits, _ = m(toks, classification_head_name="head")
        return torch.nn.functional.cross_entropy(logits, y)

    return model, batches, loss_fn


def test_ddp_ready():
    assert_ddp_matches_single_process("tests.test_star_transformer:ddp_setup")


def test_span_f1_hand_checked():
    """Entity-level F1 on a hand-checked example, and agreement with seqeval's own f1_score."""
    from seqeval.metrics import f1_score

    from user_dir.tasks.sequence_tagging import span_counts

    gold = [["B-PER", "I-PER", "O", "B-LOC", "O"], ["B-ORG", "O", "B-PER"]]
    pred = [["B-PER", "I-PER", "O", "B-ORG", "O"], ["B-ORG", "O", "I-PER"]]
    # gold spans: PER(0-1), LOC(3), ORG(0), PER(2)  -> 4;  predicted: PER(0-1), ORG(3), ORG(0), PER(2) -> 4
    # correct: PER(0-1), ORG(0), PER(2) (I-PER after O starts a span, conlleval convention) -> 3
    counts = [span_counts(p, g) for p, g in zip(pred, gold)]
    tp, npred, ngold = (sum(c[i] for c in counts) for i in range(3))
    assert (tp, npred, ngold) == (3, 4, 4)
    f1 = 2 * (tp / npred) * (tp / ngold) / (tp / npred + tp / ngold)
    assert f1 == pytest.approx(0.75)
    assert f1 == pytest.approx(f1_score(gold, pred))


def test_crf_matches_brute_force():
    """CRF log-partition and Viterbi equal explicit enumeration over all tag paths."""
    import itertools

    from user_dir.modules.crf import LinearChainCRF

    torch.manual_seed(0)
    K, n = 3, 4
    crf = LinearChainCRF(K)
    for p in crf.parameters():
        torch.nn.init.normal_(p)
    em = torch.randn(2, n, K)
    mask = torch.tensor([[True] * 4, [True, True, True, False]])
    tags = torch.tensor([[0, 2, 1, 1], [2, 2, 0, 0]])

    def score(e, path):
        s = crf.start[path[0]] + e[0, path[0]] + crf.end[path[-1]]
        for i in range(1, len(path)):
            s = s + crf.transitions[path[i - 1], path[i]] + e[i, path[i]]
        return s

    nll, best = 0.0, []
    for b in range(2):
        m = int(mask[b].sum())
        paths = list(itertools.product(range(K), repeat=m))
        scores = torch.stack([score(em[b, :m], p) for p in paths])
        nll = nll + torch.logsumexp(scores, 0) - score(em[b, :m], tags[b, :m].tolist())
        best.append(list(paths[int(scores.argmax())]) + [0] * (n - m))
    assert torch.allclose(crf.nll(em, tags, mask), nll, atol=1e-5)
    assert crf.decode(em, mask).tolist() == best


def test_checkpoint_activations_same_gradients():
    """--checkpoint-activations recomputes cycles in backward: identical loss and gradients."""
    grads = []
    for flag in ([], ["--checkpoint-activations"]):
        model, d = build("star_transformer", TINY + ["--dropout", "0.2"] + flag, seed=3)
        model.train()
        torch.manual_seed(5)
        toks = torch.stack(random_sentences(d, [6, 6], seed=2))
        feats, _ = model(toks)
        feats.pow(2).sum().backward()
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    assert len(grads[0]) == len(grads[1]) > 0
    for a, b in zip(*grads):
        assert torch.allclose(a, b, atol=1e-5)


def _ring_attention(core, d, heads, head_dim, p_drop=0.0, block_rows=BLOCK_ROWS):
    """The ring attention a cycle builds for ``--star-ring-core core``."""
    if core == "fused":
        return FusedRingAttention(d, heads, head_dim, p_drop, block_rows=block_rows)
    return RingAttention(d, heads, head_dim, p_drop)


def _run_ring_core(core, B, n, pad, wrap, mask_pads, p_drop=0.0, block_rows=BLOCK_ROWS, dtype=torch.double):
    """Outputs and input/parameter gradients of one core's ring attention on fixed seeds."""
    torch.manual_seed(0)
    d, heads, dh = 12, 3, 5
    ra = _ring_attention(core, d, heads, dh, p_drop, block_rows).double().train()
    for p in ra.parameters():
        torch.nn.init.normal_(p, 0.0, 0.3)
    ra = ra.to(dtype)
    ring = RingNeighbours(pad, B, n, "cpu", wrap, mask_pads)
    inputs = [torch.randn(B, n, d, dtype=torch.double), torch.randn(B, n, d, dtype=torch.double),
              torch.randn(B, 1, d, dtype=torch.double)]
    g = torch.randn(B, n, d, dtype=torch.double).to(dtype)
    xs = [x.to(dtype).requires_grad_() for x in inputs]
    torch.manual_seed(1)  # same attention-dropout mask
    y = ra(*xs, ring)
    (y * g).sum().backward()
    return [y.detach()] + [x.grad for x in xs] + [p.grad.clone() for p in ra.parameters()]


def _cores_agree(*args, atol=1e-10, **kw):
    fused, reference = (_run_ring_core(core, *args, **kw) for core in ("fused", "reference"))
    assert len(fused) == len(reference) == 3 + 1 + 8
    for a, b in zip(fused, reference):
        assert torch.allclose(a.double(), b.double(), rtol=0, atol=atol * max(1.0, b.abs().max().item())), \
            (a - b).abs().max()


def _short_pad_mask():
    pad = torch.zeros(3, 7, dtype=torch.bool)
    pad[1, 5:] = True  # right padding
    pad[2, :2] = True  # left and right padding
    pad[2, 6:] = True
    return pad


@pytest.mark.parametrize("wrap,mask_pads,p_drop", [(True, True, 0.0), (True, False, 0.3), (False, True, 0.3),
                                                   (False, False, 0.0)])
def test_fused_ring_core_matches_reference(wrap, mask_pads, p_drop):
    """The hand-written backward of the fused core gives the reference's outputs and gradients (padded batch)."""
    _cores_agree(3, 7, _short_pad_mask(), wrap, mask_pads, p_drop)


def _long_pad_mask():
    """B 4, n 23: no padding, right padding (the last token in the last block), left padding
    with the first token mid-block and the last one in another block, and a 1-token sentence."""
    pad = torch.zeros(4, 23, dtype=torch.bool)
    pad[1, 20:] = True
    pad[2, :6] = True
    pad[2, 17:] = True
    pad[3, :9] = True
    pad[3, 10:] = True
    return pad


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("wrap,mask_pads", [(True, True), (True, False), (False, True), (False, False)])
def test_fused_ring_core_in_blocks_matches_reference(wrap, mask_pads, padded, monkeypatch):
    """A long input (n > block_rows) runs through the fused core block by block (with halo rows and,
    for the closed ring, copies of each sentence's wrapped neighbours wherever the padding puts
    them): same outputs and gradients as the reference, padded batches included."""
    blocks, project = [], star_ring_core.project
    monkeypatch.setattr(star_ring_core, "project", lambda h, *a: blocks.append(h.shape[1]) or project(h, *a))
    pad = _long_pad_mask() if padded else None
    _cores_agree(4 if padded else 2, 23, pad, wrap, mask_pads, block_rows=4)  # 6 blocks, the last one short
    assert len(blocks) == 12 and max(blocks) <= 4 + 2 * 2 + 3  # forward and backward went block by block


@pytest.mark.parametrize("block_rows", [4, BLOCK_ROWS])
def test_fused_ring_core_matches_reference_in_bfloat16(block_rows):
    """bfloat16, padded, in blocks and in one: each output and gradient of the fused core is within 3x
    the reference core's bfloat16 error (both against the float64 reference)."""
    args = 4, 23, _long_pad_mask(), True, True
    exact = _run_ring_core("reference", *args)
    fused, reference = (_run_ring_core(core, *args, block_rows=block_rows, dtype=torch.bfloat16)
                        for core in ("fused", "reference"))
    for f, r, x in zip(fused, reference, exact):
        assert (f.double() - x).abs().max() <= 3 * (r.double() - x).abs().max() + 1e-3


def _run_stack(core, dtype=torch.double, ring_block_rows=4):
    """Outputs and gradients of a padded Star stack (n 23, FFN, residual) built with ``star_ring_core=core``."""
    torch.manual_seed(0)
    star = StarTransformer(StarTransformerOptions(encoder_embed_dim=12, encoder_layers=2, encoder_attention_heads=3,
                                                  encoder_ffn_embed_dim=16, star_residual=True, max_positions=32,
                                                  dropout=0.0, star_ring_core=core), ring_block_rows=ring_block_rows)
    kind = {"fused": FusedRingAttention, "reference": RingAttention}[core]
    assert all(type(cycle.ring_attn) is kind for cycle in star.cycles)
    star = star.double().to(dtype).train()
    x = torch.randn(4, 23, 12, dtype=torch.double).to(dtype).requires_grad_()
    g = torch.randn(4, 23, 12, dtype=torch.double).to(dtype)
    nodes, relay = star(x, _long_pad_mask())
    ((nodes * g).sum() + relay.sum()).backward()
    return [nodes.detach(), relay.detach(), x.grad] + [p.grad for p in star.parameters()]


@pytest.mark.parametrize("core", ["fused", "reference"])
def test_star_transformer_ring_core_option(core):
    """``star_ring_core`` builds the cycles' ring attention; the whole padded stack in blocks of 4 gives
    the reference stack's outputs and gradients with either core."""
    for a, b in zip(_run_stack(core), _run_stack("reference", ring_block_rows=BLOCK_ROWS)):
        assert torch.allclose(a, b, rtol=0, atol=1e-10 * max(1.0, b.abs().max().item()))


def test_star_transformer_ring_cores_in_bfloat16():
    """A bfloat16 stack with the fused core (in blocks) is within 3x the reference core's bfloat16 error
    (+ 0.01 for the gradients that are 0 in exact arithmetic, e.g. of biases a softmax or LayerNorm cancels)."""
    exact = _run_stack("reference")
    fused, reference = (_run_stack(core, torch.bfloat16) for core in ("fused", "reference"))
    for f, r, x in zip(fused, reference, exact):
        assert (f.double() - x).abs().max() <= 3 * (r.double() - x).abs().max() + 1e-2


def test_fused_ring_core_keeps_little_for_backward():
    """The fused core saves only its inputs and the 5-way probabilities, not the six n x d projections."""
    B, n, d, heads = 1, 64, 32, 4
    h, e, s = torch.randn(B, n, d, requires_grad=True), torch.randn(B, n, d), torch.randn(B, 1, d)
    ring = RingNeighbours(None, B, n, "cpu", True, True)
    saved = {}
    for core in ("fused", "reference"):
        ra = _ring_attention(core, d, heads, d // heads).train()
        known = {t.untyped_storage().data_ptr() for t in [h, e, s, *ra.parameters()]}
        kept = {}

        def pack(t):
            if t.untyped_storage().data_ptr() not in known:
                kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            ra(h, e, s, ring)
        saved[core] = sum(kept.values()) / (n * d * 4)  # in units of one n x d float tensor
    assert saved["fused"] <= 5 / (d // heads) + 0.01  # the probabilities only
    assert saved["reference"] >= 5  # q, k, v, k(e), v(e), attention output ...


def test_block_dropout_flag():
    """--star-block-dropout: < 0 follows --dropout, 0 leaves only the embedding dropout (fastNLP)."""
    x = torch.randn(2, 6, 16)

    def train_vs_eval(**kw):
        torch.manual_seed(0)
        star = StarTransformer(StarTransformerOptions(encoder_embed_dim=16, encoder_layers=2, encoder_attention_heads=2,
                                                      max_positions=8, **kw))
        with torch.no_grad():
            ref = star.eval()(x)[0]
            return (star.train()(x)[0] - ref).abs().max().item()

    assert train_vs_eval(dropout=0.0) == 0.0  # -1: follows --dropout = 0
    assert train_vs_eval(dropout=0.0, star_block_dropout=0.5) > 0.1
    assert train_vs_eval(dropout=0.5, star_block_dropout=0.0) > 0.1  # the embeddings are still dropped
    model, _ = build("star_transformer", TINY + ["--dropout", "0.3", "--star-block-dropout", "0"])
    assert all(c.block_dropout == 0.0 for c in model.encoder.star.cycles)
    assert model.encoder.star.options.dropout == 0.3


def test_checkpoint_config_without_block_dropout_loads():
    """Checkpoints saved before --star-block-dropout existed (their model config lacks it) still build."""
    from omegaconf import open_dict

    from tests.helpers.models import parse_cfg
    from user_dir.models.star_transformer import StarTransformerEncoder

    cfg = parse_cfg("star_transformer", extra=TINY + ["--user-dir", "user_dir"]).model
    with open_dict(cfg):
        del cfg["star_block_dropout"]
    encoder = StarTransformerEncoder(cfg, toy_dictionary())
    assert all(c.block_dropout == 0.0 for c in encoder.star.cycles)  # follows --dropout 0


@pytest.mark.parametrize("features", ["paper", "mult"])
def test_nli_pair_features(features):
    """The NLI head reads [r1; r2; |r1-r2|; r1-r2] (paper Sec. 5.3, default) or [r1; r2; |r1-r2|; r1*r2] (mult)."""
    args = TINY if features == "paper" else TINY + ["--nli-features", "mult"]
    model, d = build("star_transformer", args)
    assert model.cfg.nli_features == features
    model.register_classification_head("nli", num_classes=3, input_multiplier=4)
    model.eval()
    premise, hypothesis = random_sentences(d, [6, 4])
    with torch.no_grad():
        logits, _ = model(premise[None], classification_head_name="nli", pair_tokens=hypothesis[None])
        r1 = model.sentence_vector(premise[None])[0]
        r2 = model.sentence_vector(hypothesis[None])[0]
        last = {"paper": r1 - r2, "mult": r1 * r2}
        expected = {k: model.classification_heads["nli"](torch.cat([r1, r2, (r1 - r2).abs(), v], -1))
                    for k, v in last.items()}
    torch.testing.assert_close(logits, expected[features], rtol=0, atol=1e-6)
    other = "mult" if features == "paper" else "paper"
    assert (logits - expected[other]).abs().max() > 1e-4


def test_nli_checkpoint_without_features_flag_keeps_mult():
    """A checkpoint saved before --nli-features (its config lacks the key) was trained on r1*r2:
    loading it switches the NLI head to ``mult``; a config that has the key is obeyed."""
    from omegaconf import open_dict

    from tests.helpers.models import parse_cfg

    model, _ = build("star_transformer", TINY)
    model.register_classification_head("nli", num_classes=3, input_multiplier=4)
    saved = parse_cfg("star_transformer", extra=TINY + ["--user-dir", "user_dir"]).model
    model.load_state_dict(model.state_dict(), model_cfg=saved)
    assert model.cfg.nli_features == "paper"
    with open_dict(saved):
        del saved["nli_features"]
    model.load_state_dict(model.state_dict(), model_cfg=saved)
    assert model.cfg.nli_features == "mult"


@pytest.mark.parametrize("encoder_type", ["star", "transformer", "lstm", "bilstm"])
def test_continuous_inputs_alone_equal_padded_batch(encoder_type):
    """Masked summation's continuous inputs (``--input-features``) through either encoder: a sequence's regression
    output alone equals its output in a right-padded batch (the padding is masked, not averaged in)."""
    model, _ = build("star_transformer", ["--encoder-type", encoder_type, "--input-features", 4, "--encoder-embed-dim",
                                          16, "--encoder-attention-heads", 2, "--encoder-layers", 2, "--dropout", 0])
    model.register_classification_head("sum", num_classes=3)
    model.eval()
    g = torch.Generator().manual_seed(5)
    seqs = [torch.rand(n, 4, generator=g) for n in (7, 3, 5)]
    batch = torch.zeros(3, 7, 4)
    for i, s in enumerate(seqs):
        batch[i, :len(s)] = s
        batch[i, len(s):] = 9.0  # junk in the padding: must not matter
    with torch.no_grad():
        together, _ = model(src_features=batch, src_lengths=torch.tensor([7, 3, 5]), classification_head_name="sum")
        for i, s in enumerate(seqs):
            alone, _ = model(src_features=s[None], src_lengths=torch.tensor([len(s)]), classification_head_name="sum")
            assert torch.allclose(alone[0], together[i], atol=1e-5), (encoder_type, i)


@pytest.mark.parametrize("encoder_type", ["lstm", "bilstm"])
def test_recurrent_baselines_read_left_to_right_and_back(encoder_type):
    """--encoder-type lstm reads left to right: a change to the last input leaves every earlier output as it was;
    bilstm also reads right to left: the first output changes too, in its second half (the backward direction)."""
    model, _ = build("star_transformer", ["--encoder-type", encoder_type, "--input-features", 4, "--encoder-embed-dim",
                                          8, "--encoder-layers", 1, "--dropout", 0])
    model.eval()
    x = torch.rand(1, 6, 4, generator=torch.Generator().manual_seed(3))
    changed = x.clone()
    changed[0, -1] += 1.0
    with torch.no_grad():
        before, _ = model(src_features=x, src_lengths=torch.tensor([6]))
        after, _ = model(src_features=changed, src_lengths=torch.tensor([6]))
    forward_half = slice(0, 8 if encoder_type == "lstm" else 4)
    assert torch.equal(before[0, :5, forward_half], after[0, :5, forward_half])
    assert (encoder_type == "bilstm") == (not torch.allclose(before[0, 0, 4:], after[0, 0, 4:]))


def test_bilstm_needs_an_even_width():
    with pytest.raises(ValueError, match="--encoder-type bilstm splits --encoder-embed-dim between two directions: 15"):
        build("star_transformer", ["--encoder-type", "bilstm", "--input-features", 4, "--encoder-embed-dim", 15])
