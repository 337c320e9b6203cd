"""Layer 4, the facade: the :class:`~kernel.facade.kernel.Kernel` object, the factories that
build one, saving, notebooks and ``--db`` persistence (docs/architecture.md)."""
