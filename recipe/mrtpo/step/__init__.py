"""The training step in verl: ``trainer`` (verl's v1 sync trainer registered as ``mrtpo``, its old_log_prob and
advantage steps overridden), ``worker`` (verl's actor worker plus the replay and teacher passes), ``step_plan`` (what a
step does, decided at its start), ``replay_driver`` (the driver's side of a replay), ``step_metrics``,
``standing_step`` (the standing check's verl passes), ``dump`` (the relevance-dump schema)."""
