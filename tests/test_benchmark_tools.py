"""The benchmark scripts' own logic where a figure in BENCHMARKS.md depends on it."""
import torch
from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

from tests.helpers.cli import load_script


def test_flop_count_includes_the_fused_cpu_attention_of_fairseqs_transformer():
    """fairseq's self-attention runs torch's fused CPU attention, which FlopCounterMode leaves at 0: the
    capsule/vanilla matrix-product ratio of flops.py would be inflated without its own formula."""
    flops = load_script("benchmarks/capsule_transformer/flops.py")
    q = torch.randn(2, 4, 50, 16, requires_grad=True)

    def attention():
        torch.nn.functional.scaled_dot_product_attention(q, q, q).sum().backward()

    shape = (2, 4, 50, 16)
    expected = sdpa_flop_count(shape, shape, shape) + sdpa_backward_flop_count(shape, shape, shape, shape)
    assert flops.counted(attention) == expected > 0
