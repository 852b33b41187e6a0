"""Circuits between features: attribution graphs through the linearized model (graph.py), of transcoders that sae/
holds (transcoder_model.py, transcoder_files.py, replacement.py), pruned (prune.py), for circuit-tracer's viewer
(viewer.py) and a page of their own (page.py with graph.html)."""
