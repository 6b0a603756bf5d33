"""What every node must hold, and what happens where it does not: ``node_files`` (the data root and the asset root
every worker reads), ``checkpoint_shards`` (checkpoints across nodes: the shared-folder marker, the record of saves,
refused resumes), ``verdict`` (``NoVerdict``: a verifier that could not judge on this node; the row leaves the step).
Standard library only."""
