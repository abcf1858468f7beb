"""Hub interface of the Star-Transformer classifier (as fairseq's ``RobertaHubInterface``).

Load a checkpoint directory written by ``fairseq-train --arch star_transformer*`` with
``--task sentence_prediction`` (or ``sentence_pair_classification``) and classify raw,
whitespace-tokenised text::

    from user_dir.models.star_transformer import StarTransformerModel
    star = StarTransformerModel.from_pretrained("checkpoints/sst5", checkpoint_file="checkpoint_best.pt",
                                                data_name_or_path="data-bin/sst5")
    star.eval()
    tokens = star.encode("a gripping , funny film")
    star.predict("sentence_classification_head", tokens).argmax(-1)   # class index
    star.predict_label("sentence_classification_head", "a gripping , funny film")   # "4"
    star.extract_features(tokens)                                      # H^T, 1 x T x d
    star.sentence_vector(tokens)                                       # s^T + max(H^T), 1 x d

A model trained with ``sentence_pair_classification`` (NLI) classifies a premise with its
hypothesis: ``star.predict(head, premises, pair=hypotheses)``,
``star.predict_label(head, "a man sleeps", pair="a person rests")``.  A ``sequence_tagging``
model tags whitespace-tokenised sentences: ``star.tag("john smith visits paris")`` →
``["B-PER", "I-PER", "O", "B-LOC"]`` (a list of sentences gives a list of tag lists).

Text is encoded as ``preprocess/sst_prepare.py`` binarised it (whitespace tokens, ``</s>``
appended, ``<s>`` prepended only when the task was trained with ``--init-token``).  Several
sentences go in as a list of token tensors; they are right-padded into one batch (the
model's outputs do not depend on the padding).
"""
from typing import List, Union

import torch
import torch.nn.functional as F
from fairseq.data import data_utils
from torch import nn

Tokens = Union[torch.Tensor, List[torch.Tensor]]


class StarTransformerHubInterface(nn.Module):
    """``encode`` / ``decode`` / ``extract_features`` / ``sentence_vector`` / ``predict``."""

    def __init__(self, cfg, task, model):
        super().__init__()
        self.cfg, self.task, self.model = cfg, task, model
        self.register_buffer("_float_tensor", torch.tensor([0], dtype=torch.float))

    @property
    def device(self):
        return self._float_tensor.device

    @property
    def dictionary(self):
        return self.task.source_dictionary

    def encode(self, sentence: str) -> torch.LongTensor:
        if not sentence.strip():
            raise ValueError("encode: empty sentence")
        tokens = self.dictionary.encode_line(sentence, append_eos=True, add_if_not_exist=False).long()
        init = getattr(self.task.cfg, "init_token", None)
        if init is not None:
            tokens = torch.cat([tokens.new([init]), tokens])
        return tokens

    def decode(self, tokens: torch.LongTensor) -> str:
        return self.dictionary.string(tokens[tokens.ne(self.dictionary.pad())])

    def _batch(self, tokens: Tokens) -> torch.LongTensor:
        if isinstance(tokens, (list, tuple)):
            tokens = data_utils.collate_tokens(list(tokens), self.dictionary.pad())
        if tokens.dim() == 1:
            tokens = tokens.unsqueeze(0)
        limit = self.model.max_positions()
        if tokens.size(-1) > limit:
            raise ValueError(f"tokens have length {tokens.size(-1)}, more than the model's max positions {limit}")
        return tokens.long().to(device=self.device)

    def extract_features(self, tokens: Tokens) -> torch.Tensor:
        """Satellite states H^T, B x T x d (padding positions are zero)."""
        features, _ = self.model(self._batch(tokens), features_only=True)
        return features

    def sentence_vector(self, tokens: Tokens) -> torch.Tensor:
        """The representation the classifier reads: s^T + max_i h_i^T (paper Sec. 3.3), B x d."""
        r, _ = self.model.sentence_vector(self._batch(tokens))
        return r

    def predict(self, head: str, tokens: Tokens, return_logits: bool = False, pair: Tokens = None) -> torch.Tensor:
        """Log-probabilities (or logits) of classification head ``head``, B x classes.

        ``pair``: for a sentence-pair (NLI) head, the hypotheses, one per premise in ``tokens``."""
        if head not in self.model.classification_heads:
            raise KeyError(f"no classification head {head!r}; the model has {sorted(self.model.classification_heads)}")
        pair_head = self.model.classification_heads[head].dense.in_features == 4 * self.model.cfg.encoder_embed_dim
        if pair_head and pair is None:
            raise ValueError(f"classification head {head!r} classifies sentence pairs (sentence_pair_classification): "
                             f"give the hypotheses with pair=")
        if pair is not None and not pair_head:
            raise ValueError(f"classification head {head!r} classifies single sentences: pair= is for the heads of "
                             f"sentence_pair_classification models")
        src, extra = self._batch(tokens), {}
        if pair is not None:
            extra["pair_tokens"] = self._batch(pair)
            if extra["pair_tokens"].size(0) != src.size(0):
                raise ValueError(f"{src.size(0)} premises but {extra['pair_tokens'].size(0)} hypotheses (pair=)")
        logits, _ = self.model(src, features_only=True, classification_head_name=head, **extra)
        return logits if return_logits else F.log_softmax(logits, dim=-1)

    def tag(self, sentences: Union[str, List[str]]) -> Union[List[str], List[List[str]]]:
        """Tags of each word of a whitespace-tokenised sentence (or of each sentence of a list), from a
        ``sequence_tagging`` model: its task's decoding (argmax, or Viterbi with ``--crf``), in one batch."""
        if not hasattr(self.task, "predict_tags"):
            raise ValueError(f"tag: the model was trained with --task {self.cfg.task._name}, not sequence_tagging")
        single = isinstance(sentences, str)
        words = [s.split() for s in ([sentences] if single else sentences)]
        if any(not w for w in words):
            raise ValueError("tag: empty sentence")
        data = self.task.dataset_from_words(words, source="tag")
        tags = self.task.predict_tags(self.model, data, range(len(data)))
        return tags[0] if single else tags

    def predict_label(self, head: str, sentence: str, pair: str = None) -> str:
        """The label string (as in the task's ``label/dict.txt``) predicted for one sentence (with its
        hypothesis ``pair`` for a sentence-pair head)."""
        hypothesis = None if pair is None else self.encode(pair)
        index = int(self.predict(head, self.encode(sentence), pair=hypothesis).argmax(-1))
        labels = self.task.label_dictionary
        return labels.string([index + labels.nspecial])
