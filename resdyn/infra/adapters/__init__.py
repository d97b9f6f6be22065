"""One module per decoder family added after the first eight (whose adapters live in
:mod:`resdyn.infra.arch`): each defines the family's :class:`resdyn.infra.arch.LayerSublayers`
subclass, named by the family's entry in :data:`resdyn.infra.families.FAMILIES`."""
