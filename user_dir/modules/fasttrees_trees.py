"""Latent trees of FastTrees models: syntactic distances, greedy top-down parsing, bracketing F1.

As ON-LSTM (Shen et al. 2019, §4.3 and its ``test_phrase_grammar.py``):

* the syntactic distance of word t in a layer is ``d_t = 1 − mean(f̃_t)``,
  the share of the cell that the master forget gate erases when reading
  w_t (recorded by :class:`~user_dir.modules.fasttrees_layer.FastTreesSublayer`);
* the tree is built greedily top-down: split the span before the word with the
  largest distance; that word starts the right part: ``[tree(left), [w_max, tree(right)]]``;
* unlabelled bracketing F1 is averaged over sentences; brackets are the
  spans of length ≥ 2 below the root (the root span and single words are
  not counted), and gold trees drop punctuation and empty elements.
"""
import re

import torch

from .fasttrees_layer import fasttrees_modules

# ON-LSTM's data_ptb.py keeps the words with these POS tags (no punctuation, no -NONE-)
WORD_TAGS = {
    "CC", "CD", "DT", "EX", "FW", "IN", "JJ", "JJR", "JJS", "LS", "MD", "NN", "NNS", "NNP", "NNPS", "PDT",
    "POS", "PRP", "PRP$", "RB", "RBR", "RBS", "RP", "SYM", "TO", "UH", "VB", "VBD", "VBG", "VBN", "VBP",
    "VBZ", "WDT", "WP", "WP$", "WRB",
}


# --------------------------------------------------------------------------- trees from distances
def build_tree(distance, words):
    """Greedy top-down binary tree (nested lists) from one distance per word."""
    if len(distance) != len(words):
        raise ValueError(f"{len(distance)} distances for {len(words)} words")
    if len(words) == 1:
        return words[0]
    split = max(range(len(distance)), key=lambda i: (distance[i], -i))  # first maximum, as numpy.argmax
    right = words[split] if split == len(words) - 1 else [words[split], build_tree(distance[split + 1:],
                                                                                    words[split + 1:])]
    if split == 0:
        return right
    return [build_tree(distance[:split], words[:split]), right]


def tree_to_string(tree):
    """``((the cat) (sat down))``-style bracketing of a nested-list tree."""
    if isinstance(tree, list):
        return "(" + " ".join(tree_to_string(t) for t in tree) + ")"
    return str(tree)


def get_brackets(tree, start=0):
    """(spans, end): the (i, j) spans of length ≥ 2 strictly below the root of a nested-list tree."""
    if not isinstance(tree, list):
        return set(), start + 1
    spans, idx = set(), start
    for child in tree:
        child_spans, end = get_brackets(child, idx)
        if end - idx > 1:
            spans.add((idx, end))
            spans |= child_spans
        idx = end
    return spans, idx


def sentence_f1(predicted, gold):
    """Unlabelled bracketing F1 of one sentence (ON-LSTM's convention for empty bracket sets)."""
    pred, _ = get_brackets(predicted)
    ref, _ = get_brackets(gold)
    overlap = len(pred & ref)
    precision = 1.0 if not pred else overlap / len(pred)
    recall = 1.0 if not ref else overlap / len(ref)
    return 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)


def left_branching(words):
    tree = words[0]
    for w in words[1:]:
        tree = [tree, w]
    return tree


def right_branching(words):
    tree = words[-1]
    for w in reversed(words[:-1]):
        tree = [w, tree]
    return tree


# --------------------------------------------------------------------------- gold trees (PTB .mrg)
def parse_sexpr(text):
    """All top-level trees of a PTB ``.mrg`` text as nested (label, children) tuples; leaves are strings."""
    tokens = re.findall(r"\(|\)|[^\s()]+", text)
    trees, stack = [], []
    for tok in tokens:
        if tok == "(":
            stack.append([])
        elif tok == ")":
            node = stack.pop()
            item = (node[0], node[1:]) if node and isinstance(node[0], str) else ("", node)
            if stack:
                stack[-1].append(item)
            else:
                trees.append(item)
        else:
            stack[-1].append(tok)
    return trees


def normalise_word(word):
    return re.sub(r"[0-9]+", "N", word.lower())


def gold_tree(node):
    """Nested-list tree with punctuation/-NONE- removed and unary chains collapsed (ON-LSTM tree2list)."""
    label, children = node
    if len(children) == 1 and isinstance(children[0], str):
        return normalise_word(children[0]) if label in WORD_TAGS else None
    kept = [t for t in (gold_tree(c) for c in children if not isinstance(c, str)) if t is not None]
    if not kept:
        return None
    return kept[0] if len(kept) == 1 else kept


def leaves(tree):
    return [tree] if not isinstance(tree, list) else [w for t in tree for w in leaves(t)]


def read_treebank(path):
    """Gold nested-list trees of every sentence in the treebank zip (or a directory of .mrg files).

    An unreadable ``path`` or one without ``.mrg`` trees exits (``SystemExit``) with a message naming it.
    """
    import os
    import zipfile

    texts = []
    if os.path.isdir(path):
        for name in sorted(os.listdir(path)):
            if name.endswith(".mrg"):
                with open(os.path.join(path, name), encoding="utf-8") as f:
                    texts.append(f.read())
    elif zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            names = sorted(n for n in z.namelist() if n.startswith("treebank/combined/") and n.endswith(".mrg"))
            texts = [z.read(n).decode("utf-8") for n in names]
    else:
        raise SystemExit(f"--treebank {path}: neither a treebank zip nor a directory of .mrg files")
    if not texts:
        raise SystemExit(f"--treebank {path}: no .mrg trees found")
    trees = []
    for text in texts:
        for node in parse_sexpr(text):
            tree = gold_tree(node)
            if tree is not None:
                trees.append(tree)
    return trees


# --------------------------------------------------------------------------- distances from a model
@torch.no_grad()
def layer_distances(model, tokens):
    """Syntactic distances (n_layers, B, T) of every FastTrees layer for ``tokens`` (B, T).

    Works for ``fasttrees_transformer_lm`` (decoder), ``fasttrees_roberta``, the
    encoder of ``fasttrees_transformer`` and the recurrent language models
    ``fasttrees_lstm_lm`` and ``onlstm_lm``; raises ``ValueError`` for a model
    without master gates.
    """
    from fairseq.models import FairseqEncoderDecoderModel

    if hasattr(model, "syntactic_distances"):  # the recurrent cells (onlstm_lm, fasttrees_lstm_lm)
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                return model.syntactic_distances(tokens)
        finally:
            model.train(was_training)
    net = model.encoder if isinstance(model, FairseqEncoderDecoderModel) else model
    modules = fasttrees_modules(net)
    was_training = model.training
    model.eval()
    for m in modules:
        m.record_distance = True
    try:
        if isinstance(model, FairseqEncoderDecoderModel):
            model.encoder(tokens, src_lengths=tokens.ne(model.encoder.padding_idx).sum(1))
        else:
            model(tokens)
        return torch.stack([m.distance for m in modules], 0)
    finally:
        for m in modules:
            m.record_distance, m.distance = False, None
        model.train(was_training)


def draw_tree(tree, path, title=None):
    """Draws a nested-list binary tree to a PNG with matplotlib."""
    import logging

    import matplotlib

    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # fairseq's root logger may be at DEBUG
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    words = leaves(tree)
    fig, ax = plt.subplots(figsize=(max(4, 0.9 * len(words)), 3 + 0.25 * len(words)))
    counter = iter(range(len(words)))

    def place(node):  # returns (x, height)
        if not isinstance(node, list):
            x = next(counter)
            ax.text(x, -0.3, node, ha="center", va="top", rotation=45 if len(words) > 12 else 0, fontsize=9)
            return x, 0
        kids = [place(c) for c in node]
        height = 1 + max(h for _, h in kids)
        x = sum(k[0] for k in kids) / len(kids)
        for kx, kh in kids:
            ax.plot([x, kx], [height, kh], color="black", linewidth=1)
        return x, height

    _, height = place(tree)
    ax.set_xlim(-1, len(words))
    ax.set_ylim(-2, height + 0.5)
    ax.axis("off")
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# --------------------------------------------------------------------------- checkpoints and sentences
def load_model(path, data=None):
    """(model, dictionary) from a ``fairseq-train`` checkpoint (``data``: the binarized data dir, if moved)."""
    import os

    from fairseq import checkpoint_utils

    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint not found: {path}")
    overrides = {"data": data} if data else {}
    models, _cfg, task = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides=overrides)
    model = models[0]
    if not hasattr(model, "syntactic_distances"):
        fasttrees_modules(model)  # clear error for a model without FastTrees layers
    return model.eval(), task.source_dictionary


def sentence_distances(model, dictionary, words):
    """Distances (n_layers, len(words)) for one tokenised sentence, aligned with its words.

    Input layout per model kind: language model ``<eos> w1 … wn`` (as ON-LSTM,
    the distance read at w_t), encoder ``w1 … wn <eos>``, RoBERTa-style
    ``<s> w1 … wn </s>``.
    """
    from fairseq.models import FairseqEncoderDecoderModel, FairseqEncoderModel

    ids = [dictionary.index(w) for w in words]
    n = len(ids)
    if isinstance(model, FairseqEncoderDecoderModel):
        seq, offset = ids + [dictionary.eos()], 0
    elif isinstance(model, FairseqEncoderModel):
        seq, offset = [dictionary.bos()] + ids + [dictionary.eos()], 1
    else:
        seq, offset = [dictionary.eos()] + ids, 1
    dist = layer_distances(model, torch.tensor([seq]))
    return dist[:, 0, offset:offset + n]
