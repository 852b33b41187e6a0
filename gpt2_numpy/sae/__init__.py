"""`python -m gpt2_numpy.sae` runs the sae command (gpt2_numpy/commands/sae.py); the SAE itself lives in
gpt2_numpy/interpret/sae.py, its files in interpret/sae_files.py, and load_sae is kept importable from here."""
from gpt2_numpy.interpret.sae_files import load_sae, save_sae

__all__ = ["load_sae", "save_sae"]

if __name__ == "__main__":
    from gpt2_numpy.commands.sae import main

    main()
