"""The horde at one instant: the column table every source is checked against,
and the :class:`Snapshot` its rows load into (JSON here, SQL in the service)."""
