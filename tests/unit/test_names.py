"""The activations' names (gpt2_numpy/interpret/names.py): TransformerLens's hooks map to trace's names."""
import pytest

from gpt2_numpy.interpret.names import our_hook


@pytest.mark.parametrize("theirs, ours", [
    ("blocks.0.hook_resid_pre", "embed"), ("blocks.3.hook_resid_pre", "blocks.2.out"),
    ("blocks.3.hook_resid_mid", "blocks.3.mid"), ("blocks.3.hook_resid_post", "blocks.3.out"),
    ("blocks.1.attn.hook_z", "blocks.1.attn.z"), ("blocks.2.hook_mlp_out", "blocks.2.mlp.out"),
    ("blocks.2.mlp.out", "blocks.2.mlp.out"), ("blocks.2.hook_nonsense", None)])
def test_transformer_lens_hook_names_map_to_trace_names(theirs, ours):
    assert our_hook(theirs) == ours
