"""circuit-tracer's side of the circuits benchmark (scripts/bench/circuits.py), run in circuit-tracer's own venv, never
in ours: it loads the folder's GPT-2 (model/, as gpt2_numpy.save writes it) and transcoder set (transcoders/) as
scripts/fixtures/make_graph_reference.py does, then answers each line `run` on stdin with one `attribute()` of the
prompt (ids.npy), in batches of BATCH targets ranked after every QUEUE traced: it writes that graph's arrays to
theirs.npz, for the check that both graphs agree, and prints `seconds S`, the time of `attribute()` alone. It ends at
the end of stdin.

    PYTHONPATH=$PWD ../ref-ct/bin/python -m scripts.bench.circuit_tracer_peer FOLDER THREADS MAX_FEATURES BATCH QUEUE
"""
import sys
import time
from pathlib import Path

import numpy as np
import torch
import yaml
from circuit_tracer import attribute
from circuit_tracer.utils.hf_utils import load_transcoders

from scripts.fixtures.make_graph_reference import tl_model


def load(folder):  # -> the replacement model of folder's weights and transcoders
    read = yaml.safe_load((folder / "transcoders" / "config.yaml").read_text())
    read["transcoders"] = [str(folder / "transcoders" / file) for file in read["transcoders"]]
    transcoders = load_transcoders(read, device=torch.device("cpu"), lazy_encoder=False, lazy_decoder=False)
    return tl_model(folder / "model", transcoders)


def main(folder, threads, max_features, batch, queue):
    folder = Path(folder)
    torch.set_num_threads(int(threads))
    model = load(folder)
    ids = torch.from_numpy(np.load(folder / "ids.npy"))
    print("ready", flush=True)
    for line in sys.stdin:
        assert line.strip() == "run", line
        start = time.perf_counter()
        graph = attribute(ids, model, max_feature_nodes=int(max_features), batch_size=int(batch),
                          update_interval=int(queue) // int(batch))
        seconds = time.perf_counter() - start
        np.savez(folder / "theirs.npz", adjacency=graph.adjacency_matrix.numpy(),
                 selected_features=graph.selected_features.numpy(), active_features=graph.active_features.numpy(),
                 logit_token_ids=graph.logit_token_ids.numpy())
        del graph
        print(f"seconds {seconds}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
