"""``projected_adaptive_loss``: cross-entropy through the adaptive softmax's target-only path.

fairseq's ``cross_entropy`` asks the model for ``get_normalized_probs``: with
Transformer-XL's projected adaptive softmax (Dai et al., 2019, Sec. 4; Grave et al.,
2017) that builds the whole (N, V) log-probability matrix, which at WT103 size
(V = 267,735) dominates time and memory.  This criterion asks the model for the
negative log-likelihood of the targets only (``get_target_nll``): the head band for
every position, each tail cluster for the positions whose target is in it, as the
reference's training loss.  Same value and gradients as ``cross_entropy`` (tested);
logging is ``cross_entropy``'s (loss in base 2, ppl).  fairseq's ``adaptive_loss`` does
not fit: it expects fairseq's own ``AdaptiveSoftmax`` (another parameterisation).
"""
from fairseq.criterions import register_criterion
from fairseq.criterions.cross_entropy import CrossEntropyCriterion, CrossEntropyCriterionConfig


@register_criterion("projected_adaptive_loss", dataclass=CrossEntropyCriterionConfig)
class ProjectedAdaptiveLossCriterion(CrossEntropyCriterion):
    def compute_loss(self, model, net_output, sample, reduce=True):
        if not hasattr(model, "get_target_nll"):
            raise ValueError(f"--criterion projected_adaptive_loss needs a model with get_target_nll "
                             f"(transformer_xl_lm), got {type(model).__name__}; use --criterion cross_entropy")
        target = model.get_targets(sample, net_output)
        nll = model.get_target_nll(net_output, target).masked_fill(target.eq(self.padding_idx), 0.0)
        loss = nll.sum() if reduce else nll.view(-1)
        return loss, loss
