from gpt2_numpy.explain.cli import main

main()
