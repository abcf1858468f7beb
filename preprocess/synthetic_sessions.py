#!/usr/bin/env python
"""Synthetic hierarchical search sessions (``.ses``) so query suggestion runs without private logs.

Generative story (a session is driven by a latent intent, its queries are
reformulations of one another, as in AOL sessions):

* the vocabulary holds ``--topics`` topics; each has core terms, modifier
  terms and synonyms for some core terms (pseudo-words built from syllables);
* an intent = a topic + an ordered goal: the core terms the user wants and the
  modifiers they will add, in the order they will add them;
* the first query holds the first core terms, possibly with a misspelt term
  (two letters swapped);
* each next query applies one reformulation: **spelling fix** (always, when
  the previous query had a typo), **term addition** (the next goal term),
  **term substitution** (a core term by its synonym), **term removal** (drop the
  last modifier that was added earlier and not kept by the intent).

The next query thus depends on the whole session (which goal terms were used,
removed, substituted), not only on the last query.  Output: ``train.ses``,
``valid.ses``, ``test.ses`` in ``--out``; the same ``--seed`` gives the same files.
"""
import argparse
import os
import random

SYLLABLES = ["ka", "lo", "mi", "ne", "su", "ta", "ri", "po", "de", "fa", "gu", "ha", "ji", "ve", "zo", "bu", "ce", "ny"]


def make_word(rng, used):
    while True:
        word = "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3)))
        if word not in used:
            used.add(word)
            return word


def make_topics(rng, n_topics):
    used, topics = set(), []
    for _ in range(n_topics):
        core = [make_word(rng, used) for _ in range(4)]
        topics.append({
            "core": core,
            "mods": [make_word(rng, used) for _ in range(5)],
            "syn": {w: make_word(rng, used) for w in core[:2]},
        })
    return topics


def misspell(rng, word):
    i = rng.randrange(len(word) - 1)
    return word[:i] + word[i + 1] + word[i] + word[i + 2:]


def session(rng, topic, max_queries):
    """One session: a list of queries (lists of words)."""
    goal = topic["core"][2:] + rng.sample(topic["mods"], 3)
    rng.shuffle(goal)
    query = list(topic["core"][:2])
    typo = None
    if rng.random() < 0.3:
        i = rng.randrange(len(query))
        typo = (i, query[i])
        query[i] = misspell(rng, query[i])
    queries = [list(query)]
    added = []
    n = rng.randint(2, max_queries)
    while len(queries) < n:
        if typo is not None:  # spelling fix
            query[typo[0]] = typo[1]
            typo = None
        else:
            op = rng.random()
            if op < 0.55 and goal:  # term addition
                term = goal.pop(0)
                query.append(term)
                added.append(term)
            elif op < 0.75 and any(w in topic["syn"] for w in query):  # term substitution
                i = next(i for i, w in enumerate(query) if w in topic["syn"])
                query[i] = topic["syn"][query[i]]
            elif added and len(query) > 2:  # term removal: the user drops the last addition
                query.remove(added.pop())
            elif goal:
                term = goal.pop(0)
                query.append(term)
                added.append(term)
            else:
                break
        queries.append(list(query))
    return queries


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--train", type=int, default=5000)
    p.add_argument("--valid", type=int, default=500)
    p.add_argument("--test", type=int, default=500)
    p.add_argument("--topics", type=int, default=60)
    p.add_argument("--max-queries", type=int, default=6)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    if args.max_queries < 2:
        p.error("--max-queries must be at least 2 (a session needs a next query)")
    rng = random.Random(args.seed)
    topics = make_topics(rng, args.topics)
    os.makedirs(args.out, exist_ok=True)
    for split in ("train", "valid", "test"):
        with open(os.path.join(args.out, f"{split}.ses"), "w", encoding="utf-8") as f:
            written = 0
            while written < getattr(args, split):
                queries = session(rng, rng.choice(topics), args.max_queries)
                if len(queries) >= 2:
                    f.write("\t".join(" ".join(q) for q in queries) + "\n")
                    written += 1
    print(f"wrote {args.train}/{args.valid}/{args.test} sessions to {args.out}")


if __name__ == "__main__":
    main()
