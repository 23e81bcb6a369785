"""Where a cycle's figures go: one file per store (Redis in production, SQL when
embedded), each giving the guarantee of :class:`~vecsched.service.store.base.Store`."""
