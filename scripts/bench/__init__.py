"""The benchmark's parts (python -m scripts.benchmark runs them): harness.py times and writes tables; engines.py asks
ours and Hugging Face's the same questions; each other module measures one part."""
