"""Circuits between features: transcoders (transcoders.py: the math and circuit-tracer's transcoder-set folders),
spliced in as MLP replacements (replacement.py), and attribution graphs through the linearized model (graph.py)."""
