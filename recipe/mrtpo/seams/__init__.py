"""What the recipe relies on of verl and other third-party code, pinned: ``verl_seam`` (the only lines re-stated from
verl's step, guarded by hashes of verl's source) and ``source_pins`` (the one reader and hasher of pinned sources)."""
