"""What a request that does not exist yet would be told (SPEC.md section 6).

The free output allowance is decided before a request is created, so it must
be answered from what the last cycle published, with no database query. Each
cycle therefore publishes a compact *prospective state*: the usable workers'
arrays, and the waiting queue reduced to one representative per take
signature (gentype, models, chat flag, lengths or size) with, per priority
level, how many requests, jobs and how much work wait there.

An answer runs the very same :func:`~vecsched._eligibility.eligibility` as the
batch on [the prospective request + the representatives], so the eligible
workers, threads and the set of takeable signatures are computed by one code
path; the work ahead is the queued work of the takeable signatures at a
priority at least the prospective one (an equal priority created earlier is
ahead). A request created right after the answer therefore gets the same
``ahead_wait`` from its first cycle, up to what changed in the queue.
"""

from __future__ import annotations

import io
from dataclasses import fields
from typing import Any, Mapping

import numpy as np
import pandas as pd

from ._columns import TEXT, RowError
from ._arrays import RequestArrays, WorkerArrays, request_arrays, take_rows, worker_arrays
from ._eligibility import eligibility
from ._estimates import Estimates
from ._groups import factorize_rows, set_codes, unpack_words
from ._snapshot import ListColumn, Snapshot, SnapshotError, _columns_from_records

STATE_VERSION = 1
_LIST_FIELDS = ("models", "targets")


class ProspectiveState:
    """The published inputs of a prospective answer; build once per cycle, read many times."""

    def __init__(self, arrays: dict[str, np.ndarray]):
        self.arrays = arrays
        self.now = float(arrays["now"][()])
        self.vocabulary = {name: code for code, name in enumerate(arrays["vocabulary"].tolist())}
        self.users = {name: code for code, name in enumerate(arrays["users"].tolist())}
        self.worker_index = pd.Index(arrays["worker_ids"].astype(object))
        self.workers = _unpack(WorkerArrays, arrays, "w_")
        self.queue = _unpack(RequestArrays, arrays, "q_")

    def to_bytes(self) -> bytes:
        """The state as ``.npz`` bytes (no pickled objects), as a cycle publishes it."""
        buffer = io.BytesIO()
        np.savez(buffer, **self.arrays)
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, blob: bytes) -> "ProspectiveState":
        """Parse published bytes; a state of another format version is refused."""
        with np.load(io.BytesIO(blob), allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
        if int(arrays["version"][()]) != STATE_VERSION:
            raise ValueError(f"prospective state version {int(arrays['version'][()])}, expected {STATE_VERSION}")
        return cls(arrays)


def build_prospective_state(snapshot: Snapshot, estimates: Estimates | None = None) -> bytes:
    """The bytes a cycle publishes so that :func:`answer_prospective` needs no database.

    Examples
    --------
    >>> import vecsched
    >>> from vecsched._prospective import answer_prospective, build_prospective_state
    >>> snap = vecsched.load_snapshot({
    ...     "format": "vecsched.snapshot/1", "now": "2026-11-29T12:00:00Z",
    ...     "workers": [{"id": "w1", "user_id": "u1", "gentype": "text", "speed": 20,
    ...                  "last_check_in": "2026-11-29T11:59:30Z", "models": ["m"]}],
    ...     "requests": [{"id": "r1", "user_id": "u2", "gentype": "text", "n": 1,
    ...                   "max_length": 200, "created": "2026-11-29T11:58:00Z",
    ...                   "expiry": "2026-11-29T12:18:00Z", "models": ["m"]}]})
    >>> state = build_prospective_state(snap)
    >>> answer_prospective(state, {"gentype": "text", "models": ["m"], "max_length": 100})
    {'eligible_workers': 1, 'eligible_worker_threads': 1, 'ahead_wait': 10.0, 'queue_position': 1}
    """
    w, r = snapshot.workers, snapshot.requests
    users, user_codes = _user_codes(w.user_id, r.user_id)
    wk = worker_arrays(snapshot, user_codes[: len(w)])
    usable = np.flatnonzero(wk.usable)
    wk = take_rows(wk, usable)
    rq = request_arrays(snapshot, user_codes[len(w) :], pd.Index(w.id))

    # One representative per raw take signature, with per-priority totals.
    text = rq.gentype == TEXT
    sig, _ = factorize_rows(
        rq.gentype,
        rq.model_set,
        rq.is_chat & text,
        np.where(text, rq.max_length, 0),
        np.where(text, rq.max_context_length, 0),
        np.where(text, 0, rq.pixels),
    )
    level, level_first = factorize_rows(sig, rq.priority)
    level_sig = sig[level_first]
    level_priority = rq.priority[level_first]
    work = rq.n * rq.output
    count = np.bincount(level, minlength=len(level_first)).astype(np.int64)
    jobs = np.bincount(level, weights=rq.n, minlength=len(level_first)).astype(np.int64)
    level_work = np.zeros(len(level_first), dtype=np.int64)
    np.add.at(level_work, level, work)
    order = np.lexsort((-level_priority, level_sig))
    sig_sorted = level_sig[order]
    starts = np.flatnonzero(np.r_[True, sig_sorted[1:] != sig_sorted[:-1]]) if len(order) else np.zeros(0, np.int64)
    representative = np.full(int(sig.max()) + 1 if len(sig) else 0, -1, dtype=np.int64)
    representative[sig[::-1]] = np.arange(len(sig) - 1, -1, -1)
    reps = representative[sig_sorted[starts]] if len(starts) else np.zeros(0, np.int64)
    queue = take_rows(rq, reps)
    # Representatives stand for signatures only: their gates must not make them special.
    queue.targets = ListColumn(np.zeros(len(reps) + 1, dtype=np.int64), np.zeros(0, dtype=np.int64))
    queue.user = np.full(len(reps), -1, dtype=np.int64)

    arrays: dict[str, np.ndarray] = {
        "version": np.array(STATE_VERSION),
        "now": np.array(snapshot.now),
        "vocabulary": np.asarray(snapshot.model_names.tolist(), dtype=str),
        "users": np.asarray(users, dtype=str),
        "worker_ids": np.asarray(wk.ids.tolist(), dtype=str),
        # Priority levels, grouped by representative (row k of the queue arrays).
        "level_queue_row": np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, len(order)])),
        "level_priority": level_priority[order],
        "level_count": count[order],
        "level_jobs": jobs[order],
        "level_work": level_work[order],
    }
    arrays.update(_pack(wk, "w_"))
    arrays.update(_pack(queue, "q_"))
    return ProspectiveState(arrays).to_bytes()


def answer_prospective(
    state: bytes | ProspectiveState, request: Mapping[str, Any], now: float | None = None
) -> dict[str, Any]:
    """Eligible workers, threads and ``ahead_wait`` for a request queued now.

    ``request`` uses the request keys of the snapshot format (``gentype``,
    ``models``, ``max_length``, ``is_chat``, ``extra_priority``, gates,
    ``worker_ids``...); ``id``, ``n`` and times are not needed. ``ahead_wait``
    is None when no thread is eligible (the allowance then takes its floor).
    """
    st = state if isinstance(state, ProspectiveState) else ProspectiveState.from_bytes(state)
    now = st.now if now is None else float(now)
    row = dict(request)
    row.setdefault("id", "prospective")
    row.setdefault("user_id", "")
    row["n"] = 1  # the answer does not depend on the request's own size
    errors: list[RowError] = []
    cols = _columns_from_records("requests", [row | {"created": "1970-01-01T00:00:00Z", "expiry": "2999-01-01T00:00:00Z"}], errors)
    single = Snapshot.from_columns(now, {}, cols, rejected=errors)
    if single.rejected:
        raise SnapshotError(f"prospective request: {single.rejected[0].field}: {single.rejected[0].message}")
    user_code = np.array([st.users.get(single.requests.user_id[0], -1)], dtype=np.int64)
    mine = request_arrays(single, user_code, st.worker_index)
    # Model codes must be the published vocabulary's; names nobody serves get fresh codes.
    names = single.model_names[mine.models.values].tolist()
    extra: dict[str, int] = {}
    codes = [st.vocabulary.get(nm) if nm in st.vocabulary else extra.setdefault(nm, len(st.vocabulary) + len(extra)) for nm in names]
    mine.models = ListColumn(mine.models.offsets, np.asarray(codes, dtype=np.int64))
    vocabulary_size = len(st.vocabulary) + len(extra)

    gentype = int(mine.gentype[0])
    same = np.flatnonzero(st.queue.gentype == gentype)
    combined = _concat(mine, take_rows(st.queue, same))
    combined.model_set = set_codes(combined.models, vocabulary_size)
    elig = eligibility(
        st.workers,
        combined,
        gentype,
        (np.zeros(0, np.int64), np.zeros(0, np.int64)),
        vocabulary_size,
        with_competition=True,
    )
    threads = int(elig.threads[0])
    answer: dict[str, Any] = {"eligible_workers": int(elig.workers[0]), "eligible_worker_threads": threads}
    if threads == 0:
        answer["ahead_wait"] = None
        return answer
    takeable = unpack_words(elig.takeable[elig.row[:1]], elig.n_signatures)[0]
    taken = np.zeros(len(st.queue.gentype), dtype=bool)
    taken[same[takeable[elig.signature[1:]]]] = True
    # Ahead: queued at a priority at least ours (equal priority was created earlier).
    levels = taken[st.arrays["level_queue_row"]] & (st.arrays["level_priority"] >= int(mine.priority[0]))
    count_ahead = int(st.arrays["level_count"][levels].sum())
    jobs_ahead = int(st.arrays["level_jobs"][levels].sum())
    work_ahead = int(st.arrays["level_work"][levels].sum())
    throughput = float(elig.throughput[0])
    if jobs_ahead == 0:
        ahead = 0.0
    elif throughput == 0:
        ahead = None
    else:
        ahead = work_ahead / (throughput * min(1.0, jobs_ahead / threads))
    answer["ahead_wait"] = ahead
    answer["queue_position"] = count_ahead
    return answer


def _user_codes(worker_users: np.ndarray, request_users: np.ndarray) -> tuple[list[str], np.ndarray]:
    codes, uniques = pd.factorize(np.concatenate([worker_users, request_users]).astype(object))
    return list(uniques), codes.astype(np.int64)


def _concat(a: RequestArrays, b: RequestArrays) -> RequestArrays:
    values = {}
    for f in fields(RequestArrays):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, ListColumn):
            values[f.name] = ListColumn(
                np.r_[x.offsets, y.offsets[1:] + x.offsets[-1]].astype(np.int64),
                np.r_[x.values.astype(np.int64), y.values.astype(np.int64)],
            )
        else:
            values[f.name] = np.concatenate([x, y])
    return RequestArrays(**values)


def _pack(arrays: Any, prefix: str) -> dict[str, np.ndarray]:
    out = {}
    for f in fields(type(arrays)):
        value = getattr(arrays, f.name)
        if isinstance(value, ListColumn):
            out[f"{prefix}{f.name}__offsets"] = value.offsets
            out[f"{prefix}{f.name}__values"] = value.values.astype(np.int64)
        elif value.dtype == object:
            out[prefix + f.name] = np.asarray(value.tolist(), dtype=str)
        else:
            out[prefix + f.name] = value
    return out


def _unpack(kind: type, arrays: dict[str, np.ndarray], prefix: str) -> Any:
    values = {}
    for f in fields(kind):
        if f.name in _LIST_FIELDS:
            values[f.name] = ListColumn(arrays[f"{prefix}{f.name}__offsets"], arrays[f"{prefix}{f.name}__values"])
        else:
            value = arrays[prefix + f.name]
            values[f.name] = value.astype(object) if value.dtype.kind == "U" else value
    return kind(**values)


__all__ = ["ProspectiveState", "answer_prospective", "build_prospective_state"]
