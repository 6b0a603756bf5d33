"""What runs before step 1: ``pass_checks`` (what the passes refuse before Ray starts), ``node_check`` (every file,
asset and the checkpoint marker looked up on every node) and ``launch_errors`` (a refused launch in one line)."""
