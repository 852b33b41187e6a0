"""Shared by tests and scripts: text samples (text_samples.py) and seeded damage to checkpoint files (fuzzing/)."""
