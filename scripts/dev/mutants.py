"""Plausible bugs in the math, downloading, training and the commands, each applied alone to a copy of the repo: the
tests that catch it.

    python -m scripts.dev.mutants [--only PARTS] [TEST_FILE ...]

Every mutant must be caught. The test files that catch each part (the word before each mutant's colon):

    model,fast,cores (default)  tests/unit/test_model.py tests/unit/test_fast.py tests/unit/test_cores.py
    backward                    tests/unit/test_fast_backward.py
    train,commands,optim,save   tests/cli/test_train_resume.py tests/cli/test_train_vocab.py tests/unit/test_optim.py
    commands                    tests/cli/test_commands.py
    intervene                   tests/unit/test_edits.py
    gradients                   tests/unit/test_gradients.py
    "attribution patching"      tests/unit/test_attribution_patching.py
    download                    tests/unit/test_fetch.py tests/unit/test_loading.py tests/unit/test_locks.py
    sampling,decode,tokenizer   tests/unit/test_sampling.py tests/unit/test_decode.py tests/cli/test_tokenizer.py
    vocabulary,score,checkpoint  tests/unit/test_tokenizer.py tests/unit/test_checkpoint.py tests/unit/test_tracing.py
    explain                     tests/unit/test_tracing.py tests/unit/test_heads.py
    "explain page"              tests/unit/test_page.py
    threads                     tests/unit/test_cores_threads.py
    sae                         tests/unit/sae/test_model.py tests/unit/sae/test_files.py tests/unit/test_names.py
    sae                         tests/unit/sae/test_features.py tests/cli/test_sae_latents.py
    sae                         tests/unit/sae/test_evaluation.py tests/cli/test_sae_commands.py
    sae                         tests/unit/sae/test_page.py tests/unit/sae/test_training.py
    sae                         tests/unit/sae/test_releases.py tests/cli/test_sae_release_commands.py
    paths                       tests/cli/test_common.py

for example `python -m scripts.dev.mutants --only download tests/unit/test_fetch.py tests/unit/test_loading.py
tests/unit/test_locks.py`. A test earns its place by failing
when the code is wrong; a mutant that no test catches is a hole in the suite. Each mutant replaces one line's text; the
copy lives in a temporary folder, so the working tree is never touched. Arguments after `--` go to pytest: `python -m
scripts.dev.mutants -- -x -m "not slow" tests` tries every mutant on the quick lane, stopping at its first failure.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PATCHING_GRADIENTS = "gpt2_numpy/interpret/attribution_patching.py"
MUTANTS = [  # (what, file, text, replacement)
    ("model: scores / d, not / √d", "gpt2_numpy/model.py", "/ math.sqrt(q.shape[-1])", "/ q.shape[-1]"),
    ("model: softmax without the max shift", "gpt2_numpy/model.py",
     "np.exp(x - np.max(x, axis=-1, keepdims=True))", "np.exp(x)"),
    ("model: layer_norm eps 1e-3", "gpt2_numpy/model.py", "eps=1e-5):", "eps=1e-3):"),
    ("model: gelu 0.04 for 0.044715", "gpt2_numpy/model.py", "(x + 0.044715 * x**3)", "(x + 0.04 * x**3)"),
    ("model: the mask hides the diagonal", "gpt2_numpy/model.py", "dtype=np.float32), k=1)", "dtype=np.float32), k=0)"),
    ("model: merge_heads without the swap", "gpt2_numpy/model.py", "    x = np.swapaxes(x, -3, -2)\n", ""),
    ("fast: no division by the row sums", "gpt2_numpy/fast.py", "    out /= weights.sum(axis=-1, keepdims=True)\n", ""),
    ("fast: the scores transposed", "gpt2_numpy/fast.py", 'einsum("...kd,...qd->...qk"', 'einsum("...kd,...qd->...kq"'),
    ("fast: gelu constant 0.04", "gpt2_numpy/fast.py", "-2 * GELU_SCALE * 0.044715)", "-2 * GELU_SCALE * 0.04)"),
    ("fast: a query block sees one key too few", "gpt2_numpy/fast.py",
     "seen = k.shape[-2] - q.shape[-2] + queries.stop", "seen = k.shape[-2] - q.shape[-2] + queries.stop - 1"),
    ("fast: padding positions off by one", "gpt2_numpy/fast.py", "np.arange(n_past, n_past + n_seq) - pad[:, None], 0)",
     "np.arange(n_past, n_past + n_seq) - pad[:, None] + 1, 0)"),
    ("fast: a few rows' product skips its first piece", "gpt2_numpy/fast.py",
     "for start in range(0, len(w_t), step):", "for start in range(step, len(w_t), step):"),
    ("fast: a few rows' product without the bias", "gpt2_numpy/fast.py",
     "np.add(few_rows_product(rows, w.T), b,", "np.add(few_rows_product(rows, w.T), 0 * b,"),
    ("threads: each thread adds the first columns' bias", "gpt2_numpy/cores.py", "out[part] += bias[part[1]]",
     "out[part] += bias[: len(bias[part[1]])]"),
    ("threads: a product by its inner axis drops its last partial", "gpt2_numpy/cores.py",
     "for start in sorted(partials)[1:]:", "for start in sorted(partials)[1:-1]:"),
    ("fast: each part of attention's queries one query short", "gpt2_numpy/fast.py",
     "queries = slice(bounds[piece.start], bounds[piece.stop])",
     "queries = slice(bounds[piece.start], bounds[piece.stop] - 1)"),
    ("fast: inference_layout leaves mlp.c_proj.w row-major", "gpt2_numpy/fast.py", 'np.asfortranarray(c_proj["w"])',
     'c_proj["w"]'),
    ("fast: a long pass runs GELU's chunks on one thread", "gpt2_numpy/fast.py",
     "    cores.split(run, flat_out.size, item_size=1)\n", "    run(slice(0, flat_out.size))\n"),
    ("cores: a piece runs outside the caller's np.errstate", "gpt2_numpy/cores.py",
     "submit(contextvars.copy_context().run, work, piece)", "submit(work, piece)"),
    ("cores: the last piece one item short", "gpt2_numpy/cores.py",
     "bounds = [n_items * i // n_threads for i in range(n_threads + 1)]",
     "bounds = [n_items * i // n_threads for i in range(n_threads)] + [n_items - 1]"),
    ("cores: OpenBLAS keeps its threads during a pass", "gpt2_numpy/cores.py", "                blas[0](1)\n", ""),
    ("cores: OpenBLAS's threads not restored", "gpt2_numpy/cores.py",
     'blas[0](passes["n_threads"])', "pass"),
    ("cores: a forked child keeps its parent's pool", "gpt2_numpy/cores.py",
     "    pool.update(size=0, executor=None)  # the parent's pool", "    pass  # the parent's pool"),
    ("cores: the first of two passes to end restores OpenBLAS's threads", "gpt2_numpy/cores.py",
     'passes["running"] -= 1\n                if passes["running"] == 0:',
     'passes["running"] -= 1\n                if True:'),
    ("cores: a forked child keeps its parent's lock", "gpt2_numpy/cores.py",
     "    passes_lock = threading.Lock()\n", ""),
    ("cores: a forked child keeps the count a parent's pass set", "gpt2_numpy/cores.py",
     'openblas()[0](passes["n_threads"])', "pass"),
    ("cores: a forked child restores the count only for a counted pass", "gpt2_numpy/cores.py",
     '(passes["running"] > own or passes_lock.locked())', 'passes["running"] > own'),
    # caught by tests/unit/test_cores_threads.py (threads)
    ("threads: a few rows' product at 2 OpenBLAS threads computes one thread's width of each piece",
     "gpt2_numpy/fast.py", "np.matmul(w_t[start : start + step], rows.T, out=out_t[start : start + step])",
     "np.matmul(w_t[start : start + FEW_ROWS_PIECE], rows.T, out=out_t[start : start + FEW_ROWS_PIECE])"),
    ("threads: blas_threads with no OpenBLAS found", "gpt2_numpy/cores.py", "return blas[1]() if blas else 1",
     "return blas[1]()"),
    ("threads: set_threads with no OpenBLAS found", "gpt2_numpy/cores.py",
     "        if blas is None:\n            return\n", ""),
    # their tests are in tests/unit/test_fetch.py, test_loading.py and test_locks.py, not among the default TEST_FILEs
    # the SAE's: tests/unit/sae/ tests/unit/test_names.py tests/cli/test_sae_commands.py
    # tests/cli/test_sae_latents.py, not among the default TEST_FILEs
    ("sae: the input not centred by b_dec", "gpt2_numpy/sae/model.py",
     "return (x - b_dec * apply_b_dec_to_input) @ W_enc + b_enc", "return x @ W_enc + b_enc"),
    ("sae: jumprelu fires at its threshold too", "gpt2_numpy/sae/model.py", "(pre > threshold)",
     "(pre >= threshold - 1e-3)"),
    ("sae: the L1 penalty not weighted by the decoder norms", "gpt2_numpy/sae/model.py",
     "np.abs(f) * decoder_norms(W_dec)", "np.abs(f)"),
    ("sae: AuxK's scale never below 1", "gpt2_numpy/sae/model.py", "min(n_dead / (d_in // 2), 1.0)", "1.0"),
    ("sae: resid_pre of layer L read as layer L's out", "gpt2_numpy/interpret/names.py",
     'return "embed" if layer == 0 else f"blocks.{layer - 1}.out"', 'return f"blocks.{layer}.out"'),
    ("sae: a latent that fired still counted as idle", "gpt2_numpy/sae/training.py",
     '            since_fired[stats["fired"]] = 0\n', ""),
    ("sae: loss recovered over L_clean, not L_zero - L_clean", "gpt2_numpy/sae/metrics.py",
     "(zeroed - with_sae) / (zeroed - clean) if", "(zeroed - with_sae) / (clean or 1) if"),
    ("sae: an ablated latent's share added, not taken out", "gpt2_numpy/sae/features.py",
     'return x - f @ sae.params["W_dec"][latents]', 'return x + f @ sae.params["W_dec"][latents]'),
    ("sae: steering ignores its scale", "gpt2_numpy/sae/features.py",
     'sum(scale * sae.params["W_dec"][latent] for', 'sum(sae.params["W_dec"][latent] for'),
    # issue 54's: each fix of the SAE's training, eval and files undone
    ("sae: a resume from another model of the same width goes on", "gpt2_numpy/commands/sae.py",
     'if source.model_name is not None and saved["seq_len"] is not None and other:', "if False:"),
    ("sae: a resume compares the --model given, not the weights", "gpt2_numpy/commands/sae.py",
     'saved.get("model_sha256") != source.model_digest if saved.get("model_sha256")', "True if False"),
    ("sae: a resume from activations of another width goes on", "gpt2_numpy/commands/sae.py",
     'if saved["d_in"] != source.d_in:', "if False:"),
    ("sae: attn.scores and attn.weights taken as an SAE's hook", "gpt2_numpy/sae/activations.py",
     'if step_of(hook) in ("attn.scores", "attn.weights"):', "if False:"),
    ("sae: loss recovered divides by an unchanged loss", "gpt2_numpy/sae/metrics.py",
     " if zeroed != clean else None", ""),
    ("sae: an empty .npy file unchecked", "gpt2_numpy/sae/activations.py", "except (ValueError, EOFError):",
     "except ValueError:"),
    ("sae: a truncated train_state.npz unchecked", "gpt2_numpy/sae/training.py",
     "TypeError, zipfile.BadZipFile) as error:", "TypeError) as error:"),
    ("sae: the AuxK loss for an activation of one number", "gpt2_numpy/sae/model.py",
     " and d_in // 2 > 0", ""),
    ("sae: cfg.json read whatever it is", "gpt2_numpy/sae/files.py",
     "parse_json(read_regular(path, SETTINGS_LIMIT))", "parse_json(path.read_bytes())"),
    ("sae: cfg.json read at any size", "gpt2_numpy/sae/files.py",
     "parse_json(read_regular(path, SETTINGS_LIMIT))", "parse_json(read_regular(path, 2**40))"),
    ("sae: train's --seq-len over the context cut to it", "gpt2_numpy/commands/sae.py",
     "if args.seq_len is not None and args.seq_len > n_ctx:", "if False:"),
    ("sae: a non-finite row named by its piece's first", "gpt2_numpy/sae/activations.py",
     "f\"{start + int(np.argmax(bad)):,}): fix the file\")", "f\"{start:,}): fix the file\")"),
    ("sae: eval's --hook ignored", "gpt2_numpy/commands/sae.py", "    return saved or hook\n", "    return saved\n"),
    ("sae: a misspelt subcommand gets no guess", "gpt2_numpy/commands/sae.py",
     '        given += "".join(f" (did you mean {guess}?)" for guess in guesses)\n', ""),
    ("sae: the benchmark says install sae-lens when it is installed", "scripts/bench/sae.py",
     'if theirs not in seconds and importlib.util.find_spec("sae_lens") is not None:', "if False:"),
    ("sae: a latent's idle count counts steps", "gpt2_numpy/sae/training.py", "since_fired += len(x)",
     "since_fired += 1"),
    ("sae: a latent dead only past DEAD_AFTER", "gpt2_numpy/sae/training.py", "since_fired >= DEAD_AFTER)",
     "since_fired > DEAD_AFTER)"),
    ("sae: a save cut after its weights settled as GPT-2's", "gpt2_numpy/commands/sae.py",
     "lock.enter_context(claimed(out, args.resume, SAE_ORDER))", "lock.enter_context(claimed(out, args.resume))"),
    ("sae: --resume keeps the saved --save-every", "gpt2_numpy/commands/sae.py",
     '"steps": args.steps, "save_every": args.save_every})', '"steps": args.steps})'),
    ("sae: eval's targets the inputs", "gpt2_numpy/sae/evaluation.py",
     "inputs, targets = window[:-1], window[1:]", "inputs, targets = window[:-1], window[:-1]"),
    ("sae: eval's dead latents from the last window", "gpt2_numpy/sae/evaluation.py",
     "    density = feature_density(f)\n", "    density = feature_density(rows[-1][2])\n"),
    ("sae: TransformerLens's mlp.hook_post read as mlp.out", "gpt2_numpy/interpret/names.py",
     '"mlp.hook_post": "mlp.hidden"', '"mlp.hook_post": "mlp.out"'),
    ("sae: an SAE at attn.z writes no hook_z reshape", "gpt2_numpy/sae/files.py",
     '"reshape_activations": "hook_z" if hook and hook.endswith(".attn.z") else "none",',
     '"reshape_activations": "none",'),
    ("sae: a cfg.json without apply_b_dec_to_input leaves x uncentred", "gpt2_numpy/sae/model.py",
     'bool(cfg.get("apply_b_dec_to_input", True))', 'bool(cfg.get("apply_b_dec_to_input"))'),
    ("sae: a latent given twice passes when it is latent 0", "gpt2_numpy/sae/features.py",
     "    if twice is not None:  # more likely a typo for another latent", "    if twice:  # more likely a typo"),
    ("sae: rescale_acts_by_decoder_norm folded into a standard SAE too", "gpt2_numpy/sae/files.py",
     'if cfg["architecture"] == "topk" and cfg.get("rescale_acts_by_decoder_norm"):',
     'if cfg.get("rescale_acts_by_decoder_norm"):'),
    ("sae: an edit at a per-head hook applied to the heads unmerged", "gpt2_numpy/sae/activations.py",
     "return lambda array: rows_back(function(hook_rows(array, hook)), array, hook)",
     "return lambda array: function(array)"),
    ("sae: the page's logit table drawn for any hook", "gpt2_numpy/sae/page.py",
     "    no_logits = no_direct_effect(sae.hook)", "    no_logits = None"),
    ("sae: a steered row's overflow judged by the scale alone", "gpt2_numpy/sae/features.py",
     "if not abs(scale) * norm < FLOAT32_MAX:", "if not abs(scale) < FLOAT32_MAX:"),
    ("sae: --steer 1_0:2 read as latent 10", "gpt2_numpy/commands/explain.py", 'or "_" in text or', "or"),
    ("sae: the page draws latents that never fire", "gpt2_numpy/sae/features.py",
     "return [int(latent) for latent in order[:count] if fired[latent] > 0]",
     "return [int(latent) for latent in order[:count]]"),
    # issue 56's: SAELens's releases by name, the activation each reads, SAELens's metrics
    ("sae: a released residual SAE reads the raw activation, not centred", "gpt2_numpy/sae/processing.py",
     'center = flags["center_writing_weights"] and', "center = False and"),
    ("sae: a hook_z release reads z with its value bias", "gpt2_numpy/sae/processing.py",
     'value_bias = flags["fold_value_biases"] and step in VALUE_STEPS', "value_bias = False"),
    ("sae: the value bias without ln_1's bias, which fold_ln moved into it", "gpt2_numpy/sae/processing.py",
     'bias = block["ln_1"]["b"] @ c_attn["w"][:, 2 * n_embd:] if fold_ln else 0', "bias = 0"),
    ("sae: SAELens's layer_norm with the biased std", "gpt2_numpy/sae/processing.py", "ddof=1", "ddof=0"),
    ("sae: SAELens's layer_norm with epsilon in the variance", "gpt2_numpy/sae/processing.py",
     "centred / (sigma + LN_EPS)", "centred / np.sqrt(sigma**2 + LN_EPS)"),
    ("sae: a layer_norm SAE's output not scaled back", "gpt2_numpy/sae/processing.py",
     "return self.decode(super().encode(normed)) * sigma + mu", "return self.decode(super().encode(normed)) + mu"),
    ("sae: a splice drops what model_activation took out", "gpt2_numpy/sae/processing.py",
     "return self.forward(a) + (x - a)", "return self.forward(a)"),
    ("sae: the zero baseline zeroes our array, not the SAE's activation", "gpt2_numpy/sae/activations.py",
     "at_hook(lambda rows: rows - model_activation(sae, rows), sae.hook))", "np.zeros_like)"),
    ("sae: the norm scaling factor not folded in", "gpt2_numpy/sae/processing.py",
     "params = fold_norm_scaling(params, norm_scaling_factor)", "params = params"),
    ("sae: a pre-6.0 topk cfg read as standard", "gpt2_numpy/sae/processing.py",
     'cfg.update(architecture="topk", k=kwargs["k"])', 'cfg.update(k=kwargs["k"])'),
    ("sae: TransformerLens's hook_normalized read after the gain", "gpt2_numpy/interpret/names.py",
     '"ln1.hook_normalized": "ln_1.normalized"', '"ln1.hook_normalized": "ln_1"'),
    ("sae: an edited ln_1.normalized not carried into ln_1", "gpt2_numpy/interpret/tracing.py",
     'layer_norm(x, **norm) if kept is normalized else norm["g"] * kept + norm["b"]', "layer_norm(x, **norm)"),
    ("sae: a release's files cached by their base names, one id's cfg.json taken for another's",
     "gpt2_numpy/sae/releases.py", "(path, folder / local_name(path))", "(path, folder / PurePosixPath(path).name)"),
    ("sae: the .pt reader builds whatever the pickle names", "gpt2_numpy/formats/torch_zip.py",
     '        raise CheckpointError(f"{self.path}: its pickle names',
     '        return super().find_class(module, name)\n        raise CheckpointError(f"{self.path}: its pickle names'),
    ("sae: KL(edited ‖ clean), not KL(clean ‖ edited)", "gpt2_numpy/sae/metrics.py",
     "np.sum(np.exp(clean) * (clean - edited), axis=-1)", "np.sum(np.exp(edited) * (edited - clean), axis=-1)"),
    ("sae: explained variance about zero, not the mean", "gpt2_numpy/sae/metrics.py",
     " - np.sum(x.mean(axis=0) ** 2)", ""),
    ("sae: the relative reconstruction bias upside down", "gpt2_numpy/sae/metrics.py",
     '"relative_reconstruction_bias": ratio(np.mean(norm_out**2), np.mean(np.sum(x * x_hat, axis=-1)))',
     '"relative_reconstruction_bias": ratio(np.mean(np.sum(x * x_hat, axis=-1)), np.mean(norm_out**2))'),
    ("sae: the l2 ratio inverted", "gpt2_numpy/sae/metrics.py",
     "np.mean(norm_out / np.where(np.abs(norm_in) < 1e-4, 1, norm_in))",
     "np.mean(norm_in / np.where(np.abs(norm_out) < 1e-4, 1, norm_out))"),
    ("sae: a layer-normalising SAE's latent ablated without σ", "gpt2_numpy/sae/processing.py",
     "        return layer_norm(sae.model_activation(np.asarray(x, dtype=np.float32)))[2]", "        return 1"),
    ("sae: a release's latents linked to no Neuronpedia page", "gpt2_numpy/sae/releases.py",
     'page = metadata.get("neuronpedia_id")', "page = None"),
    ("sae: latents of --latents that never fire drawn unsaid", "gpt2_numpy/commands/sae.py",
     '    silent = [latent["id"] for latent in data["latents"] if latent["fired"] == 0]', "    silent = []"),
    ("sae: a model folder taken for an SAE run's --out and back", "gpt2_numpy/runs.py",
     "found = folder_kind(out) if names and kind else None", "found = None"),
    ("sae: an SAE folder loaded as a model", "gpt2_numpy/loading.py", 'if folder_kind(folder) == "sae":',
     "if False:"),
    ("intervene: a mean ablation's windows as long as the prompt", "gpt2_numpy/commands/explain.py",
     'return reference_windows(token_ids, hparams["n_ctx"])', "return reference_windows(token_ids, n_seq)"),
    ("paths: --out '~/x' makes a folder named ~", "gpt2_numpy/commands/common.py", "return Path(text).expanduser()",
     "return Path(text)"),
    ("download: the SHA-256 compared on its first 32 digits", "gpt2_numpy/fetch.py", "if actual == digest:",
     "if actual[:32] == digest[:32]:"),
    ('download: a weak X-Linked-Etag (W/"...") leaves the file unchecked', "gpt2_numpy/fetch.py",
     '.removeprefix("W/")', ""),
    ("train: each epoch ends one window early", "gpt2_numpy/training.py", "if self.position == self.n_windows:",
     "if self.position == self.n_windows - 1:"),
    ("train: the windows seq_len + 1 tokens apart, a token between two never an input", "gpt2_numpy/tokenizer.py",
     "width)[::seq_len]", "width)[::width]"),
    ("train: resume restores the data order but not its RNG", "gpt2_numpy/training.py",
     '        self.rng.bit_generator.state = json.loads(str(state["data_rng"]))\n', ""),
    ("train: no validation loss at a last step off --eval-every", "gpt2_numpy/training.py",
     "evaluated = step % settings.eval_every == 0 or step == steps", "evaluated = step % settings.eval_every == 0"),
    ("train: the schedule one step ahead", "gpt2_numpy/training.py", "lr = learning_rate(step, ",
     "lr = learning_rate(step + 1, "),
    ("train: validation windows one token short", "gpt2_numpy/training.py",
     "token_windows(val, seq_len, n_windows, targets=True)", "token_windows(val, seq_len, n_windows)"),
    ("train: the fewest tokens counted for the training part only", "gpt2_numpy/training.py",
     "while min(split_sizes(n_tokens, val_fraction)) < window:",
     "while split_sizes(n_tokens, val_fraction)[0] < window:"),
    ("train: a saved moment's shape unchecked", "gpt2_numpy/runs.py",
     "if name not in state or state[name].shape != param.shape or", "if name not in state or"),
    ("train: data_position's upper bound unchecked", "gpt2_numpy/runs.py", "if not 0 <= position <= len(order):",
     "if not 0 <= position:"),
    ("train: data_rng unchecked", "gpt2_numpy/runs.py",
     '        np.random.PCG64().state = parse_json(str(state["data_rng"]))', "        pass"),
    ("train: a truncated train_state.npz unchecked", "gpt2_numpy/runs.py",
     "except (OSError, EOFError, ValueError, zipfile.BadZipFile) as error:",
     "except (OSError, EOFError, ValueError) as error:"),
    ("train: log.csv's steps unchecked", "gpt2_numpy/runs.py", 'if not str(row.get("step")).isdecimal():',
     "if False:"),
    ("train: log.csv's rows with more fields than columns unchecked", "gpt2_numpy/runs.py",
     "if None in row:", "if False:"),
    ("train: heads.csv scores another probe than explain --heads draws", "gpt2_numpy/training.py",
     "PROBE_SEED = 0 ", "PROBE_SEED = 1 "),
    ("train: heads.csv's rows past the save kept on --resume", "gpt2_numpy/runs.py",
     'rows = [row for row in read_log(path) if int(row["step"]) <= step]',
     'rows = [row for row in read_log(path) if name == LOG or int(row["step"]) <= step]'),
    ("train: a Ctrl-C in the last step asks for --resume", "gpt2_numpy/training.py",
     "if stop.requested and step < steps:", "if stop.requested:"),
    ("train: a Ctrl-C stops a run started with SIGINT ignored", "gpt2_numpy/training.py",
     "    if previous is signal.SIG_IGN:  # e.g.", "    if False:  # e.g."),
    ("train: a resumed run keeps its weights file mapped", "gpt2_numpy/commands/train.py",
     "    params = map_leaves(np.array, params)\n", "    loaded, params = params, map_leaves(np.array, params)\n"),
    ("train: --vocab-size 257 loads a vocabulary from --out", "gpt2_numpy/commands/train.py",
     "own = merges is not None", "own = bool(merges)"),
    ("download: a marker holding a list or null is a traceback", "gpt2_numpy/loading.py",
     "except (OSError, ValueError, KeyError, TypeError):  # no marker",
     "except (OSError, ValueError, KeyError):  # no marker"),
    ("download: the read-only folder's hint leaves its --models-dir unquoted", "gpt2_numpy/loading.py",
     "--models-dir {shlex.quote(str(folder.parent))}", "--models-dir {folder.parent}"),
    ("commands: stdin's '-' taken for a text that begins with '-'", "gpt2_numpy/commands/common.py",
     'if word.startswith("-") and word != "-" and not', 'if word.startswith("-") and not'),
    ("download: a waiter keeps a lock file its holder deleted", "gpt2_numpy/locks.py",
     "if os.path.samestat(os.fstat(lock.fileno()), os.stat(path)):", "if True:"),
    ("download: a failed first download leaves its folders", "gpt2_numpy/disk.py",
     "                path.rmdir()  # only an empty folder goes", "                pass"),
    ("train: loss_and_grads takes targets of another shape", "gpt2_numpy/fast_backward.py",
     "if targets.shape != inputs.shape:", "if False:"),
    ("sampling: a [1, n_vocab] row taken as one position's logits", "gpt2_numpy/sampling.py",
     'if logits.ndim != 1 or logits.size == 0 or logits.dtype.kind != "f":',
     'if logits.size == 0 or logits.dtype.kind != "f":'),
    ("decode: GPT-2's 50256 ends every model's continuation", "gpt2_numpy/decode.py",
     'return len(params["wte"]) - 1 if eos_id is None else eos_id', "return 50256 if eos_id is None else eos_id"),
    ("tokenizer: a write cut between the two names leaves vocab.json", "gpt2_numpy/commands/tokenizer.py",
     "                        (out / name).unlink()", "                        pass"),
    ("train: --resume refuses a flag equal to the saved run's", "gpt2_numpy/commands/train.py",
     "if value is not None and value != saved.get(name):", "if value is not None:"),
    ("train: --init DIR trains a new model", "gpt2_numpy/commands/train.py",
     "    if args.init is not None:  # a model folder", "    if False:  # a model folder"),
    ("commands: abbreviated flags accepted", "gpt2_numpy/commands/common.py",
     "super().__init__(*args, allow_abbrev=False, **", "super().__init__(*args, **"),
    # caught by tests/unit/test_edits.py (the math, and TransformerLens's numbers)
    ("intervene: an attribution term not centred as ln_f centres the stream", "gpt2_numpy/interpret/attribution.py",
     "return g * (part - part.mean()) / sigma", "return g * part / sigma"),
    ("intervene: a mean ablation's mean from the last reference window alone", "gpt2_numpy/interpret/ablation.py",
     'names[f"blocks.{layer}.attn.z"].mean(axis=0)', 'names[f"blocks.{layer}.attn.z"][-1]'),
    ("intervene: the recovery measured from the clean run", "gpt2_numpy/interpret/patching.py",
     "return (patched - prompts.m_corrupt) / (prompts.m_clean",
     "return (patched - prompts.m_clean) / (prompts.m_clean"),
    ("intervene: a patched head's run starts from the clean stream", "gpt2_numpy/interpret/patching.py",
     "copies(prompts.corrupt[resid_pre(layer)], len(runs)), [patch]",
     "copies(prompts.clean[resid_pre(layer)], len(runs)), [patch]"),
    ("intervene: run_with_edits checks no edit before it runs", "gpt2_numpy/interpret/edits.py",
     "    check_edits(edits, made, n_head)\n", ""),
    ("intervene: a batch's head edit takes the runs' axis for the heads'", "gpt2_numpy/interpret/edits.py",
     "array[..., head, :, :] = same_shape(function(array[..., head, :, :]), array[..., head, :, :])",
     "array[head] = same_shape(function(array[head]), array[head])"),
    ("intervene: an edited weights array does not feed z", "gpt2_numpy/interpret/tracing.py",
     'step("attn.z", weighted_sum(weights, v))',
     'step("attn.z", weighted_sum(softmax(scores + causal_mask(len(x))), v))'),
    ("intervene: a patched resid_pre one layer late", "gpt2_numpy/interpret/edits.py",
     'return "embed" if layer == 0 else f"blocks.{layer - 1}.out"', 'return f"blocks.{layer}.out"'),
    ("intervene: a run cannot start at n_layer, at ln_f", "gpt2_numpy/interpret/edits.py",
     "0 <= start_at_layer <= n_layer):", "0 <= start_at_layer < n_layer):"),
    # caught by tests/unit/test_gradients.py
    ("gradients: mid's gradient without the residual's share", "gpt2_numpy/interpret/gradients.py",
     'd_out + normed_backward(at, "ln_2", d_ln_2, steps["mid"], ln_2["g"])',
     'normed_backward(at, "ln_2", d_ln_2, steps["mid"], ln_2["g"])'),
    ("gradients: the last block's output skips ln_f's backward", "gpt2_numpy/interpret/gradients.py",
     'normed_backward(at, "ln_f", d_ln_f, arrays[f"blocks.{n_blocks - 1}.out"], params["ln_f"]["g"])', "d_ln_f"),
    ("gradients: the block's input through ln_2's gain", "gpt2_numpy/interpret/gradients.py",
     'normed_backward(at, "ln_1", d_ln_1, x, ln_1["g"])', 'normed_backward(at, "ln_1", d_ln_1, x, ln_2["g"])'),
    ("gradients: a norm's .normalized gradient without its gain", "gpt2_numpy/interpret/gradients.py",
     'd_normalized = at(f"{name}.normalized", g * d_out)', 'd_normalized = at(f"{name}.normalized", d_out)'),
    ("gradients: z's gradient reshaped, not split into heads", "gpt2_numpy/interpret/gradients.py",
     'split_heads(linear_input_backward(at("attn.out", d_mid), attn["c_proj"]["w"]), n_head)',
     'linear_input_backward(at("attn.out", d_mid), attn["c_proj"]["w"]).reshape(steps["attn.z"].shape)'),
    ("gradients: an edited array passes its gradient on", "gpt2_numpy/interpret/gradients.py",
     "        return np.zeros_like(d)\n", "        return d\n"),
    ("gradients: a head edit holds every head fixed", "gpt2_numpy/interpret/gradients.py",
     "d[..., heads, :, :] = 0", "d[...] = 0"),
    ("gradients: a metric's seed recorded but not carried back", "gpt2_numpy/interpret/gradients.py",
     "return held_fixed(d, [", "return held_fixed(d - seeds.get(name, 0), ["),
    ("gradients: the loss's targets are the inputs", "gpt2_numpy/interpret/gradients.py",
     "np.asarray(ids)[1:]", "np.asarray(ids)[:-1]"),
    ("gradients: d_k from the scores' gradient untransposed", "gpt2_numpy/backward.py",
     "d_k = np.swapaxes(d_scores, -1, -2) @ q", "d_k = d_scores @ q"),
    ("gradients: d_v from the weights untransposed", "gpt2_numpy/backward.py",
     "np.swapaxes(weights, -1, -2) @ d_out  # out = weights v", "weights @ d_out  # out = weights v"),
    # caught by tests/unit/test_attribution_patching.py
    ("attribution patching: clean minus corrupt the wrong way round", PATCHING_GRADIENTS,
     "for arrays in (clean, corrupt, grads)", "for arrays in (corrupt, clean, grads)"),
    ("attribution patching: the gradient of the clean run", PATCHING_GRADIENTS, "run = corrupt if step == 0 else",
     "run = clean if step == 0 else"),
    ("attribution patching: EAP-IG's points at k + 1 of N, not k", PATCHING_GRADIENTS, "step / ig_steps, params",
     "(step + 1) / ig_steps, params"),
    ("attribution patching: a head's edges into its own layer's q, k, v", PATCHING_GRADIENTS,
     "return np.array([[stage(writer) < stage(reader)", "return np.array([[stage(writer) <= stage(reader)"),
    ("attribution patching: q, k, v's readers back through ln_2's gain", PATCHING_GRADIENTS,
     'd_heads @ w_heads, run[resid_pre(layer)], block["ln_1"]["g"]',
     'd_heads @ w_heads, run[resid_pre(layer)], block["ln_2"]["g"]'),
    ("attribution patching: a head's write through W_O transposed", PATCHING_GRADIENTS,
     "@ w_o.reshape(n_head, -1, w_o.shape[-1])", "@ w_o.T.reshape(n_head, -1, w_o.shape[-1])"),
    ("attribution patching: the readers' q and k swapped", PATCHING_GRADIENTS,
     'attn.{kind}"] for kind in "qkv"', 'attn.{kind}"] for kind in "kqv"'),
    ("attribution patching: JSON's sum over positions is the last position", PATCHING_GRADIENTS,
     "if position is not None else row.sum()", "if position is not None else row[-1]"),
    ("attribution patching: a patched effect not less the corrupt run's metric", PATCHING_GRADIENTS,
     "effects.append(metric(patched)[0] - corrupt)", "effects.append(metric(patched)[0])"),
    ("attribution patching: faithfulness rebuilds a reader's input without the corrupt write", PATCHING_GRADIENTS,
     "swaps = np.stack(live) - corrupt_writes[:len(live)]", "swaps = np.stack(live)"),
    ("attribution patching: each head's q, k, v from one shared input", PATCHING_GRADIENTS,
     "z = split_attention(inputs[:-1].reshape(3, n_head, *x.shape)",
     "z = split_attention(np.broadcast_to(inputs[0], (3, n_head, *x.shape))"),
    ("attribution patching: the MLP reads the q input's rebuild", PATCHING_GRADIENTS,
     "excluded[:, first + n_readers - 1:first + n_readers])[0]", "excluded[:, first:first + 1])[0]"),
    ("attribution patching: the strongest edges tie in writer order", PATCHING_GRADIENTS,
     "edges = np.moveaxis(scores.edges, -1, 0).transpose(0, 2, 1)", "edges = np.moveaxis(scores.edges, -1, 0)"),
    # caught by tests/unit/test_fast_backward.py and tests/unit/test_optim.py
    ("backward: GELU's slope at x = 0 taken as 0", "gpt2_numpy/fast_backward.py", "    out.fill(0.5)\n",
     "    out.fill(0.0)\n"),
    ("backward: each piece of the loss divided by its own rows, not by all", "gpt2_numpy/fast_backward.py",
     "logits /= z * n_positions", "logits /= z * len(targets)"),
    ("backward: the softmax's backward without its row sums", "gpt2_numpy/fast_backward.py",
     "    d_out -= np.vecdot(d_out, y)[..., None]\n", ""),
    ("backward: layer norm's backward keeps the gradient's mean", "gpt2_numpy/fast_backward.py",
     "d -= d.mean(axis=-1, keepdims=True)", "d -= 0 * d.mean(axis=-1, keepdims=True)"),
    ("threads: a share of attention's heads goes on at the next row's first head", "gpt2_numpy/fast_backward.py",
     "item += stop - head", "item += n_head"),
    ("backward: the pieces of a chunked pass skip an item between them", "gpt2_numpy/fast.py",
     "slice(start, start + step)", "slice(start, start + step - 1)"),
    ("optim: weight decay on the biases and norms too", "gpt2_numpy/optim.py", "if p.ndim >= 2 else None",
     "if p.ndim >= 1 else None"),
    ("optim: past the last step the cosine climbs back", "gpt2_numpy/optim.py", "    step = min(step, total)", ""),
    ("save: config.json's layer_norm_epsilon 1e-6", "gpt2_numpy/save.py", '"layer_norm_epsilon": 1e-5,',
     '"layer_norm_epsilon": 1e-6,'),
    ("save: config.json's eos_token_id the last id, wherever <|endoftext|> is", "gpt2_numpy/save.py",
     '"eos_token_id": eot_id,', '"eos_token_id": hparams["n_vocab"] - 1,'),
    ("train: validation bits per byte count the inputs' bytes", "gpt2_numpy/training.py",
     "token_lengths[windows[:, 1:]]", "token_lengths[windows[:, :-1]]"),
    # caught by tests/unit/test_tokenizer.py, tests/unit/test_checkpoint.py and tests/unit/test_tracing.py
    ("vocabulary: an id equal to n_vocab passes the model's vocabulary check", "gpt2_numpy/tokenizer.py",
     "if token_id >= n_vocab), None)", "if token_id > n_vocab), None)"),
    ("vocabulary: a CRLF vocab.bpe keeps its carriage returns", "gpt2_numpy/formats/vocabulary.py",
     '.replace("\\r\\n", "\\n")', ""),
    ("score: <|endoftext|> in a scored text is seven ordinary tokens", "gpt2_numpy/tokenizer.py",
     'tokenizer.encode(text, allowed_special="all")', "tokenizer.encode(text)"),
    ("checkpoint: config.json's options that change the math are ignored", "gpt2_numpy/formats/checkpoint.py",
     "value = config.get(option, values[0])", "value = values[0]"),
    ("explain: trace's blocks take any n_head", "gpt2_numpy/interpret/tracing.py",
     "    check_heads(n_head, x.shape[-1])  # the error", "    pass  # the error"),
    ("explain: NaN weights on the repeated sequence alone scored as NaN", "gpt2_numpy/interpret/heads.py",
     "    check_finite(repeat)\n", ""),
    # caught by tests/unit/test_page.py (a page of 300 tokens, whose map pixels cover 2 x 2 weights)
    ("explain page: a map pixel shows the last weight it covers, not the largest", "gpt2_numpy/interpret/page.html",
     "cells[cell] = Math.max(cells[cell], values[s] / DATA.scale);", "cells[cell] = values[s] / DATA.scale;"),
]


def caught_by(copy, tests):  # -> ids of the failing tests (a fixture that fails errors its tests: caught too)
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE", *tests],
                            cwd=copy, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(copy)})
    failed = [line.split(" - ")[0].partition(" ")[2] for line in result.stdout.splitlines()
              if line.startswith(("FAILED ", "ERROR "))]  # ERROR: a test module the mutant keeps from importing too
    if result.returncode not in (0, 1) and not failed:  # pytest ran no test at all: a wrong path, no test collected
        last = (result.stdout.strip() or result.stderr.strip() or "no output").splitlines()[-1]
        sys.exit(f"error: pytest ran none of {' '.join(tests)} (status {result.returncode}: {last})")
    return failed


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("tests", nargs="*", metavar="TEST_FILE",
                        default=["tests/unit/test_model.py", "tests/unit/test_fast.py", "tests/unit/test_cores.py"])
    parser.add_argument("--only", metavar="PARTS", help="only the mutants of these parts, e.g. model,fast (the word "
                        "before each mutant's colon)")
    args = parser.parse_args(argv)
    parts = sorted({what.partition(":")[0] for what, *_ in MUTANTS})
    unknown = [part for part in (args.only or "").split(",") if args.only and part not in parts]
    if unknown:
        sys.exit(f"error: --only {unknown[0]!r} names no part: choose among {', '.join(parts)}")
    with tempfile.TemporaryDirectory() as scratch:
        for what, path, text, replacement in MUTANTS:
            if args.only and what.partition(":")[0] not in args.only.split(","):
                continue
            copy = Path(scratch) / "repo"
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(REPO, copy, ignore=shutil.ignore_patterns(".git", "__pycache__", "weights"))
            source = (copy / path).read_text()
            if text not in source:  # the code moved on: the mutant needs updating, not a traceback
                sys.exit(f"error: mutant {what!r}: {text!r} is no longer in {path}; update MUTANTS in {__file__}")
            (copy / path).write_text(source.replace(text, replacement, 1))
            failed = caught_by(copy, args.tests)
            print(f"{what}: " + (f"caught by {len(failed)}: " + ", ".join(failed) if failed else "NOT CAUGHT"),
                  flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
