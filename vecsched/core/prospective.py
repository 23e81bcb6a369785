"""What a request that does not exist yet would be told (SPEC.md section 6).

The free output allowance is decided before a request is created, so it must
be answered from what the last cycle published, with no database query. Each
cycle therefore publishes a compact *prospective state*, taken from the
batch's own intermediate results: the usable workers' arrays; per gentype, the
signatures each worker take class could take; and the waiting queue reduced
to totals per (signature, priority).

An answer evaluates the one request against the workers with the very same
:func:`~vecsched.core.eligibility.eligibility` as the batch, ORs the rows of the
take classes among its eligible workers, and sums the queued totals of those
signatures at a priority at least its own (an equal priority, created
earlier, is ahead). A request created right after the answer therefore gets
the same ``ahead_wait`` from its first cycle, up to what changed in the queue.
"""

from __future__ import annotations

import io
from dataclasses import fields
from typing import Any, Mapping

import numpy as np
import pandas as pd

from vecsched.core import figures
from vecsched.core.arrays import WorkerArrays, request_arrays, take_rows
from vecsched.snapshot.schema import GENTYPES, RowError
from vecsched.core.eligibility import eligibility
from vecsched.core.estimate import estimate
from vecsched.core.result import CompetitionState, Estimates, QueueSignatures
from vecsched.core.groups import factorize_rows, or_by_segments, set_codes, unpack_words
from vecsched.snapshot.lists import ListColumn
from vecsched.snapshot.snapshot import Snapshot, SnapshotError, columns_from_records

STATE_VERSION = 3
# 3: strings stored as one UTF-8 buffer per array (no fixed-width columns).
_LIST_FIELDS = ("models",)


class ProspectiveState:
    """The published inputs of a prospective answer; build once per cycle, read many times."""

    def __init__(self, arrays: dict[str, np.ndarray]):
        self.arrays = arrays
        self.now = float(arrays["now"][()])
        self.model_names = _unpack_strings(arrays, "vocabulary")
        self.vocabulary = {name: code for code, name in enumerate(self.model_names)}
        self.users = {name: code for code, name in enumerate(_unpack_strings(arrays, "users"))}
        self.worker_index = pd.Index(_unpack_strings(arrays, "worker_ids"), dtype=object)
        self.workers = _unpack(WorkerArrays, arrays, "w_")

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

    ``estimates`` must be the batch's estimate of ``snapshot`` (computed here
    when not given); its intermediate results are reused, not recomputed.

    Examples
    --------
    >>> import vecsched
    >>> from vecsched.core.prospective import answer_prospective, build_prospective_state
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
    if estimates is None or estimates.competition is None:
        estimates = estimate(snapshot)
    batch = estimates.competition
    wk = take_rows(batch.workers, np.flatnonzero(batch.workers.usable))
    arrays: dict[str, np.ndarray] = {
        "version": np.array(STATE_VERSION),
        "now": np.array(snapshot.now),
        **_pack_strings("vocabulary", snapshot.model_names.tolist()),
        **_pack_strings("users", batch.users.tolist()),
        **_pack_strings("worker_ids", wk.ids.tolist()),
        # Which gentypes get eligibility-aware waits (image only when the cycle asked).
        "aware_text": np.array(True),
        "aware_image": np.array(estimates.options.eligible_image_wait),
    }
    arrays.update(_pack(wk, "w_"))
    for name, queue in batch.by_gentype.items():
        arrays.update(_queue_levels(name, queue, batch))
    return ProspectiveState(arrays).to_bytes()


def _queue_levels(name: str, queue: QueueSignatures, batch: CompetitionState) -> dict[str, np.ndarray]:
    """The queue of one gentype reduced to totals per (signature, priority level)."""
    priority = batch.priority[queue.rows]
    n = batch.jobs[queue.rows]
    level, level_first = factorize_rows(queue.signature, priority)
    levels = len(level_first)
    return {
        f"{name}_n_signatures": np.array(queue.n_signatures),
        f"{name}_class_rows": queue.class_rows,
        f"{name}_worker_class": queue.worker_class,
        f"{name}_level_signature": queue.signature[level_first],
        f"{name}_level_priority": priority[level_first],
        f"{name}_level_count": np.bincount(level, minlength=levels).astype(np.int64),
        f"{name}_level_jobs": np.bincount(level, weights=n, minlength=levels).astype(np.int64),
        f"{name}_level_work": np.bincount(level, weights=n * batch.output[queue.rows], minlength=levels).astype(np.int64),
    }


def prospective_request(request: Mapping[str, Any], now: float = 0.0) -> Snapshot:
    """The request about to be made as a one-request snapshot, or the SnapshotError naming its bad key.

    Judged by the snapshot format's own rules whatever the cycle: a body's
    validity does not depend on how fresh the estimates are.

    Examples
    --------
    >>> prospective_request({"gentype": "text", "max_length": 100}).requests.max_length.tolist()
    [100]
    >>> prospective_request({"gentype": "audio"})
    Traceback (most recent call last):
    ...
    vecsched.snapshot.snapshot.SnapshotError: prospective request: gentype: must be one of text, image
    """
    row = dict(request)
    row.setdefault("id", "prospective")
    row.setdefault("user_id", "")
    row.setdefault("n", 1)
    # A request about to be made is waiting, whatever state keys the body carries.
    row.update(active=True, faulted=False)
    row.pop("jobs", None)
    errors: list[RowError] = []
    times = {"created": "1970-01-01T00:00:00Z", "expiry": "2999-01-01T00:00:00Z"}
    cols = columns_from_records("requests", [row | times], errors)
    single = Snapshot.from_columns(now, {}, cols, rejected=errors)
    if single.rejected:
        raise SnapshotError(f"prospective request: {single.rejected[0].field}: {single.rejected[0].message}")
    if single.requests.n[0] != 1:
        # n is judged like every key, then set to one: the answer does not depend on the request's own size.
        cols["n"] = np.ones_like(cols["n"])
        single = Snapshot.from_columns(now, {}, cols)
    return single


def answer_prospective(
    state: bytes | ProspectiveState, request: Mapping[str, Any] | Snapshot, now: float | None = None
) -> dict[str, Any]:
    """Eligible workers, threads and ``ahead_wait`` for a request queued now.

    ``request`` uses the request keys of the snapshot format (``gentype``,
    ``models``, ``max_length``, ``is_chat``, ``extra_priority``, gates,
    ``worker_ids``...); ``id``, ``n`` and times are not needed. Or it is
    :func:`prospective_request`'s snapshot of them, parsed once by a caller
    that judged the body first (its times keep it waiting at any ``now``). ``ahead_wait``
    is None when no thread is eligible (the allowance then takes its floor),
    and for image unless the cycle ran with eligibility-aware image waits.
    """
    st = state if isinstance(state, ProspectiveState) else ProspectiveState.from_bytes(state)
    now = st.now if now is None else float(now)
    single = request if isinstance(request, Snapshot) else prospective_request(request, now)
    user_code = np.array([st.users.get(single.requests.user_id[0], -1)], dtype=np.int64)
    mine = request_arrays(single, user_code, st.worker_index)
    # Model codes must be the published vocabulary's; names nobody serves get fresh codes.
    names = single.model_names[mine.models.values].tolist()
    extra: dict[str, int] = {}
    codes = [st.vocabulary[nm] if nm in st.vocabulary else extra.setdefault(nm, len(st.vocabulary) + len(extra)) for nm in names]
    mine.models = ListColumn(mine.models.offsets, np.asarray(codes, dtype=np.int64))
    vocabulary_size = len(st.vocabulary) + len(extra)
    mine.model_set = set_codes(mine.models, vocabulary_size)

    gentype = int(mine.gentype[0])
    name = GENTYPES[gentype]
    elig = eligibility(
        st.workers,
        mine,
        gentype,
        (np.zeros(0, np.int64), np.zeros(0, np.int64)),
        with_competition=False,
        every_request_special=True,
    )
    threads = int(elig.threads[0])
    answer: dict[str, Any] = {"eligible_workers": int(elig.workers[0]), "eligible_worker_threads": threads}
    if threads == 0 or not bool(st.arrays[f"aware_{name}"]):
        answer["ahead_wait"] = None
        return answer
    a = st.arrays
    if f"{name}_class_rows" not in a:  # nothing of this gentype is queued
        answer.update(ahead_wait=0.0, queue_position=0)
        return answer
    # The signatures the request's eligible workers could take: OR of their classes' rows.
    classes = np.unique(a[f"{name}_worker_class"][elig.eligible_workers[0]])
    words = or_by_segments(a[f"{name}_class_rows"][classes], np.zeros(1, dtype=np.int64))
    takeable = unpack_words(words, int(a[f"{name}_n_signatures"]))[0]
    # Ahead: queued at a priority at least ours (equal priority was created earlier).
    levels = takeable[a[f"{name}_level_signature"]] & (a[f"{name}_level_priority"] >= int(mine.priority[0]))
    jobs_ahead = int(a[f"{name}_level_jobs"][levels].sum())
    work_ahead = int(a[f"{name}_level_work"][levels].sum())
    ahead = float(figures.ahead_wait(np.array([work_ahead]), np.array([jobs_ahead]), np.array([float(threads)]), elig.throughput[:1])[0])
    answer["ahead_wait"] = None if np.isnan(ahead) else ahead
    answer["queue_position"] = int(a[f"{name}_level_count"][levels].sum())
    return answer


def _pack(arrays: Any, prefix: str) -> dict[str, np.ndarray]:
    out = {}
    for f in fields(type(arrays)):
        value = getattr(arrays, f.name)
        if isinstance(value, ListColumn):
            out[f"{prefix}{f.name}__offsets"] = value.offsets
            out[f"{prefix}{f.name}__values"] = value.values.astype(np.int64)
        elif value.dtype == object:
            out.update(_pack_strings(prefix + f.name, value.tolist()))
        else:
            out[prefix + f.name] = value
    return out


def _unpack(kind: type, arrays: dict[str, np.ndarray], prefix: str) -> Any:
    values = {}
    for f in fields(kind):
        if f.name in _LIST_FIELDS:
            values[f.name] = ListColumn(arrays[f"{prefix}{f.name}__offsets"], arrays[f"{prefix}{f.name}__values"])
        elif f"{prefix}{f.name}__utf8" in arrays:
            values[f.name] = _object(_unpack_strings(arrays, prefix + f.name))
        else:
            values[f.name] = arrays[prefix + f.name]
    return kind(**values)


def _pack_strings(name: str, strings: list[str]) -> dict[str, np.ndarray]:
    """Strings as one UTF-8 buffer joined by NUL (which no valid string holds) and a count.

    A fixed-width string array is as wide as its longest entry times every
    row; this is as long as the text itself.
    """
    data = "\x00".join(strings).encode("utf-8")
    return {f"{name}__utf8": np.frombuffer(data, dtype=np.uint8), f"{name}__count": np.array(len(strings))}


def _unpack_strings(arrays: dict[str, np.ndarray], name: str) -> list[str]:
    if int(arrays[f"{name}__count"][()]) == 0:
        return []
    return arrays[f"{name}__utf8"].tobytes().decode("utf-8").split("\x00")


def _object(strings: list[str]) -> np.ndarray:
    out = np.empty(len(strings), dtype=object)
    out[:] = strings
    return out


__all__ = ["ProspectiveState", "answer_prospective", "build_prospective_state"]
