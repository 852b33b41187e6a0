"""The two engines of the benchmark, asked the same questions: gpt2_numpy's tuned pass, and Hugging Face's
GPT2LMHeadModel on the same weights (its default sdpa attention, as many torch threads as NumPy's BLAS uses)."""
import time

import numpy as np

from gpt2_numpy import fast as model
from gpt2_numpy.generate import generate_batch
from scripts.bench.harness import HF, OURS, blas_threads

INSTALL_HF = "pip install torch==2.13.0 transformers safetensors"


class Ours:
    name = OURS

    def __init__(self, params, n_head):
        self.params, self.n_head = model.inference_layout(params), n_head  # as gpt2_numpy.load_model gives them

    def step(self, ids, cache):  # -> logits of the last position, and the cache
        return model.gpt2_cached(ids, cache, **self.params, n_head=self.n_head, last_only=True)

    def new_cache(self):
        return model.new_cache(self.params["wpe"], self.params["blocks"], self.n_head)

    def prefill(self, ids, last_only):  # no KV cache, as HF's prefill runs with use_cache=False
        return model.gpt2(ids, **self.params, n_head=self.n_head, last_only=last_only)

    def decode_step(self, ids):  # -> step(): one cached step after ids, the cache growing by a position each call
        cache = self.step(ids, self.new_cache())[1]
        return lambda: self.step([1], cache)

    def batch_step(self, rows):  # -> step(): one cached step of a batch, after its prompts ([n_rows, n] ids)
        cache = model.new_cache(self.params["wpe"], self.params["blocks"], self.n_head, pad=np.zeros(len(rows), int))
        cache = self.step(np.array(rows), cache)[1]
        return lambda: self.step(np.ones((len(rows), 1), np.int64), cache)

    def decode_seconds(self, ids, n_new):  # -> seconds for n_new greedy steps after an untimed prefill
        logits, cache = self.step(ids, self.new_cache())
        start = time.perf_counter()
        for _ in range(n_new):
            logits, cache = self.step([int(np.argmax(logits[-1]))], cache)
        return time.perf_counter() - start

    def decode_uncached_seconds(self, ids, n_new):
        ids, start = list(ids), time.perf_counter()
        for _ in range(n_new):
            ids.append(int(np.argmax(model.gpt2(ids, **self.params, n_head=self.n_head)[-1])))
        return time.perf_counter() - start

    def batch_seconds(self, prompts, n_new):  # -> seconds for greedy generation of n_new ids for every prompt
        start = time.perf_counter()
        generate_batch(prompts, self.params, self.n_head, n_new, stop_at_eos=False)
        return time.perf_counter() - start


class HuggingFace:
    name = HF

    def __init__(self, params, hparams):  # ImportError naming what is missing without torch or transformers
        from scripts.fixtures.make_reference import MISSING, hf_model

        if MISSING:
            raise ImportError(MISSING)
        import torch

        torch.set_num_threads(blas_threads())
        self.torch, self.model = torch, hf_model(hparams, params, attn_implementation="sdpa")  # HF's default

    def run(self, ids, **kwargs):  # ids: one sequence
        return self.run_rows(self.torch.tensor([ids]), **kwargs)

    def run_rows(self, ids, **kwargs):  # ids: a [n_rows, n] tensor
        with self.torch.no_grad():
            return self.model(ids, **kwargs)

    def prefill(self, ids, last_only):
        return self.run(ids, use_cache=False, logits_to_keep=1 if last_only else 0).logits

    def decode_step(self, ids):  # -> step(): as Ours.decode_step (HF's DynamicCache grows in place)
        cache = self.run(ids, use_cache=True, logits_to_keep=1).past_key_values
        return lambda: self.run([1], past_key_values=cache, use_cache=True, logits_to_keep=1)

    def batch_step(self, rows):  # -> step(): as Ours.batch_step
        cache = self.run_rows(self.torch.tensor(rows), use_cache=True, logits_to_keep=1).past_key_values
        ones = self.torch.ones((len(rows), 1), dtype=self.torch.long)
        return lambda: self.run_rows(ones, past_key_values=cache, use_cache=True, logits_to_keep=1)

    def decode_seconds(self, ids, n_new):
        out = self.run(ids, use_cache=True, logits_to_keep=1)
        start = time.perf_counter()
        for _ in range(n_new):
            next_id = int(out.logits[0, -1].argmax())
            out = self.run([next_id], past_key_values=out.past_key_values, use_cache=True, logits_to_keep=1)
        return time.perf_counter() - start

    def decode_uncached_seconds(self, ids, n_new):
        ids, start = list(ids), time.perf_counter()
        for _ in range(n_new):
            ids.append(int(self.run(ids, use_cache=False, logits_to_keep=1).logits[0, -1].argmax()))
        return time.perf_counter() - start

    def batch_seconds(self, prompts, n_new):  # HF's batched generate: left padding and an attention mask
        width = max(map(len, prompts))
        ids = self.torch.tensor([[0] * (width - len(p)) + list(p) for p in prompts])
        mask = self.torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        start = time.perf_counter()
        with self.torch.no_grad():
            self.model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=n_new, min_new_tokens=n_new,
                                pad_token_id=0)
        return time.perf_counter() - start
