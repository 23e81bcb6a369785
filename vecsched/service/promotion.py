"""The promotion verdict; lives in :mod:`vecsched.core.promotion` (pure), named here for the service."""

from vecsched.core.promotion import *  # noqa: F401,F403
from vecsched.core.promotion import FORMAT, format_table, promotion_document, read_promotion, store_verdict  # noqa: F401
