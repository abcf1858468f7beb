"""Query-suggestion metrics: BLEU (sacrebleu), exact match@k and MRR of the true next query in the n-best.

For one example with the reference next query r and the ranked suggestions
h_1..h_n (best first):

* rank = the smallest i with h_i == r (after whitespace normalisation), 0 if none;
* exact match@k = 1 if 0 < rank ≤ k, else 0 (averaged over examples);
* reciprocal rank = 1 / rank, 0 if the reference is not among the n-best (MRR
  is its mean, so it is MRR@n);
* BLEU = sacrebleu's corpus BLEU of the best suggestions h_1 against r.

The same functions serve validation (:mod:`user_dir.tasks.query_suggestion`)
and the ``fairseq-generate`` scorer (``preprocess/query_suggestion_score.py``).
"""
import sacrebleu


def normalise(text):
    return " ".join(text.split())


def rank_of(reference, suggestions):
    """1-based rank of ``reference`` among ``suggestions`` (best first); 0 when it is absent."""
    ref = normalise(reference)
    for i, hyp in enumerate(suggestions, 1):
        if normalise(hyp) == ref:
            return i
    return 0


def rank_sums(references, nbest_lists, ks):
    """Summed (not averaged) counts, so that they can be added up across batches and workers."""
    out = {"n": 0, "rr": 0.0, **{f"em@{k}": 0 for k in ks}}
    for ref, hyps in zip(references, nbest_lists, strict=True):
        r = rank_of(ref, hyps)
        out["n"] += 1
        out["rr"] += 1.0 / r if r else 0.0
        for k in ks:
            out[f"em@{k}"] += int(0 < r <= k)
    return out


def bleu(references, best):
    """sacrebleu corpus BLEU of the best suggestions (a ``BLEUScore``: ``.score``, ``.counts``, ``.totals``)."""
    return sacrebleu.corpus_bleu([normalise(h) for h in best], [[normalise(r) for r in references]])


def score(references, nbest_lists, ks=(1, 5)):
    """All metrics of a test set, as percentages: BLEU, EM@k for each k, MRR."""
    if len(references) != len(nbest_lists):
        raise ValueError(f"{len(nbest_lists)} n-best lists for {len(references)} references")
    if not references:
        raise ValueError("no examples to score")
    sums = rank_sums(references, nbest_lists, ks)
    out = {"bleu": bleu(references, [h[0] if h else "" for h in nbest_lists]).score}
    for k in ks:
        out[f"em@{k}"] = 100.0 * sums[f"em@{k}"] / sums["n"]
    out["mrr"] = 100.0 * sums["rr"] / sums["n"]
    out["n"] = sums["n"]
    return out
