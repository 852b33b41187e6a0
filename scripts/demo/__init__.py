"""The docs' demo: the Shakespeare model (train_shakespeare.sh), its loss curve, the explain page's screenshot."""
