#!/usr/bin/env python
"""Deterministic synthetic English→German-like parallel corpus for the demo.

The target language differs from the source in ways a translation model has
to learn, so BLEU moves with training:

* reordering: the finite verb goes to the end of the clause (SOV), and
  subordinate clauses ("that ...", "because ...") are verb-final too;
* agreement: articles and adjectives inflect for the noun's gender and number,
  verbs inflect for the subject's person/number;
* a lexicon: every source word maps to a different target word.

Usage::

    python preprocess/toy_translation_corpus.py --out DIR [--train 4000 --valid 300 --test 300 --seed 1]

writes DIR/{train,valid,test}.{en,de}, one sentence per line.
"""
import argparse
import os
import random
import sys

# noun: (en singular, en plural, de singular, de plural, gender)
NOUNS = [
    ("dog", "dogs", "hund", "hunde", "m"), ("cat", "cats", "katze", "katzen", "f"),
    ("child", "children", "kind", "kinder", "n"), ("man", "men", "mann", "maenner", "m"),
    ("woman", "women", "frau", "frauen", "f"), ("house", "houses", "haus", "haeuser", "n"),
    ("car", "cars", "wagen", "wagen", "m"), ("book", "books", "buch", "buecher", "n"),
    ("bird", "birds", "vogel", "voegel", "m"), ("flower", "flowers", "blume", "blumen", "f"),
    ("teacher", "teachers", "lehrer", "lehrer", "m"), ("girl", "girls", "maedchen", "maedchen", "n"),
    ("city", "cities", "stadt", "staedte", "f"), ("tree", "trees", "baum", "baeume", "m"),
    ("ball", "balls", "ball", "baelle", "m"), ("door", "doors", "tuer", "tueren", "f"),
]
ADJECTIVES = [("big", "gross"), ("small", "klein"), ("red", "rot"), ("old", "alt"),
              ("young", "jung"), ("happy", "froh"), ("green", "gruen"), ("fast", "schnell")]
# verb: (en 3sg, en plural, de 3sg, de plural)
VERBS = [("sees", "see", "sieht", "sehen"), ("likes", "like", "mag", "moegen"),
         ("finds", "find", "findet", "finden"), ("has", "have", "hat", "haben"),
         ("follows", "follow", "folgt", "folgen"), ("paints", "paint", "malt", "malen"),
         ("carries", "carry", "traegt", "tragen"), ("visits", "visit", "besucht", "besuchen")]
ADVERBS = [("today", "heute"), ("often", "oft"), ("again", "wieder"), ("quietly", "leise")]
CONJ = [("that", "dass"), ("because", "weil"), ("while", "waehrend")]
REPORT = [("says", "say", "sagt", "sagen"), ("thinks", "think", "denkt", "denken"),
          ("knows", "know", "weiss", "wissen")]

# German-like article table: (definite?, case, gender/number) -> article
DEF = {("nom", "m"): "der", ("nom", "f"): "die", ("nom", "n"): "das", ("nom", "pl"): "die",
       ("acc", "m"): "den", ("acc", "f"): "die", ("acc", "n"): "das", ("acc", "pl"): "die"}
INDEF = {("nom", "m"): "ein", ("nom", "f"): "eine", ("nom", "n"): "ein",
         ("acc", "m"): "einen", ("acc", "f"): "eine", ("acc", "n"): "ein"}
ADJ_ENDING = {("def", "m"): "e", ("def", "f"): "e", ("def", "n"): "e", ("def", "pl"): "en",
              ("indef", "nom", "m"): "er", ("indef", "acc", "m"): "en",
              ("indef", "f"): "e", ("indef", "n"): "es", ("bare", "pl"): "e"}


def noun_phrase(rng, case):
    """Returns (en tokens, de tokens, number) of a random noun phrase."""
    en_sg, en_pl, de_sg, de_pl, gender = rng.choice(NOUNS)
    plural = rng.random() < 0.35
    definite = plural and rng.random() < 0.7 or not plural and rng.random() < 0.6
    adj = rng.choice(ADJECTIVES) if rng.random() < 0.5 else None
    key = "pl" if plural else gender
    en, de = [], []
    if definite:
        en.append("the")
        de.append(DEF[(case, key)])
        ending = ADJ_ENDING[("def", key)]
    elif plural:
        en.append("some")
        de.append("einige")
        ending = ADJ_ENDING[("bare", "pl")]
    else:
        en.append("a")
        de.append(INDEF[(case, gender)])
        ending = ADJ_ENDING.get(("indef", case, gender)) or ADJ_ENDING[("indef", gender)]
    if adj:
        en.append(adj[0])
        de.append(adj[1] + ending)
    en.append(en_pl if plural else en_sg)
    de.append(de_pl if plural else de_sg)
    return en, de, plural


def clause(rng, subordinate):
    """A transitive clause; German puts the verb last in subordinate clauses."""
    s_en, s_de, s_pl = noun_phrase(rng, "nom")
    o_en, o_de, _ = noun_phrase(rng, "acc")
    v = rng.choice(VERBS)
    adv = rng.choice(ADVERBS) if rng.random() < 0.3 else None
    v_en, v_de = (v[1], v[3]) if s_pl else (v[0], v[2])
    en = s_en + [v_en] + o_en + ([adv[0]] if adv else [])
    if subordinate:  # S (ADV) O V
        de = s_de + ([adv[1]] if adv else []) + o_de + [v_de]
    else:  # V2: S V (ADV) O
        de = s_de + [v_de] + ([adv[1]] if adv else []) + o_de
    return en, de


def sentence(rng):
    if rng.random() < 0.45:
        return clause(rng, subordinate=False)
    # S reports/thinks CONJ clause  ->  S V , CONJ S O V
    s_en, s_de, s_pl = noun_phrase(rng, "nom")
    r = rng.choice(REPORT)
    c_en, c_de = rng.choice(CONJ)
    sub_en, sub_de = clause(rng, subordinate=True)
    r_en, r_de = (r[1], r[3]) if s_pl else (r[0], r[2])
    return s_en + [r_en, c_en] + sub_en, s_de + [r_de, ",", c_de] + sub_de


def generate(n, rng, seen):
    pairs = []
    while len(pairs) < n:
        en, de = sentence(rng)
        key = " ".join(en)
        if key in seen:
            continue
        seen.add(key)
        pairs.append((key + " .", " ".join(de) + " ."))
    return pairs


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--train", type=int, default=4000)
    p.add_argument("--valid", type=int, default=300)
    p.add_argument("--test", type=int, default=300)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    if min(args.train, args.valid, args.test) <= 0:
        p.error("--train, --valid and --test must be positive")
    rng = random.Random(args.seed)
    seen = set()  # no sentence occurs in two splits
    os.makedirs(args.out, exist_ok=True)
    for split, n in (("train", args.train), ("valid", args.valid), ("test", args.test)):
        pairs = generate(n, rng, seen)
        for side, lang in ((0, "en"), (1, "de")):
            with open(os.path.join(args.out, f"{split}.{lang}"), "w") as f:
                f.writelines(pair[side] + "\n" for pair in pairs)
    print(f"wrote {args.train}/{args.valid}/{args.test} sentence pairs to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
