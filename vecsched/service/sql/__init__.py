"""The horde in SQL: the tables (:mod:`.schema`), the set-based loader
(:mod:`.load`, with the PostgreSQL fast path in :mod:`.pg` and the generic path in
:mod:`.generic`) and snapshot import (:mod:`.transfer`)."""

from vecsched.service.sql.load import load_horde
from vecsched.service.sql.schema import (
    HORDE_TABLES,
    excluded_pairs,
    init_db,
    is_empty,
    make_engine,
    metadata,
    processing_gens,
    waiting_prompts,
    worker_models,
    workers,
    wp_allowed_workers,
    wp_models,
)
from vecsched.service.sql.transfer import import_snapshot

__all__ = [
    "HORDE_TABLES",
    "excluded_pairs",
    "import_snapshot",
    "init_db",
    "is_empty",
    "load_horde",
    "make_engine",
    "metadata",
    "processing_gens",
    "waiting_prompts",
    "worker_models",
    "workers",
    "wp_allowed_workers",
    "wp_models",
]
