#!/usr/bin/env python
"""How strongly does routing act in a trained capsule_transformer?

For each routed attention module, over the first ``--sentences`` pairs of a
binarized split (teacher forcing, one sentence at a time, so no padding):

* ``rms(E)``: root mean square of the visible attention logits before routing;
* ``rms(Ω)``: the same for what routing adds (``Ω↕ + Ω↔``, times the Ω gate if any);
* ``TV``: mean total-variation distance between the attention distributions
  before and after routing, ``½ Σ_k |p_after − p_before|`` per query and head
  (0: routing changes nothing, 1: disjoint attention).

    python benchmarks/capsule_transformer/omega_scale.py --data data-bin/multi30k \\
        --checkpoint work/m30k/capsule_transformer/checkpoint_last.pt [--checkpoint ...]
"""
import argparse
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def module_statistics(model, dataset, sentences):
    """``{module name: (rms E, rms Ω, mean TV)}`` over ``sentences`` items of ``dataset``."""
    import torch

    from user_dir.modules.capsule_routing import CapsuleMultiheadAttention, capturing

    routed = {n: m for n, m in model.named_modules() if isinstance(m, CapsuleMultiheadAttention)}
    if not routed:
        raise SystemExit("omega_scale: the checkpoint has no capsule-routed attention module")
    # per module: Σ E², Σ Ω², visible entries, Σ TV, (query, head) rows
    sums = {n: torch.zeros(5, dtype=torch.float64) for n in routed}
    with capturing(routed.values()), torch.no_grad():
        for i in range(min(sentences, len(dataset))):
            item = dataset[i]
            src, tgt = item["source"], item["target"]
            prev = torch.cat([tgt.new_tensor([dataset.tgt_dict.eos()]), tgt[:-1]])
            model(src.unsqueeze(0), torch.tensor([src.numel()]), prev.unsqueeze(0))
            for name, m in routed.items():
                cap = m.last_capture
                before, after = cap["logits_before"], cap["logits_after"]  # (B, H, Q, K); after is masked
                visible = cap["visible"].unsqueeze(1).expand_as(before)
                p_before = torch.softmax(before.masked_fill(~visible, float("-inf")), -1)
                tv = 0.5 * (torch.softmax(after, -1) - p_before).abs().sum(-1)  # (B, H, Q)
                sums[name] += torch.stack([
                    before[visible].double().pow(2).sum(), (after - before)[visible].double().pow(2).sum(),
                    visible.sum().double(), tv.double().sum(), torch.tensor(tv.numel(), dtype=torch.float64)])
    return {n: ((s[0] / s[2]).sqrt().item(), (s[1] / s[2]).sqrt().item(), (s[3] / s[4]).item())
            for n, s in sums.items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="binarized data directory")
    p.add_argument("--checkpoint", required=True, action="append", help="capsule_transformer checkpoint(s)")
    p.add_argument("--subset", default="valid")
    p.add_argument("--sentences", type=int, default=200)
    a = p.parse_args(argv)

    from fairseq import checkpoint_utils

    import user_dir  # noqa: F401  registers the models and allow-lists fairseq's checkpoint globals

    for path in a.checkpoint:
        if not os.path.isfile(path):
            raise SystemExit(f"omega_scale: checkpoint not found: {path}")
        models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
            [path], arg_overrides={"data": os.path.abspath(a.data), "user_dir": os.path.join(ROOT, "user_dir")})
        model = models[0]
        model.eval()
        task.load_dataset(a.subset)
        stats = module_statistics(model, task.dataset(a.subset), a.sentences)
        m = cfg.model
        print(f"\n{path}  (squash={m.capsule_squash}, routing={m.capsule_routing}, "
              f"omega_gate={getattr(m, 'capsule_omega_gate', False)}; {a.sentences} {a.subset} sentences)")
        print(f"{'module':40s} {'rms(E)':>8s} {'rms(Ω)':>8s} {'Ω/E':>6s} {'TV':>6s}")
        for name, (rms_e, rms_o, tv) in stats.items():
            print(f"{name:40s} {rms_e:8.3f} {rms_o:8.3f} {rms_o / rms_e:6.3f} {tv:6.3f}")
        mean = [sum(v[i] for v in stats.values()) / len(stats) for i in range(3)]
        print(f"{'mean over modules':40s} {mean[0]:8.3f} {mean[1]:8.3f} {mean[1] / mean[0]:6.3f} {mean[2]:6.3f}")


if __name__ == "__main__":
    main()
