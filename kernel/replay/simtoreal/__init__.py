"""Scoring the serving replay against the sim-to-real study's measured vLLM serving runs
(issue 29 item 5): the study's tables, the experiment catalogue, the metrics computed the way
the study computes them, the comparison beside the study's six simulators, and the runs."""
