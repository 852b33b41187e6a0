"""The activations' names (gpt2_numpy/interpret/names.py): TransformerLens's hooks map to trace's names."""
import pytest

from gpt2_numpy.interpret.names import our_hook, tl_hook
from tests.sae_helpers import exact_sae


@pytest.mark.parametrize("theirs, ours", [
    ("blocks.0.hook_resid_pre", "embed"), ("blocks.3.hook_resid_pre", "blocks.2.out"),
    ("blocks.3.hook_resid_mid", "blocks.3.mid"), ("blocks.3.hook_resid_post", "blocks.3.out"),
    ("blocks.1.attn.hook_z", "blocks.1.attn.z"), ("blocks.2.hook_mlp_out", "blocks.2.mlp.out"),
    ("blocks.2.mlp.out", "blocks.2.mlp.out"), ("blocks.2.hook_nonsense", None)])
def test_transformer_lens_hook_names_map_to_trace_names(theirs, ours):
    assert our_hook(theirs) == ours


# TransformerLens's hook names in a block (its HookedTransformer's hook_dict), and the trace names of the same arrays
TL_NAMES = {"hook_resid_mid": "mid", "hook_resid_post": "out", "attn.hook_z": "attn.z", "hook_mlp_out": "mlp.out",
            "hook_attn_out": "attn.out", "attn.hook_q": "attn.q", "attn.hook_k": "attn.k", "attn.hook_v": "attn.v",
            "mlp.hook_pre": "mlp.pre", "mlp.hook_post": "mlp.hidden",
            "ln1.hook_normalized": "ln_1.normalized", "ln2.hook_normalized": "ln_2.normalized"}  # before the gain


@pytest.mark.parametrize("theirs", TL_NAMES)
def test_every_transformer_lens_name_in_a_block_round_trips(theirs):
    ours = f"blocks.2.{TL_NAMES[theirs]}"
    assert our_hook(f"blocks.2.{theirs}") == ours
    assert tl_hook(ours) == f"blocks.2.{theirs}"
    assert exact_sae(4, ours).cfg["metadata"]["hook_name"] == f"blocks.2.{theirs}"


def test_the_names_outside_the_blocks_round_trip():
    assert (our_hook("blocks.0.hook_resid_pre"), tl_hook("embed")) == ("embed", "blocks.0.hook_resid_pre")
    assert (our_hook("ln_final.hook_normalized"), tl_hook("ln_f.normalized")) == ("ln_f.normalized",
                                                                                   "ln_final.hook_normalized")
