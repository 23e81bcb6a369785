"""The service around the core: SQL loading, the stores a cycle is published to,
the periodic job and the read side (status and prospective)."""
