"""The models: the family table and one adapter per family, the generic path, model structure,
the hub cache, revisions and checkpoints, the embedded zoo and its corpora."""
