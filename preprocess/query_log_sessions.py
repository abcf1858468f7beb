#!/usr/bin/env python
"""Query-log TSV (user or session id, timestamp, query) → sessions in the ``.ses`` format (AOL/HRED conventions).

Input: TAB-separated rows ``id<TAB>timestamp<TAB>query[<TAB>more columns…]``
(AOL's ``AnonID  Query  QueryTime  …`` order is read with ``--columns 0,2,1``).
A header row is recognised (its timestamp column does not parse) and skipped.
Timestamps: ``YYYY-MM-DD HH:MM:SS`` (AOL), ISO 8601, or seconds since the epoch.

Steps, per id in time order:

1. normalisation: lowercasing, every run of non-alphanumeric characters → one
   space (HRED's "non-alphanumerics stripped"), surrounding spaces removed;
2. a new session starts after ``--gap`` minutes of inactivity (default 30);
3. immediate repeats of the same (normalised) query are collapsed (AOL logs a
   repeat for every result page the user opened);
4. filters: empty queries are dropped; queries longer than ``--max-query-length``
   words are dropped; sessions keep at most ``--max-session-queries`` queries
   (the first ones); sessions with fewer than 2 queries are dropped.

Rows with missing columns or a bad timestamp stop the run with the file and
line named, or with ``--bad-rows skip`` are counted and skipped.  Every drop
is counted in the summary printed at the end.  Optional chronological split:
``--split 0.8,0.1,0.1`` writes train/valid/test.ses by session start time.
"""
import argparse
import collections
import datetime
import os
import re
import sys

_NON_ALNUM = re.compile(r"[^0-9a-z]+")


class LogError(ValueError):
    pass


def normalise(query):
    return _NON_ALNUM.sub(" ", query.lower()).strip()


def parse_time(text):
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    for fmt in ("%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M:%S%z"):
        try:
            return datetime.datetime.strptime(text, fmt).timestamp()
        except ValueError:
            continue
    raise ValueError(f"unreadable timestamp {text!r}")


def read_rows(path, columns, on_bad, counts):
    """Yields (id, time, raw query) rows; bad rows raise :class:`LogError` or are counted."""
    need = max(columns) + 1
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip("\n").rstrip("\r")
            if not line.strip():
                continue
            cells = line.split("\t")
            where = f"{path}:{lineno}"
            if len(cells) < need:
                if on_bad == "skip":
                    counts["rows with missing columns"] += 1
                    continue
                raise LogError(f"{where}: {len(cells)} TAB-separated column(s), need {need} "
                               f"(id, timestamp, query at columns {columns})")
            uid, stamp, query = (cells[c] for c in columns)
            try:
                t = parse_time(stamp)
            except ValueError as e:
                if lineno == 1:
                    counts["header rows"] += 1
                    continue
                if on_bad == "skip":
                    counts["rows with a bad timestamp"] += 1
                    continue
                raise LogError(f"{where}: {e}") from None
            yield uid, t, query


def sessions_from_rows(rows, gap_s, max_query_length, max_session_queries, counts):
    by_user = collections.defaultdict(list)
    for order, (uid, t, query) in enumerate(rows):
        by_user[uid].append((t, order, query))
    out = []
    for uid, events in by_user.items():
        events.sort()
        current, last_t = [], None
        for t, _, raw in events:
            if last_t is not None and t - last_t > gap_s:
                out.append(_finish(current, max_session_queries, counts))
                current = []
            last_t = t
            q = normalise(raw)
            if not q:
                counts["empty queries"] += 1
                continue
            if max_query_length and len(q.split()) > max_query_length:
                counts["over-long queries"] += 1
                continue
            if current and current[-1][1] == q:
                counts["immediate repeats"] += 1
                continue
            current.append((t, q))
        out.append(_finish(current, max_session_queries, counts))
    return sorted((s for s in out if s), key=lambda s: s[0][0])


def _finish(session, max_queries, counts):
    if len(session) < 2:
        if session:
            counts["single-query sessions"] += 1
        return None
    if max_queries and len(session) > max_queries:
        counts["queries cut from long sessions"] += len(session) - max_queries
        session = session[:max_queries]
    return session


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("tsv", nargs="+")
    p.add_argument("--out", required=True, help="a .ses file, or a directory with --split")
    p.add_argument("--columns", default="0,1,2", help="0-based columns of id, timestamp, query (AOL: 0,2,1)")
    p.add_argument("--gap", type=float, default=30.0, help="minutes of inactivity that end a session")
    p.add_argument("--max-query-length", type=int, default=16)
    p.add_argument("--max-session-queries", type=int, default=10)
    p.add_argument("--bad-rows", choices=["error", "skip"], default="error")
    p.add_argument("--split", help="chronological train,valid,test fractions, e.g. 0.8,0.1,0.1")
    args = p.parse_args(argv)
    columns = [int(c) for c in args.columns.split(",")]
    if len(columns) != 3:
        p.error("--columns needs three indices: id, timestamp, query")
    counts = collections.Counter()
    try:
        rows = [r for path in args.tsv for r in read_rows(path, columns, args.bad_rows, counts)]
    except (LogError, OSError) as e:
        sys.exit(f"query_log_sessions.py: error: {e}")
    sessions = sessions_from_rows(rows, args.gap * 60, args.max_query_length, args.max_session_queries, counts)
    lines = ["\t".join(q for _, q in s) for s in sessions]
    if args.split:
        fractions = [float(x) for x in args.split.split(",")]
        os.makedirs(args.out, exist_ok=True)
        bounds = [round(sum(fractions[:i + 1]) / sum(fractions) * len(lines)) for i in range(3)]
        for name, lo, hi in zip(("train", "valid", "test"), [0] + bounds[:2], bounds):
            with open(os.path.join(args.out, f"{name}.ses"), "w", encoding="utf-8") as f:
                f.writelines(line + "\n" for line in lines[lo:hi])
    else:
        with open(args.out, "w", encoding="utf-8") as f:
            f.writelines(line + "\n" for line in lines)
    dropped = ", ".join(f"{n} {what}" for what, n in sorted(counts.items())) or "nothing"
    print(f"{len(rows)} rows -> {len(lines)} sessions; dropped/skipped: {dropped}")


if __name__ == "__main__":
    main()
