"""Agent loops for verl 0.9.1's agent-loop registry (``verl.experimental.agent_loop``).

- :mod:`.bfcl_env`: BFCL v4 multi-turn's environment, without verl: a test entry read from a row, fresh
  backend instances per trajectory, the model's text decoded to BFCL call strings, calls executed under a
  time limit with BFCL's result strings.
- :mod:`.bfcl_process`: those backends in a child process of their own (killable, memory capped), the
  loop's default isolation;
- :mod:`.bfcl_loop`: the agent loop registered as ``bfcl_multi_turn`` (BFCL's inference protocol inside
  verl's Continuous Token rollout; ``docs/design.md`` §9).

Importing this package imports neither (``bfcl_loop`` pulls in verl's agent loop, Ray and Hydra).
"""
