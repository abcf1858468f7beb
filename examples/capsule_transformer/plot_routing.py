#!/usr/bin/env python
"""Plot what capsule routing does to one attention module for a sentence pair (PNG).

For the chosen routed module (``--module``, e.g. ``encoder.layers.0.self_attn``)
and head (``--head``) the figure shows, for a source/target pair:

1. the attention distribution before routing, ``softmax(E + mask)``;
2. the attention after routing, ``softmax(E + Ω↕ + Ω↔ + mask)``;
3. their difference;
4. the vertical couplings ``R_{m→n}`` between heads (averaged over queries);
5. the horizontal couplings between tokens (input token → output token).

    python examples/capsule_transformer/plot_routing.py --checkpoint ckpt/checkpoint_best.pt \\
        --data data-bin/multi30k --bpe-codes data-bin/multi30k/bpe.codes \\
        --source "a man rides a bike ." --target "ein mann fährt fahrrad ." --out routing.png

Source and target are given as raw (tokenized) text; BPE is applied with the
codes given.  Without ``--module`` the first routed module is used.
"""
import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--data", required=True, help="binarized data directory (dictionaries)")
    p.add_argument("--bpe-codes", help="subword-nmt codes; omit for already segmented text")
    p.add_argument("--source", required=True)
    p.add_argument("--target", required=True)
    p.add_argument("--module", help="routed attention module name (default: the first routed module)")
    p.add_argument("--head", type=int, default=0)
    p.add_argument("--out", default="capsule_routing.png")
    p.add_argument("--json", help="also write the panels' matrices and labels to this JSON file "
                   "(benchmarks/figures/make_figures.py draws docs/figures/capsule_routing.png from it)")
    p.add_argument("--caption", help="figure title (default: module, head, routing and r)")
    a = p.parse_args(argv)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch

    from user_dir.models.capsule_transformer import CapsuleTransformerModel
    from user_dir.modules.capsule_routing import CapsuleMultiheadAttention, capturing

    if not os.path.isfile(a.checkpoint):
        sys.exit(f"plot_routing: checkpoint not found: {a.checkpoint}")
    kwargs = dict(bpe="subword_nmt", bpe_codes=a.bpe_codes) if a.bpe_codes else {}
    hub = CapsuleTransformerModel.from_pretrained(
        os.path.dirname(os.path.abspath(a.checkpoint)), checkpoint_file=os.path.basename(a.checkpoint),
        data_name_or_path=os.path.abspath(a.data), user_dir=os.path.join(ROOT, "user_dir"), **kwargs)
    model = hub.models[0]
    model.eval()  # (fairseq models return None from eval())
    routed = {n: m for n, m in model.named_modules() if isinstance(m, CapsuleMultiheadAttention)}
    if not routed:
        sys.exit("plot_routing: the checkpoint has no capsule-routed attention module")
    name = a.module or next(iter(routed))
    if name not in routed:
        sys.exit(f"plot_routing: --module {name!r} is not routed; routed modules: {', '.join(routed)}")
    module = routed[name]
    if not 0 <= a.head < module.num_heads:
        sys.exit(f"plot_routing: --head {a.head} out of range (the module has {module.num_heads} heads)")

    src = hub.encode(a.source)
    tgt = hub.tgt_dict.encode_line(hub.apply_bpe(a.target), add_if_not_exist=False).long()
    prev = torch.cat([tgt.new_tensor([hub.tgt_dict.eos()]), tgt[:-1]])
    with capturing([module]), torch.no_grad():
        model(src.unsqueeze(0), torch.tensor([src.numel()]), prev.unsqueeze(0))
        cap = module.last_capture

    def tokens(dictionary, ids):
        return [dictionary[i] for i in ids.tolist()]

    src_toks, tgt_toks = tokens(hub.src_dict, src), tokens(hub.tgt_dict, prev)
    if name.startswith("encoder"):
        q_toks, k_toks = src_toks, src_toks
    elif "encoder_attn" in name:
        q_toks, k_toks = tgt_toks, src_toks
    else:
        q_toks, k_toks = tgt_toks, tgt_toks
    h = a.head
    before = torch.softmax(cap["logits_before"].masked_fill(~cap["visible"].unsqueeze(1), float("-inf")), -1)[0, h]
    after = torch.softmax(cap["logits_after"], -1)[0, h]
    panels = [("attention before routing", before, k_toks, q_toks, "viridis"),
              ("attention after routing", after, k_toks, q_toks, "viridis"),
              ("after − before", after - before, k_toks, q_toks, "coolwarm")]
    if "vertical_couplings" in cap:
        vc = cap["vertical_couplings"][0].mean(0)  # (H, H), averaged over query prefixes
        heads = [f"h{i}" for i in range(vc.size(0))]
        panels.append(("vertical couplings R (head m → head n)", vc.T, heads, heads, "magma"))
    if "horizontal_couplings" in cap:
        hc = cap["horizontal_couplings"][0]  # (M inputs, N outputs)
        panels.append(("horizontal couplings (input token → output token)", hc.T, q_toks, q_toks, "magma"))
    suptitle = a.caption or f"{name}, head {h}, routing={module.capsule.routing}, r={module.capsule.iters}"
    if a.json:
        import json

        with open(a.json, "w", encoding="utf-8") as f:
            json.dump({"caption": suptitle, "panels": [
                {"title": t, "matrix": [[round(v, 5) for v in row] for row in m.tolist()], "x": xt, "y": yt, "cmap": c}
                for t, m, xt, yt, c in panels]}, f, ensure_ascii=False, indent=0)
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 5))
    for ax, (title, mat, xt, yt, cmap) in zip(axes, panels):
        im = ax.imshow(mat.numpy(), cmap=cmap, aspect="auto")
        ax.set_title(title, fontsize=9)
        ax.set_xticks(range(len(xt)), xt, rotation=90, fontsize=7)
        ax.set_yticks(range(len(yt)), yt, fontsize=7)
        fig.colorbar(im, ax=ax, fraction=0.046)
    fig.suptitle(suptitle)
    fig.tight_layout()
    fig.savefig(a.out, dpi=120)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
