"""Criterion of the ``sequence_tagging`` task: per-token cross-entropy (or CRF NLL).

Logs token accuracy always, and at validation entity-level span precision/recall/F1
(seqeval chunking, micro-averaged over the whole split: summed counts, then F1).
"""
import math
from dataclasses import dataclass

from fairseq import metrics
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import FairseqDataclass

from ..tasks.sequence_tagging import span_counts


def _prf(meters):
    """Micro precision, recall, F1 from the summed span counts of the whole split."""
    tp, npred, ngold = (meters["_" + k].sum for k in ("span_tp", "span_pred", "span_gold"))
    p = tp / npred if npred else 0.0
    r = tp / ngold if ngold else 0.0
    return p, r, (2 * p * r / (p + r) if p + r else 0.0)


@dataclass
class SequenceTaggingCriterionConfig(FairseqDataclass):
    pass


@register_criterion("sequence_tagging", dataclass=SequenceTaggingCriterionConfig)
class SequenceTaggingCriterion(FairseqCriterion):
    def forward(self, model, sample, reduce=True):
        name = self.task.cfg.tagging_head_name
        if not hasattr(model, "tagging_heads") or name not in model.tagging_heads:
            raise ValueError("--criterion sequence_tagging needs a model with a tagging head "
                             "(--arch star_transformer*) and --task sequence_tagging")
        feats, extra = model(**sample["net_input"])
        head = model.tagging_heads[name]
        mask = ~extra["padding_mask"]
        emissions = head(feats)
        target = sample["target"]
        loss = head.loss(emissions, target, mask)
        ntokens = int(mask.sum())
        log = {"loss": loss.data, "ntokens": ntokens, "nsentences": sample["nsentences"], "sample_size": ntokens}
        if not model.training:
            pred = head.predict(emissions, mask)
            log["ncorrect"] = int(((pred == target) & mask).sum())
            tags = self.task.tags
            tp = npred = ngold = 0
            for p, g, m in zip(pred.tolist(), target.tolist(), mask.tolist()):
                n = sum(m)
                c, a, b = span_counts([tags[i] for i in p[:n]], [tags[i] for i in g[:n]])
                tp, npred, ngold = tp + c, npred + a, ngold + b
            log.update(span_tp=tp, span_pred=npred, span_gold=ngold)
        return loss, ntokens, log

    @staticmethod
    def reduce_metrics(logging_outputs):
        loss = sum(log.get("loss", 0) for log in logging_outputs)
        ntokens = sum(log.get("ntokens", 0) for log in logging_outputs)
        metrics.log_scalar("loss", loss / max(ntokens, 1) / math.log(2), ntokens, round=3)
        if logging_outputs and "ncorrect" in logging_outputs[0]:
            ncorrect = sum(log.get("ncorrect", 0) for log in logging_outputs)
            metrics.log_scalar("accuracy", 100.0 * ncorrect / max(ntokens, 1), ntokens, round=2)
            for key in ("span_tp", "span_pred", "span_gold"):
                metrics.log_scalar_sum("_" + key, sum(log.get(key, 0) for log in logging_outputs))
            metrics.log_derived("span_precision", lambda m: round(100 * _prf(m)[0], 2))
            metrics.log_derived("span_recall", lambda m: round(100 * _prf(m)[1], 2))
            metrics.log_derived("span_f1", lambda m: round(100 * _prf(m)[2], 2))

    @staticmethod
    def logging_outputs_can_be_summed():
        return True
