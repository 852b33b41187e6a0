"""`python -m gpt2_numpy.download SIZE` runs the download command (gpt2_numpy/commands/download.py); the HTTP fetching
lives in gpt2_numpy/fetch.py, and making a model folder ready in gpt2_numpy/loading.py."""
from gpt2_numpy.fetch import fetch_all

__all__ = ["fetch_all"]

if __name__ == "__main__":
    from gpt2_numpy.commands.download import main

    main()
