"""Search sessions in the HRED/AOL ``.ses`` format and the (prefix → next query) examples built from them.

Format (Sordoni et al. 2015, ``hred-qs``): one session per line, its queries
separated by TAB, the words of a query by spaces.  A session of m queries
yields m − 1 examples: the prefix q_1..q_j (j = 1..m−1) predicts q_{j+1}.

How a session prefix reaches fairseq (the source side of an example): its
queries joined by the query separator :data:`SEP` (``</q>``, HRED's
end-of-query symbol), so ``q_1 </q> q_2 </q> q_3`` plus the EOS that fairseq
appends.  The MTN encoder splits the row at ``</q>``/EOS back into queries
(:func:`user_dir.modules.mtn_session_encoder.split_queries`); every
fairseq tool (``fairseq-preprocess``, batching, ``fairseq-generate``) sees an
ordinary token sequence.

Bad sessions (:class:`SessionError`, always naming file and line):
a session with a single query (nothing to predict), an empty query (two
TABs in a row, a trailing TAB, a query of only spaces), a query longer than
``max_query_length`` words (the MTN query projection's padding length), and
a query containing the reserved separator ``</q>``.  With ``on_bad="skip"``
they are dropped and counted by reason instead (:class:`SkipCounter`).
"""
import collections
import logging

logger = logging.getLogger(__name__)

SEP = "</q>"  #: query separator inside a flattened session (HRED's end-of-query symbol)


class SessionError(ValueError):
    """A malformed session line; the message names the file and the line."""


class SkipCounter(collections.Counter):
    """Counts skipped sessions by reason; :meth:`log` writes one summary line."""

    def log(self, what):
        if self:
            detail = ", ".join(f"{n} {reason}" for reason, n in sorted(self.items()))
            logger.warning(f"{what}: skipped {sum(self.values())} session(s): {detail}")


def check_session(queries, max_query_length=None):
    """Returns None when ``queries`` (lists of words) is a usable session, else the reason."""
    if len(queries) < 2:
        return "single-query session" if queries else "empty session"
    for q in queries:
        if not q:
            return "empty query"
        if SEP in q:
            return "query containing the reserved separator"
        if max_query_length and len(q) > max_query_length:
            return "query too long"
    return None


def _describe(reason, queries, where, max_query_length):
    if reason == "query too long":
        longest = max(len(q) for q in queries)
        return (f"{where}: a query has {longest} words, more than --max-query-length {max_query_length} "
                f"(the MTN query projection's padding length); raise the limit or filter the data")
    if reason == "single-query session":
        return f"{where}: session has a single query, so there is no next query to predict"
    if reason == "empty query":
        return f"{where}: empty query (two TABs in a row, a trailing TAB or a blank query)"
    if reason == "query containing the reserved separator":
        return f"{where}: a query contains the reserved query separator '{SEP}'"
    return f"{where}: {reason}"


def parse_session_line(line, where, max_query_length=None, on_bad="error", skipped=None):
    """Splits one ``.ses`` line into queries (lists of words).

    Returns None for a blank line and for a bad session when ``on_bad == "skip"``
    (the reason is counted in ``skipped``); raises :class:`SessionError` otherwise.
    """
    line = line.rstrip("\n").rstrip("\r")
    if not line.strip():
        return None
    queries = [q.split() for q in line.split("\t")]
    reason = check_session(queries, max_query_length)
    if reason is None:
        return queries
    if on_bad == "skip":
        if skipped is not None:
            skipped[reason] += 1
        return None
    raise SessionError(_describe(reason, queries, where, max_query_length))


def read_sessions(path, max_query_length=None, on_bad="error"):
    """All usable sessions of a ``.ses`` file; skips (with ``on_bad="skip"``) are logged with counts."""
    skipped = SkipCounter()
    sessions = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            queries = parse_session_line(line, f"{path}:{lineno}", max_query_length, on_bad, skipped)
            if queries is not None:
                sessions.append(queries)
    skipped.log(path)
    return sessions, skipped


def session_examples(queries, max_context=0):
    """(context, next query) pairs, one per next query; ``max_context`` > 0 keeps the last queries only.

    Each example's context holds only queries that come before its target, so no
    query is ever predicted from a later one.
    """
    out = []
    for j in range(1, len(queries)):
        start = max(0, j - max_context) if max_context else 0
        out.append((queries[start:j], queries[j]))
    return out


def flatten(context):
    """The source line of an example: queries joined by `` </q> ``."""
    return f" {SEP} ".join(" ".join(q) for q in context)


def typed_session(line, encode_query=lambda query: query):
    """A session typed by a user (``fairseq-interactive``, the hub) as the source line: in the ``.ses``
    layout (queries separated by TAB) its queries, each through ``encode_query`` (tokenizer and BPE), are
    joined by `` </q> ``; a line without TAB (already ``q1 </q> q2``, or one query) goes through
    ``encode_query`` whole.  Without this a TAB would be read as a space, and the session as one query."""
    line = line.rstrip("\n")
    if "\t" not in line:
        return encode_query(line)
    return f" {SEP} ".join(encode_query(query.strip()) for query in line.split("\t"))
