"""Mean-squared-error criterion of the ``masked_summation`` task (the paper's metric, Sec. 5.1).

The model's regression head reads the sentence vector; the loss is the sum of squared
errors, and ``mse`` is logged per target value (averaged over samples and columns).
"""
from dataclasses import dataclass

from fairseq import metrics
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import FairseqDataclass


@dataclass
class MaskedSummationMSEConfig(FairseqDataclass):
    pass


@register_criterion("masked_summation_mse", dataclass=MaskedSummationMSEConfig)
class MaskedSummationMSECriterion(FairseqCriterion):
    def forward(self, model, sample, reduce=True):
        pred, _ = model(**sample["net_input"], classification_head_name=self.task.cfg.classification_head_name)
        target = sample["target"].to(pred.dtype)
        loss = ((pred.float() - target.float()) ** 2).sum()
        nvalues = target.numel()
        return loss, nvalues, {"loss": loss.data, "nvalues": nvalues, "sample_size": nvalues,
                               "nsentences": sample["nsentences"], "ntokens": sample["ntokens"]}

    @staticmethod
    def reduce_metrics(logging_outputs):
        loss = sum(log.get("loss", 0) for log in logging_outputs)
        n = sum(log.get("nvalues", 0) for log in logging_outputs)
        metrics.log_scalar("loss", loss / max(n, 1), n, round=5)
        metrics.log_scalar("mse", loss / max(n, 1), n, round=5)

    @staticmethod
    def logging_outputs_can_be_summed():
        return True
