"""`sae features --html`: one offline page of an SAE's latents on a text: features.html, its data inline as JSON.

Per latent: its strongest contexts (features.scan) with each token shaded by the latent's activation there, a
histogram of its activations above 0, and the tokens its decoder row promotes and suppresses most
(features.logit_effects). The text is the user's, so the page treats it as data: the JSON escapes "<" (a token
"</script>" cannot end the script that holds it), and the script sets every text with textContent, never as HTML.
"""
import json
from importlib import resources

from gpt2_numpy.sae.features import context_span, logit_effects, no_direct_effect, scan
from gpt2_numpy.sae.releases import neuronpedia_url

DATA_SLOT = "/*DATA*/null"  # the template's placeholder for the JSON data: valid JavaScript before it is filled
TOP_TOKENS = 10  # promoted and suppressed tokens shown per latent


def features_html(data):  # -> the page's text: features.html with data (features_data's) inline
    template = resources.files("gpt2_numpy.sae").joinpath("features.html").read_text(encoding="utf-8")
    # "<" as \u003c: a context's "</script>" must not end the script that holds the data
    return template.replace(DATA_SLOT, json.dumps(data, ensure_ascii=False).replace("<", "\\u003c"), 1)


def features_data(windows, params, n_head, sae, latents, text, title, n_contexts=10, progress=None):
    """The page's data for `latents` of `sae` over token ids [n_windows, n_seq]; text(token_id) -> a token's text.
    An SAE whose hook the logits do not read directly (q, k, v, a layer norm's output, ...) gets no logit table: its
    latents' "promoted" and "suppressed" are None, and "no_logits" says why (None otherwise)."""
    found = scan(windows, params, n_head, sae, latents, n_contexts, progress=progress)
    no_logits = no_direct_effect(sae.hook)
    blank = [None] * len(latents)
    promoted, suppressed = (blank, blank) if no_logits else logit_effects(sae, params, latents, TOP_TOKENS)
    column = {latent: i for i, latent in enumerate(latents)}
    shown = []
    for latent, up, down in zip(latents, promoted, suppressed):
        seen = found["latents"][latent]
        counts, edges = seen["histogram"]
        contexts = context_rows(found, windows, latent, column[latent], text)
        shown.append({"id": int(latent), "neuronpedia": neuronpedia_url(sae, int(latent)), "fired": seen["fired"],
                      "max": contexts[0]["value"] if contexts else 0.0,
                      "contexts": contexts, "histogram": {"counts": counts.tolist(), "edges": edges.tolist()},
                      "promoted": None if up is None else [[text(t), effect] for t, effect in up],
                      "suppressed": None if down is None else [[text(t), effect] for t, effect in down]})
    effect = (f"No logit table: {no_logits}." if no_logits else
              "Direct effect: W_dec[f], centred and scaled by ln_f's gain, @ wte.T.")
    summary = (f"{len(latents)} latents of an SAE at {sae.hook} ({sae.d_in} -> {sae.d_sae}), over {found['positions']} "
               f"positions ({len(windows)} windows of {windows.shape[1]} tokens). {effect}")
    return {"title": title, "summary": summary, "positions": found["positions"], "no_logits": no_logits,
            "latents": shown}


def context_rows(found, windows, latent, column, text):  # -> [{value, peak, tokens, acts}]: a latent's contexts
    """The strongest contexts of `latent` in scan's result `found` over windows [n_windows, n_seq], its activations in
    found's column `column`: each context's tokens (text(token_id)), their activations, and where the peak is."""
    contexts = []
    for value, window, position in found["latents"][latent]["contexts"]:
        start, stop = context_span(position, windows.shape[1])
        contexts.append({"value": value, "peak": position - start,
                         "tokens": [text(int(t)) for t in windows[window, start:stop]],
                         "acts": found["activations"][window, start:stop, column].tolist()})
    return contexts
