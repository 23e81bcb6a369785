"""Every waiting request's figures, and the document they are published as."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from vecsched.core.arrays import WorkerArrays
from vecsched.core.stall import EVIDENCE, evidence_names
from vecsched.core.stall_cache import REFRESH_SECONDS, check_refresh
from vecsched.snapshot.schema import GENTYPES, RowError
from vecsched.snapshot.times import iso

FORMAT = "vecsched.estimates/1"

# Per-request columns of :class:`Estimates`, in document order. Floats use NaN
# for "unknown" (null in the document).
INT_FIELDS = (
    "eligible_workers",
    "eligible_worker_threads",
    "queue_position",
    "horde_queue_position",
    "waiting",
    "processing",
    "finished",
    "restarted",
    "dispatch_opportunities",
    "lost_opportunities",
    "returned_capacity",
    "active_preceding_dispatches",
)
FLOAT_FIELDS = ("wait_time", "ahead_wait", "horde_wait_time", "arriving_work", "returned_work")
BOOL_FIELDS = ("is_possible", "fallback", "might_stall")
# An int8 code into vecsched.core.stall.EVIDENCE, -1 for null; a string or null in the document.
EVIDENCE_FIELDS = ("stall_evidence",)
FIELDS = (
    "gentype",
    "eligible_workers",
    "eligible_worker_threads",
    "is_possible",
    "queue_position",
    "wait_time",
    "ahead_wait",
    "horde_queue_position",
    "horde_wait_time",
    "fallback",
    "waiting",
    "processing",
    "finished",
    "restarted",
    "might_stall",
    "stall_evidence",
    "dispatch_opportunities",
    "lost_opportunities",
    "returned_capacity",
    "active_preceding_dispatches",
    "arriving_work",
    "returned_work",
)


@dataclass(frozen=True)
class EstimateOptions:
    """How :func:`vecsched.estimate` computes; validated once, here.

    Parameters
    ----------
    eligible_image_wait : bool, default False
        Give image requests the eligibility-aware ``queue_position``,
        ``wait_time`` and ``ahead_wait`` of text (SPEC section 5) instead of
        the horde-wide figures.
    """

    eligible_image_wait: bool = False
    # Per estimator name, what the service read from the stored pairs (docs/forecasts.md).
    calibration: Any = field(default=None, compare=False)
    # Request ids whose forecasts are not needed (the job's already recorded ones): left unknown.
    forecast_skip: Any = field(default=None, compare=False)
    # Estimators left out of the estimate's forecasts stage: the job runs them later, off its cycle,
    # on the inputs kept in ``Estimates.deferred`` (vecsched.service.replay_lane).
    defer: tuple[str, ...] = field(default=(), compare=False)
    # The job's last cycle's section 7 sums (vecsched.core.stall_cache.StallSums): those that still hold are
    # used again; a request's are computed again each ``stall_refresh`` seconds of its age (0: every cycle).
    stall_sums: Any = field(default=None, compare=False)
    stall_refresh: float = REFRESH_SECONDS

    def __post_init__(self) -> None:
        if not isinstance(self.eligible_image_wait, bool):
            raise TypeError("eligible_image_wait must be True or False")
        object.__setattr__(self, "stall_refresh", check_refresh(self.stall_refresh))
        if self.stall_sums is not None and not callable(getattr(self.stall_sums, "kept", None)):
            raise TypeError(f"stall_sums must be the StallSums of an earlier estimate, not {type(self.stall_sums).__name__}")


@dataclass(frozen=True)
class QueueSignatures:
    """What the batch learnt about the queue of one gentype that a prospective answer reuses.

    Attributes
    ----------
    rows : ndarray
        Positions (in the estimate's waiting requests) of this gentype's requests.
    signature : ndarray
        Each of those requests' (merged) signature.
    n_signatures : int
        How many signatures there are.
    class_rows : ndarray of uint64
        Per worker take class, the signatures it could take (64-bit words).
    worker_class : ndarray
        The take class of each usable worker of the gentype, in worker row order.
    """

    rows: np.ndarray
    signature: np.ndarray
    n_signatures: int
    class_rows: np.ndarray
    worker_class: np.ndarray


@dataclass(frozen=True)
class CompetitionState:
    """The batch's intermediate results a prospective answer is built from, typed.

    Attributes
    ----------
    workers : WorkerArrays
        Every worker's gate inputs, as the batch derived them.
    users : ndarray
        User names by the codes ``workers.user`` holds.
    priority, jobs, output : ndarray
        Per waiting request (aligned with the estimates): its extra priority,
        its jobs left and the output of one job (tokens or pixel-steps).
    by_gentype : dict of str to QueueSignatures
        One entry per gentype with eligibility-aware figures.
    """

    workers: WorkerArrays
    users: np.ndarray
    priority: np.ndarray
    jobs: np.ndarray
    output: np.ndarray
    by_gentype: dict[str, QueueSignatures]


@dataclass(frozen=True)
class Estimates:
    """The figures of every waiting request of one snapshot.

    Arrays are aligned: entry ``k`` describes request ``request_id[k]``
    (row ``request_index[k]`` of the snapshot's request table). Waiting
    requests only, in snapshot order.

    Attributes
    ----------
    columns : dict of str to ndarray
        One array per name in :data:`FIELDS` (``gentype`` as ``int8`` codes;
        floats with ``NaN`` for unknown).
    horde : dict
        Horde-wide totals per gentype (SPEC section 6).
    timings : dict
        Seconds spent per stage of the computation.
    groups : dict
        How many request groups, worker groups and competition classes the
        grouping formed.
    competition : CompetitionState or None
        The batch's intermediate results a cycle publishes for prospective
        answers (:func:`vecsched.core.prospective.build_prospective_state`).
    """

    now: float
    request_id: np.ndarray
    request_index: np.ndarray
    columns: dict[str, np.ndarray]
    horde: dict[str, dict[str, float]]
    options: EstimateOptions = field(default_factory=EstimateOptions)
    timings: dict[str, float] = field(default_factory=dict)
    groups: dict[str, int] = field(default_factory=dict)
    rejected: tuple[RowError, ...] = ()
    competition: CompetitionState | None = field(default=None, repr=False, compare=False)
    # Estimator name -> vecsched.core.forecasts.Forecast (SPEC section 8).
    forecasts: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    # The forecasts stage's ForecastInputs when some estimator was deferred (``options.defer``), else None.
    deferred: Any = field(default=None, repr=False, compare=False)
    # Section 7's sums of this estimate's requests, to hand to the next cycle's (EstimateOptions.stall_sums).
    stall_sums: Any = field(default=None, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.request_id)

    def __getattr__(self, key: str) -> np.ndarray:
        columns = self.__dict__.get("columns", {})
        if key in columns:
            return columns[key]
        raise AttributeError(key)

    def to_frame(self) -> pd.DataFrame:
        """A DataFrame indexed by request id, one column per figure (NaN: unknown)."""
        data: dict[str, Any] = {}
        for name in FIELDS:
            values = self.columns[name]
            if name == "gentype":
                values = pd.Categorical.from_codes(values.astype(np.int64), categories=list(GENTYPES))
            elif name in EVIDENCE_FIELDS:
                values = pd.Categorical.from_codes(values.astype(np.int64), categories=list(EVIDENCE))
            data[name] = values
        for estimator, forecast in self.forecasts.items():
            for name in forecast.__dataclass_fields__:
                data[f"forecast.{estimator}.{name}"] = getattr(forecast, name)
        return pd.DataFrame(data, index=pd.Index(self.request_id, name="id"))

    def to_dict(self) -> dict[str, Any]:
        """The estimates document of SNAPSHOT_FORMAT.md, ready for ``json.dumps``."""
        names = list(FIELDS)
        cols: list[list[Any]] = []
        for name in names:
            values = self.columns[name]
            if name == "gentype":
                cols.append([GENTYPES[g] for g in values.tolist()])
            elif name in FLOAT_FIELDS:
                # Unknown, and the infinities JSON cannot carry (a speed of 5e-324), are null.
                cols.append([v if math.isfinite(v) else None for v in values.tolist()])
            elif name in EVIDENCE_FIELDS:
                cols.append(evidence_names(values))
            else:
                cols.append(values.tolist())
        estimates = {
            rid: dict(zip(names, row)) for rid, row in zip(self.request_id.tolist(), zip(*cols))
        }
        for k, entry in enumerate(estimates.values()):
            # An infinite p50 or p90 (the replay's "not within its horizon") is null in the document
            # alone: the recorded forecasts keep it, and are scored with it (a p90 of inf covers).
            entry["forecasts"] = {name: _finite(f.row(k)) for name, f in self.forecasts.items()}
        return {
            "format": FORMAT,
            "now": iso(self.now),
            "horde": _finite(self.horde),
            "estimates": estimates,
        }

    def to_json(self, path: str | os.PathLike[str] | None = None) -> str:
        """Serialise the estimates document; also write it to ``path`` if given."""
        text = json.dumps(self.to_dict(), separators=(",", ":"), allow_nan=False)  # RFC 8259 JSON only
        if path is not None:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text)
        return text


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float (NaN, the infinities) as None, through dicts and lists."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value

