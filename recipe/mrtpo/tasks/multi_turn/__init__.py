"""BFCL multi-turn: the trajectory record (:mod:`.trajectory`) the agent loop writes and the verifier reads."""
