#!/usr/bin/env python
"""TREC Session Track XML (2011–2014 layout) → sessions in the ``.ses`` format.

A ``<session>`` holds ``<interaction>`` s, each with one ``<query>``, and a final
``<currentquery>``; the session's queries are the interaction queries followed
by the current query, in document order.  Queries are normalised as in
``query_log_sessions.py`` (lowercase, non-alphanumerics → space), immediate
repeats are collapsed, over-long queries (``--max-query-length``) dropped, and
sessions with fewer than 2 queries dropped; every drop is counted.

Splits: sessions are assigned to train/valid/test by *topic* (``<topic num>``),
so that no topic of the test sessions is seen in training; ``--valid-topics``
and ``--test-topics`` give each held-out split's share of the topics (default
0.15 each; topics are ordered by number and every k-th one is held out, so
the split is deterministic).

Example::

    python preprocess/trec_session_sessions.py ../shared/data/trec-session-2013/sessiontrack2013.xml.xz --out data/trec
"""
import argparse
import collections
import lzma
import os
import sys
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from query_log_sessions import normalise  # noqa: E402


def read_trec_sessions(path):
    """[(session num, topic num, [raw queries])] in file order."""
    opener = lzma.open if path.endswith(".xz") else open
    with opener(path, "rb") as f:
        try:
            root = ET.parse(f).getroot()
        except ET.ParseError as e:
            raise ValueError(f"{path}: not well-formed XML ({e})") from None
    out = []
    for s in root.iter("session"):
        topic = s.find("topic")
        queries = [q.text or "" for part in s if part.tag in ("interaction", "currentquery")
                   for q in part.findall("query")]
        out.append((s.get("num"), topic.get("num") if topic is not None else s.get("num"), queries))
    if not out:
        raise ValueError(f"{path}: no <session> elements (is this a TREC Session Track file?)")
    return out


def clean(queries, max_query_length, counts):
    kept = []
    for raw in queries:
        q = normalise(raw)
        if not q:
            counts["empty queries"] += 1
        elif max_query_length and len(q.split()) > max_query_length:
            counts["over-long queries"] += 1
        elif kept and kept[-1] == q:
            counts["immediate repeats"] += 1
        else:
            kept.append(q)
    return kept


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("xml", help="sessiontrack20XX.xml or .xml.xz")
    p.add_argument("--out", required=True, help="output directory (train/valid/test.ses)")
    p.add_argument("--max-query-length", type=int, default=16)
    p.add_argument("--valid-topics", type=float, default=0.15)
    p.add_argument("--test-topics", type=float, default=0.15)
    args = p.parse_args(argv)
    try:
        raw = read_trec_sessions(args.xml)
    except (ValueError, OSError) as e:
        sys.exit(f"trec_session_sessions.py: error: {e}")
    counts = collections.Counter()
    topics = sorted({t for _, t, _ in raw}, key=lambda t: int(t) if t.isdigit() else t)
    held = max(1, round(1 / max(args.valid_topics + args.test_topics, 1e-9)))
    split_of = {}
    for i, t in enumerate(topics):
        if i % held == held - 1:
            split_of[t] = "test" if (i // held) % 2 == 0 else "valid"
        else:
            split_of[t] = "train"
    out = collections.defaultdict(list)
    for _, topic, queries in raw:
        kept = clean(queries, args.max_query_length, counts)
        if len(kept) < 2:
            counts["sessions with < 2 queries"] += 1
            continue
        out[split_of[topic]].append("\t".join(kept))
    os.makedirs(args.out, exist_ok=True)
    for split in ("train", "valid", "test"):
        with open(os.path.join(args.out, f"{split}.ses"), "w", encoding="utf-8") as f:
            f.writelines(line + "\n" for line in out[split])
    sizes = ", ".join(f"{s} {len(out[s])}" for s in ("train", "valid", "test"))
    dropped = ", ".join(f"{n} {what}" for what, n in sorted(counts.items())) or "nothing"
    print(f"{len(raw)} sessions, {len(topics)} topics -> {sizes} sessions; dropped: {dropped}")


if __name__ == "__main__":
    main()
