"""The activation an SAE was trained on, exactly: what TransformerLens's processed model hooks and SAELens's SAE does to
it, computed from our model's own activations (interpret/tracing.py's names), which are the textbook model's.

TransformerLens's HookedTransformer.from_pretrained rewrites GPT-2's weights by default (its processing flags, the
"model_from_pretrained_kwargs" an SAE's cfg records), and an SAE trained through it read the rewritten model's hooks:

    center_writing_weights   every weight that writes to the residual stream has its mean over d_model removed, so the
                             stream and what writes to it (resid pre, mid and post, attention and MLP outputs) hold
                             our vector minus its mean over d_model. The layer norms remove that mean anyway: the
                             model's output is unchanged.
    fold_value_biases        the value bias moves into the attention output's bias: hook_v and hook_z hold ours minus
                             it (each row of attention weights sums to 1, so z carries exactly the bias). With fold_ln
                             (folded first) the bias is b_V plus ln_1's bias times W_V: v of a zero normalised input.
    fold_ln                  changes no other activation: ln*.hook_normalized is the norm's output before its gain
                             either way (interpret/names.py's names).

SAE.from_pretrained loads a release with TransformerLens's defaults (all of the above) unless its entry in SAELens's
list says otherwise; a folder trained by SAELens was trained with from_pretrained_no_processing plus its cfg's
model_from_pretrained_kwargs (SAELens's load_model), and one saved here asks for none. Then the SAE itself:

    normalize_activations "layer_norm"                (OpenAI's v5 SAEs) x -> (x - μ) / (σ + ε) before encoding, the
                             reconstruction times σ plus μ after decoding; σ is torch's unbiased std, ε = 1e-5 is added
                             to σ, not to the variance (SAELens's run_time_activation_ln_in), unlike model.layer_norm
    normalize_activations "expected_average_only_in"  the release's norm_scaling_factor s folded into the weights as
                             SAELens folds it: W_enc·s, W_dec/s, b_dec/s; with no factor known it is refused

ProcessedSAE below reads our rows, makes them the activation the SAE knows (model_activation), and puts back what it
took out (the mean, b_V) around its reconstruction, so that the model is unchanged where the SAE reconstructs exactly.
"""
import numpy as np

from gpt2_numpy.errors import UsageError
from gpt2_numpy.formats import shown
from gpt2_numpy.interpret.names import RESIDUAL_STEPS, VALUE_STEPS, layer_of, step_of
from gpt2_numpy.sae.model import SAE

FROM_PRETRAINED = {"fold_ln": True, "center_writing_weights": True, "center_unembed": True, "fold_value_biases": True,
                   "refactor_factored_attn_matrices": False}  # HookedTransformer.from_pretrained's defaults
NO_PROCESSING = {**{name: False for name in FROM_PRETRAINED}}  # from_pretrained_no_processing's
LN_EPS = 1e-5  # SAELens's run_time_activation_ln_in


def upgraded(cfg):  # -> cfg of SAELens before 6.0 in 6.x's keys (its handle_pre_6_0_config, what changes the math)
    version = cfg.get("sae_lens_version") or (cfg.get("metadata") or {}).get("sae_lens_version")
    if version and str(version).split(".")[0].isdigit() and int(str(version).split(".")[0]) >= 6:
        return cfg
    renames = {"hook_point": "hook_name", "hook_point_head_index": "hook_head_index",
               "activation_fn_str": "activation_fn"}
    cfg = {renames.get(name, name): value for name, value in cfg.items()}
    kwargs = cfg.get("activation_fn_kwargs") if isinstance(cfg.get("activation_fn_kwargs"), dict) else {}
    if cfg.get("activation_fn") == "topk" and kwargs.get("k") is not None:
        cfg.update(architecture="topk", k=kwargs["k"])
    if isinstance(cfg.get("normalize_activations"), bool):
        cfg["normalize_activations"] = "expected_average_only_in" if cfg["normalize_activations"] else "none"
    return {**cfg, "normalize_activations": cfg.get("normalize_activations") or "none"}


def from_pretrained_kwargs(cfg):  # -> the TransformerLens flags cfg records (top level or metadata), {} if none
    metadata = cfg.get("metadata") if isinstance(cfg.get("metadata"), dict) else {}
    kwargs = cfg.get("model_from_pretrained_kwargs", metadata.get("model_from_pretrained_kwargs")) or {}
    if not isinstance(kwargs, dict):
        raise UsageError(f"model_from_pretrained_kwargs {shown(repr(kwargs)[:60])} is not a JSON object of "
                         "TransformerLens's flags")
    return kwargs


def processing(cfg, base, where):  # -> {flag: bool}: base (FROM_PRETRAINED or NO_PROCESSING) with cfg's flags over it
    flags = {**base, **from_pretrained_kwargs(cfg)}
    for name, value in flags.items():
        if name not in FROM_PRETRAINED or value not in (True, False) or (
                name == "refactor_factored_attn_matrices" and value):
            raise UsageError(f"{where}: model_from_pretrained_kwargs {name}={shown(repr(value))} is not supported "
                             "(the activation it makes is not computed here): only fold_ln, center_writing_weights, "
                             "center_unembed and fold_value_biases load")
    return flags


def fold_norm_scaling(params, factor):  # -> params with SAELens's fold_activation_norm_scaling_factor applied
    return {**params, "W_enc": params["W_enc"] * np.float32(factor), "W_dec": params["W_dec"] / np.float32(factor),
            "b_dec": params["b_dec"] / np.float32(factor)}


def processed(cfg, params, hook, base, where, norm_scaling_factor=None):  # -> SAE reading what it was trained on
    # cfg, params: as read and checked (sae/files.py); hook: the trace name; base: the model's processing before cfg's
    # flags; where: what errors call the SAE
    flags = processing(cfg, base, where)
    if cfg.get("normalize_activations") == "expected_average_only_in":
        if norm_scaling_factor is None:
            raise UsageError(f"{where}: normalize_activations expected_average_only_in needs the release's "
                             "norm_scaling_factor, which a folder does not carry: load it by its release name")
        params = fold_norm_scaling(params, norm_scaling_factor)
        cfg = {**cfg, "normalize_activations": "none"}
    step = step_of(hook) if hook else hook
    center = flags["center_writing_weights"] and (hook == "embed" or step in RESIDUAL_STEPS)
    value_bias = flags["fold_value_biases"] and step in VALUE_STEPS
    metadata = cfg.get("metadata") if isinstance(cfg.get("metadata"), dict) else {}
    cfg = {name: value for name, value in cfg.items() if name != "model_from_pretrained_kwargs"}  # a pre-6.0 place
    cfg["metadata"] = {**metadata, "model_from_pretrained_kwargs": flags}  # what it reads, in SAELens's words
    if not (center or value_bias or cfg.get("normalize_activations") == "layer_norm"):
        return SAE(cfg, params, hook)
    return ProcessedSAE(cfg, params, hook, center, value_bias, flags["fold_ln"])


def layer_norm(x):  # [..., d] -> ([..., d], μ [..., 1], σ [..., 1]): SAELens's layer_norm, ε added to the unbiased σ
    mu = x.mean(axis=-1, keepdims=True)
    centred = x - mu
    sigma = centred.std(axis=-1, ddof=1, keepdims=True)
    return centred / (sigma + LN_EPS), mu, sigma


def value_bias(params, hook, fold_ln):  # -> float32 [n_head * d_head]: the value bias TransformerLens folds out of
    # block L's v and z, heads side by side as hook_z's rows are: b_V, plus ln_1's bias times W_V when fold_ln put it
    # there
    block = params["blocks"][layer_of(hook)]
    c_attn, n_embd = block["attn"]["c_attn"], block["ln_1"]["b"].shape[-1]
    bias = block["ln_1"]["b"] @ c_attn["w"][:, 2 * n_embd:] if fold_ln else 0  # [n_embd] @ [n_embd, n_embd]
    return np.asarray(c_attn["b"][2 * n_embd:] + bias, dtype=np.float32)


class ProcessedSAE(SAE):
    """An SAE whose input is TransformerLens's processed activation: our rows less their mean over d_model (center),
    less the value bias (value_bias: attach(params) gives it the model's), and layer-normalised in (cfg's
    normalize_activations).
    encode takes our rows; reconstruct gives our rows back, with what model_activation removed put back."""

    def __init__(self, cfg, params, hook, center, value_bias, fold_ln):
        super().__init__(cfg, params, hook)
        self.center, self.needs_value_bias, self.fold_ln, self.b_V = center, value_bias, fold_ln, None
        self.layer_norm = cfg.get("normalize_activations") == "layer_norm"

    def attach(self, params):  # -> self, reading the model of params (its b_V, for hook_z and hook_v)
        if self.needs_value_bias:
            self.b_V = value_bias(params, self.hook, self.fold_ln)
        return self

    def model_activation(self, x):  # [..., d_in] our rows -> [..., d_in] TransformerLens's processed model's
        if self.needs_value_bias:
            if self.b_V is None:
                raise UsageError(f"this SAE reads {self.hook} without the value bias b_V (TransformerLens's "
                                 "fold_value_biases): call sae.attach(model.params) before using it")
            x = x - self.b_V
        return x - x.mean(axis=-1, keepdims=True) if self.center else x

    def encode(self, x):  # [..., d_in] our rows -> [..., d_sae]
        x = self.model_activation(np.asarray(x, dtype=np.float32))
        return super().encode(layer_norm(x)[0] if self.layer_norm else x)

    def forward(self, a):  # [..., d_in] TransformerLens's activation -> [..., d_in]: SAELens's SAE.forward of it
        if not self.layer_norm:
            return self.decode(super().encode(a))
        normed, mu, sigma = layer_norm(a)
        return self.decode(super().encode(normed)) * sigma + mu

    def reconstruct(self, x):  # [..., d_in] our rows -> [..., d_in] our rows: the SAE's output in the activation's
        # place
        x = np.asarray(x, dtype=np.float32)
        a = self.model_activation(x)
        return self.forward(a) + (x - a)


def output_scale(sae, x):  # [..., d_in] our rows -> [..., 1] or 1: what the SAE's decoder rows are scaled by in x's
    # space (σ of SAELens's layer_norm, which decoding undoes), so that a latent's share of x is f W_dec[j] times it
    if isinstance(sae, ProcessedSAE) and sae.layer_norm:
        return layer_norm(sae.model_activation(np.asarray(x, dtype=np.float32)))[2]
    return 1


def attach(sae, params):  # -> sae, fit to read the model of params (a plain SAE needs nothing of it)
    return sae.attach(params) if isinstance(sae, ProcessedSAE) else sae


def model_activation(sae, x):  # [..., d_in] our rows -> the activation the SAE knows (SAELens's input)
    return sae.model_activation(x) if isinstance(sae, ProcessedSAE) else x


def forward(sae, a):  # [..., d_in] the activation the SAE knows -> SAELens's SAE.forward of it
    return sae.forward(a) if isinstance(sae, ProcessedSAE) else sae.reconstruct(a)
