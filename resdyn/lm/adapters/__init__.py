"""One module per decoder-layer adapter: each defines a :class:`resdyn.lm.sublayers.LayerSublayers`
subclass, named by its families' entries in :data:`resdyn.lm.families.FAMILIES`."""
